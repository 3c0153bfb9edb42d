"""Graceful shutdown of the data plane: readiness false first, a bounded drain, a clean end.

:class:`Drain` is the app's shutdown state (``app.state.drain``). The server
(:mod:`gateway.graceful`) calls :meth:`Drain.begin` on SIGTERM — from then on
``/health/readiness`` answers 503 ``draining`` — then stops accepting connections and lets the
requests in flight finish. Whatever is still running at the drain deadline is ended by
:meth:`Drain.abort_all`, in the gateway's dialect rather than with a cut connection: a stream
gets an SSE error event and its end, a request not yet answered a 503 ``shutting_down`` with
``retry-after``.

:class:`DrainMiddleware` keeps the set of requests in flight that this needs. It answers for
the app underneath without cancelling it: once the answer is complete the server reports the
client gone, so the request path does what it does for any client that leaves — closes the
upstream request (the engine aborts it), releases its slot and limits, and records its usage
as ``cancelled`` with the tokens it consumed. The usage writer is flushed afterwards, by the
app's lifespan shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ApiError

log = logging.getLogger(__name__)

SHUTTING_DOWN = "shutting_down"
"""``code`` of the error a request still in flight at the drain deadline is answered with."""
RETRY_AFTER_S = 1
"""Another gateway process or replica can serve the retry at once."""


def shutdown_error() -> ApiError:
    return ApiError(
        503,
        "The gateway is shutting down and could not finish this request in time; retry it.",
        code=SHUTTING_DOWN,
        headers={"retry-after": str(RETRY_AFTER_S)},
    )


class InFlight:
    """One HTTP request in flight: what it has sent, so that it can be ended cleanly."""

    __slots__ = ("_send", "aborted", "complete", "started", "streaming")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.streaming = False
        self.complete = False
        self.aborted = False

    async def send(self, message: Message) -> None:
        if self.aborted:  # ended by the drain: the app's late messages go nowhere
            return
        kind = message["type"]
        if kind == "http.response.start":
            self.started = True
            self.streaming = _is_event_stream(message.get("headers", ()))
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self._send(message)

    async def abort(self, error: ApiError) -> bool:
        """End the request with ``error``; False if it was already answered whole."""
        if self.complete or self.aborted:
            return False
        self.aborted = True
        if not self.started:
            response = error.response()
            await self._send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": response.raw_headers,
                }
            )
            await self._send({"type": "http.response.body", "body": response.body})
            return True
        if self.streaming:
            await self._send(
                {"type": "http.response.body", "body": error.sse_event(), "more_body": True}
            )
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        return True


def _is_event_stream(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"content-type" and b"text/event-stream" in v for k, v in headers)


class Drain:
    """Whether the app is shutting down, and the requests it still has in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.requests: set[InFlight] = set()
        self.taken = 0
        """HTTP requests this process has taken (``tiergate_worker_requests``)."""

    def begin(self) -> None:
        """Readiness goes false; nothing else changes until the server stops accepting."""
        if not self.draining:
            log.info("draining: readiness is now false")
        self.draining = True

    @property
    def in_flight(self) -> int:
        return sum(not r.complete for r in self.requests)

    async def abort_all(self) -> int:
        """End every request still in flight with :func:`shutdown_error`; returns how many."""
        error, ended = shutdown_error(), 0
        for request in list(self.requests):
            try:
                ended += await request.abort(error)
            except OSError:  # the client is gone already: nothing to tell it
                continue
        if ended:
            log.warning("drain deadline: ended %d request(s) still in flight", ended)
        return ended


class DrainMiddleware:
    """Track HTTP requests in flight for :meth:`Drain.abort_all` (one set add and discard and
    one extra call per message sent)."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = InFlight(send)
        self.drain.taken += 1
        requests = self.drain.requests
        requests.add(request)
        try:
            await self.app(scope, receive, request.send)
        finally:
            requests.discard(request)
