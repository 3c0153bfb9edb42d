"""The data plane: one :class:`Job` per request — its state, the relay, and the entry.

Admission: authenticate (401), then admission's ordered stages — body, SLO, kind, conversation
stage, model (404), context length (400), length prediction, core request, budgets, rate limits
(429), route and shed (503), the admission queue, the engines' admission planners — in
:mod:`gateway.dataplane.admission`, one module per stage in :mod:`gateway.dataplane.stages`.

Routing and dispatch: the router's pick, leaving out backends that failed the request
(:mod:`gateway.dataplane.routing`); the payload, the attempts with failover before the first
token and the first-token deadline (:mod:`gateway.dataplane.dispatch`); an engine's answers
read by :mod:`gateway.dataplane.answers`. A streaming response is only started once the first
token is in hand, so the client never sees a failed attempt. After the first token, an upstream
failure — a break, garbage, or no event for the stall timeout (:mod:`gateway.app.watchdog`) —
ends the stream with an OpenAI-style error event. A client that disconnects — streaming or not
— closes the upstream request, which makes the engine abort it.
``docs/operations/engine-faults.md`` has the whole story.

An engine's refusal (a 4xx, or a stream whose first event is a 4xx error) is the client's
answer, not a failed attempt, and an error event mid-stream is relayed; both in the gateway's
dialect (:func:`engine_error`): vLLM words its errors ``{"type": "BadRequestError", "code":
400}``, which OpenAI's clients and the documented :class:`~gateway.errors.ErrorOut` do not.

Accounting happens once, when the job ends (:mod:`gateway.dataplane.accounting`), off the
per-token path: each streamed chunk only appends its egress time to the job's list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, NamedTuple

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from gateway.app.accounting import Outcome
from gateway.app.auth import authenticate_request
from gateway.app.backends import Backend, ModelGroup
from gateway.app.deadlines import stall_timeout
from gateway.app.kinds import LengthPrediction
from gateway.app.schemas import ChatBody, CompletionBody
from gateway.app.shedding import Verdict
from gateway.app.state import GatewayState
from gateway.app.upstream import UpstreamError, UpstreamResponse
from gateway.app.watchdog import StreamWatch
from gateway.dataplane import routing
from gateway.dataplane.accounting import finish as run_finish
from gateway.dataplane.accounting import release_engine
from gateway.dataplane.admission import admit as run_admission
from gateway.dataplane.answers import (
    MALFORMED,
    UpstreamFailed,
    engine_error,
    read_usage,
    well_formed,
)
from gateway.dataplane.dispatch import dispatch as run_dispatch
from gateway.db.identity import KeyIdentity
from gateway.errors import ApiError
from gateway.limits import AdmissionRejected, Reservation
from gateway.limits.budget import BudgetHold
from priority.lengths.features import RequestFeatures
from priority.request import Request as CoreRequest
from priority.request import RequestMeta
from priority.routing import RouteDecision

log = logging.getLogger(__name__)

Kind = Literal["chat", "completions"]
_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class End(NamedTuple):
    """How a request ended, as :meth:`Job.finish` records it."""

    outcome: Outcome
    http_status: int
    reason: str | None = None
    """The usage record's ``reject_reason`` and the rejections metric's label."""


CLIENT_GONE = End(Outcome.CANCELLED, 499)
"""The client left (or its task was cancelled) before its answer was complete."""

UPSTREAM_REJECTED = "upstream_rejected"
"""``reason`` of a request an engine refused (a 4xx answer)."""


class ClientStalled(Exception):
    """The client took none of its stream for ``client_write_timeout_s``: the stream ends (its
    engine request aborted) as if the client had left — the client's doing, not the engine's."""


class Job:
    """One request from arrival to its usage record."""

    def __init__(
        self, state: GatewayState, identity: KeyIdentity, kind: Kind, arrival: float
    ) -> None:
        self.state = state
        self.identity = identity
        self.kind = kind
        self.arrival = arrival
        self.arrival_unix = time.time()
        self.request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.tier = identity.tier_name
        self.body: dict[str, Any] = {}
        self.model: str | None = None
        self.stream = False
        self.include_usage = False
        self.meta: RequestMeta | None = None
        """What the engine is told about the request (published by admission's stages)."""
        self.core: CoreRequest | None = None
        self.prompt_tokens = 0
        self.prompt_lengths: list[int] = []
        """Each sequence's prompt tokens (the body stage's one count; a batch has several)."""
        self.expected_output = 0
        self.reservation: Reservation | None = None
        self.budget_hold: BudgetHold | None = None
        self.slot = False
        self.group: ModelGroup | None = None
        self.backend: Backend | None = None
        self.decision: RouteDecision | None = None
        self.first_token = False
        self.chunk_times: list[float] = []
        self.completion_tokens: int | None = None
        self.upstream_prompt_tokens: int | None = None
        self.dispatched_at = 0.0
        self.granted_at = 0.0
        self.overhead_s = 0.0
        self.finished = False
        self.engine_released = False
        """The router's count, the dispatch slot and the SLO planner's entry given back
        (:func:`~gateway.dataplane.accounting.release_engine`): never twice."""
        self.attempts = 0
        self.verdict: Verdict | None = None
        """Admission's, kept for the request log."""
        self.parsed: ChatBody | CompletionBody | None = None
        """The validated body (admission's ``body`` stage), for the stages after it."""
        self.draft: RequestMeta | None = None
        """The metadata while admission's stages build it; ``meta`` once whole."""
        self.fits = True
        """False when only the gateway's estimate says the request exceeds the context."""
        self.priority = 0.0
        """The request's place in the admission queue (gain density; negative when demoted)."""
        self.length: LengthPrediction | None = None
        self.length_features: RequestFeatures | None = None
        """Kept for the request's length sample (``TIERGATE_LENGTHS_LEARN``), else None."""

    # ---- admission ----------------------------------------------------------------------

    admit = run_admission
    """Run admission's stages (:mod:`gateway.dataplane.admission`) on this job: the function
    itself as the method, so a request pays no wrapper's coroutine for it."""

    def deadline_s(self) -> float | None:
        """The request's end-to-end deadline from its arrival (a workflow call's: its
        workflow's), or None."""
        assert self.meta is not None
        return self.meta.end_to_end_slo.deadline_s

    # ---- routing and dispatch -----------------------------------------------------------

    route = routing.route
    """Ask the group's router, leaving out the backends that failed this request
    (:func:`gateway.dataplane.routing.route`; admission's ``shed`` stage calls it too)."""

    dispatch = run_dispatch
    """Send to a backend, failing over before the first token
    (:func:`gateway.dataplane.dispatch.dispatch`): the function itself as the method."""

    # ---- relay --------------------------------------------------------------------------

    async def relay(self, write: Callable[[bytes], Awaitable[None]]) -> bytes:
        """Write the client's SSE stream: held events, then the rest as they arrive — what one
        upstream read brought in one write — or one by one, paced, if smoothing is on.

        Returns what is left to write with the end of the response: the last events (usually
        ``[DONE]``) when the engine's response had ended by the time they came, so that they
        and the response's end go out in one write, not two.

        A plain loop calling ``write`` rather than a generator chain: every relayed chunk
        passes here, and each generator layer costs a resumption per chunk."""
        settings = self.state.settings
        pace = settings.smoothing
        margin = settings.smoothing_margin_ms / 1e3
        pending, self.pending = self.pending, []
        first = self.first_output
        batches, response, tail = self.batches, self.response, b""
        if pace:
            held = self._held(pending[:first])
            if held:
                await write(held)
            await self._relay_batch(pending[first:], write, pace=pace, margin=margin)
        else:  # what came until the first token goes out in one write
            try:
                opening = self._held(pending[:first]) + self._unpaced(
                    pending[first:], time.monotonic()
                )
            except UpstreamFailed:
                if self.partial:
                    await write(self.partial)
                raise
            if self.done and response.at_end:
                tail = opening
            elif opening:
                await write(opening)
        backend, pool = self.backend, self.state.pool
        assert backend is not None and self.meta is not None
        # the watchdog (gateway.app.watchdog) expires the deadline if the engine goes quiet
        watch = StreamWatch(
            backend, stall_timeout(settings, self.meta), settings.client_write_timeout_s
        )
        if pace:
            write = _watched(write, watch)
        try:
            async with asyncio.timeout(None) as watch.deadline:
                pool.streams.add(watch)
                while True:
                    watch.read_since = time.monotonic()
                    try:
                        batch = await anext(batches)
                    except StopAsyncIteration:
                        break
                    watch.read_since = 0.0  # writing to the client is not waiting on the engine
                    backend.last_event = now = time.monotonic()
                    if pace:
                        await self._relay_batch(batch, write, pace=pace, margin=margin)
                        continue
                    try:
                        data = self._unpaced(batch, now)
                    except UpstreamFailed:  # garbage: what came before it reaches the client
                        if self.partial:
                            await write(self.partial)
                        raise
                    if self.done:  # [DONE] goes out last, once the engine's stream has ended:
                        tail = data  # a client that leaves on reading it finds nothing pending
                        continue  # (not a break: an abandoned generator costs a task)
                    if data:
                        watch.write_since = now  # the client's time, watched on its own
                        await write(data)
                        watch.write_since = 0.0
        except TimeoutError:
            if watch.client_stalled:
                raise ClientStalled(f"the client took nothing for {watch.write_s:g} s") from None
            if not watch.stalled:
                raise
            if self.done:  # the whole answer came; the engine only kept the connection open
                return tail
            pool.record_timeout(backend, "stall")
            raise UpstreamFailed(f"no event for {watch.stall_s:.3g} s", recorded=True) from None
        finally:
            pool.streams.discard(watch)
        if not self.done:
            raise UpstreamFailed("the upstream stream ended early")
        if not self.upstream_error:  # a whole stream: only that proves the engine works
            pool.record_success(backend)
        return tail

    def _held(self, events: list[bytes]) -> bytes:
        """The events held before the first token's, filtered (they carry no output: no egress
        time is recorded for them)."""
        kept = (self._passed(event) for event in events)
        return b"".join(event for event in kept if event is not None)

    def _passed(self, event: bytes) -> bytes | None:
        """``[DONE]`` (noting the stream's end), else what :meth:`_filter` keeps of it."""
        if event.startswith(b"data: [DONE]"):
            self.done = True
            return event
        return self._filter(event)

    async def _relay_batch(
        self,
        batch: list[bytes],
        write: Callable[[bytes], Awaitable[None]],
        *,
        pace: bool,
        margin: float,
    ) -> None:
        """Filter one batch of events, record egress times of the ones with output, write."""
        times = self.chunk_times
        out: list[bytes] = []
        for event in batch:
            if event.startswith(b"data: [DONE]"):
                self.done = True
                out.append(event)
                continue
            try:
                kept = self._filter(event)
            except UpstreamFailed:  # garbage: what came before it still reaches the client
                if out:
                    await write(b"".join(out))
                raise
            if kept is None:
                continue
            if pace:
                if out:
                    await write(b"".join(out))
                    out = []
                await self._pace(len(times), margin)
            times.append(time.monotonic())
            out.append(kept)
        if out:
            await write(out[0] if len(out) == 1 else b"".join(out))

    def _unpaced(self, batch: list[bytes], now: float) -> bytes:
        """:meth:`_relay_batch` without smoothing, as one synchronous call (this runs for every
        upstream read; a coroutine per read costs more): the bytes to write, with ``now`` as
        the egress time of each event with output. Garbage raises :class:`UpstreamFailed`,
        what came before it left in ``partial``."""
        if len(batch) == 1:  # the usual case: one token's event per read
            event = batch[0]
            if event.startswith(b"data: [DONE]"):
                self.done = True
                return event
            kept = self._filter(event)
            if kept is None:
                return b""
            self.chunk_times.append(now)
            return kept
        times = self.chunk_times
        out: list[bytes] = []
        for event in batch:
            if event.startswith(b"data: [DONE]"):
                self.done = True
                out.append(event)
                continue
            try:
                kept = self._filter(event)
            except UpstreamFailed:
                self.partial = b"".join(out)
                raise
            if kept is not None:
                times.append(now)
                out.append(kept)
        return b"".join(out)

    def _filter(self, event: bytes) -> bytes | None:
        """Drop the usage chunk the client did not ask for (after reading it); reword an
        engine's error event in the gateway's dialect; pass the rest, if well formed (raises
        :class:`UpstreamFailed` for garbage; drops SSE comments)."""
        if not well_formed(event):
            if event.startswith(b":"):
                return None
            raise UpstreamFailed(MALFORMED)
        if b'"usage"' in event and b'"choices":[]' in event.replace(b" ", b""):
            read_usage(self, event[event.find(b"{") :])
            return event if self.include_usage else None
        if b'"error"' in event and event.startswith(b'data: {"error"'):
            self.upstream_error = True
            return engine_error(None, event[6:]).sse_event()
        return event

    async def _pace(self, sent: int, margin: float) -> None:
        """PROSERVE's smoothing: hold a chunk until shortly before its token's due time."""
        assert self.core is not None
        due = self.arrival + self.core.slo.token_due_s(sent + 1) - margin
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    # ---- the end ------------------------------------------------------------------------

    finish = run_finish
    """Release what the job holds and account for it, once
    (:func:`gateway.dataplane.accounting.finish`): the function itself as the method."""

    decision_live: RouteDecision
    response: UpstreamResponse
    batches: AsyncIterator[list[bytes]]
    pending: list[bytes]
    first_output: int = 0
    partial: bytes = b""
    """What an unpaced batch had kept before the garbage that failed it."""
    done: bool = False
    accepted: bool = False
    """An engine answered 200 on the attempt serving this request: only then is it accounted."""
    upstream_error: bool = False
    demoted: str | None = None
    """Why the request was demoted to best effort (overload shedding), or None."""


def _watched(
    write: Callable[[bytes], Awaitable[None]], watch: StreamWatch
) -> Callable[[bytes], Awaitable[None]]:
    """``write``, with each call's start in ``watch.write_since`` (the paced relay writes from
    :meth:`Job._relay_batch`, between pacing sleeps that are not the client's time)."""

    async def write_watched(data: bytes) -> None:
        watch.write_since = time.monotonic()
        try:
            await write(data)
        finally:
            watch.write_since = 0.0

    return write_watched


class RelayStream(Response):
    """The client's SSE response: relays the job's stream, ends it with an error event if the
    upstream breaks after the first token, and closes the upstream as soon as the client
    disconnects (listening for it even while no token flows)."""

    media_type = "text/event-stream"

    def __init__(self, job: Job, upstream: UpstreamResponse) -> None:
        # no super().__init__(): it would declare a Content-Length for an empty body
        self.status_code = 200
        self.background = None
        self.init_headers(_SSE_HEADERS)
        self.job = job
        self.upstream = upstream
        self.upstream_open = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = CLIENT_GONE
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
            if not pump.done() and self.job.done:  # it left having been sent [DONE]: served
                outcome = _relayed(self.job)
            elif pump.done() and not pump.cancelled():
                error = pump.exception()
                if error is None:
                    outcome = pump.result()
                elif not isinstance(error, OSError):  # OSError: the client left mid-send
                    log.error("relay of %s failed", self.job.request_id, exc_info=error)
        finally:
            for task in (pump, gone):
                task.cancel()
            for task in (pump, gone):
                with contextlib.suppress(BaseException):
                    await task
            await asyncio.shield(self._close(outcome))

    async def _close(self, outcome: End) -> None:
        self._close_upstream()
        await self.job.finish(*outcome)

    def _close_upstream(self) -> None:
        """Once: a second close would pool the connection twice."""
        if self.upstream_open:
            self.upstream_open = False
            self.upstream.close()

    def _engine_done(self) -> None:
        """The upstream has ended (or failed): closed (an unfinished request aborted), and what
        the request held of the engine given back before the client's last write."""
        self._close_upstream()
        release_engine(self.job, time.monotonic())

    async def _pump(self, send: Send) -> End:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        job = self.job

        def write(body: bytes) -> Awaitable[None]:  # send's own awaitable: no frame of its own
            return send({"type": "http.response.body", "body": body, "more_body": True})

        async def end(body: bytes) -> bool:
            """The response's last body, within the client's write timeout as every write of
            the relay; False if the client took too long (the connection closes unfinished)."""
            timeout_s = job.state.settings.client_write_timeout_s
            try:
                async with asyncio.timeout(timeout_s):
                    await send({"type": "http.response.body", "body": body, "more_body": False})
            except TimeoutError:
                log.warning(
                    "stream %s ended: the client took nothing for %g s", job.request_id, timeout_s
                )
                return False
            return True

        try:
            tail = await job.relay(write)
        except ClientStalled as exc:  # nothing more can be written to it: the connection closes
            log.warning("stream %s ended: %s", job.request_id, exc)
            return CLIENT_GONE
        except (UpstreamFailed, UpstreamError) as exc:
            recorded = isinstance(exc, UpstreamFailed) and exc.recorded  # a stall timeout
            if job.backend is not None and not recorded:
                job.state.pool.record_failure(job.backend)
            self._engine_done()
            error = ApiError(
                502,
                f"the backend failed mid-stream: {type(exc).__name__}: {exc}",
                code="upstream_error",
            )
            await end(error.sse_event())
            return End(Outcome.FAILED, 502)
        self._engine_done()  # a client slow to take the tail holds no slot meanwhile
        if not await end(tail):
            return CLIENT_GONE
        return _relayed(job)


def _relayed(job: Job) -> End:
    """How a stream relayed to its end ended: failed if the engine sent an error event."""
    return End(Outcome.FAILED, 502) if job.upstream_error else End(Outcome.OK, 200)


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def serve(state: GatewayState, http: Request, kind: Kind) -> Response:
    """Handle one ``/v1/chat/completions`` or ``/v1/completions`` request end to end.

    The request ends (:meth:`Job.finish`) in the one ``finally`` here, as ``end`` last says —
    or, once a stream is relayed, when :class:`RelayStream` ends it."""
    arrival = time.monotonic()
    identity = await authenticate_request(state, http.headers.get("authorization"))  # counted
    job = Job(state, identity, kind, arrival)
    end: End | None = CLIENT_GONE  # what nothing below names: the client gone, the task cancelled
    try:
        try:
            await job.admit(http)
        except AdmissionRejected as exc:
            end = End(Outcome.REJECTED, exc.status_code, exc.reason.value)
            raise ApiError.from_rejection(exc) from None
        except ApiError as exc:
            end = End(Outcome.REJECTED, exc.status, exc.code)
            raise
        except ClientDisconnect:  # gone while sending its body: nothing to answer, nothing to log
            return Response(status_code=499)
        if not job.stream:
            end, answer = await _serve_unary(job, http)
            if isinstance(answer, BaseException):
                raise answer
            return answer
        try:
            upstream = await job.dispatch()
        except ApiError as exc:
            end = End(Outcome.FAILED, exc.status, exc.code)
            raise
        if isinstance(upstream, Response):  # the engine refused it (4xx): pass it on
            end = End(Outcome.REJECTED, upstream.status_code, UPSTREAM_REJECTED)
            return upstream
        end = None  # the relay ends it
        return RelayStream(job, upstream)
    finally:
        if end is not None:
            await job.finish(*end)


async def _serve_unary(job: Job, http: Request) -> tuple[End, Response | BaseException]:
    """Non-streaming: wait for the engine, or for the client to leave (then abort upstream).
    How the request ended, and the answer or what failed it."""
    work = asyncio.ensure_future(job.dispatch())
    gone = asyncio.ensure_future(_disconnected(http.receive))
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
        for task in (work, gone):
            with contextlib.suppress(BaseException):
                await task
    if work.cancelled() or not work.done():
        return CLIENT_GONE, JSONResponse({}, status_code=499)
    exc = work.exception()
    if isinstance(exc, ApiError):
        return End(Outcome.FAILED, exc.status, exc.code), exc
    if exc is not None:
        return End(Outcome.FAILED, 500), exc
    response = work.result()
    assert isinstance(response, Response)
    if response.status_code != 200:  # the engine refused it (4xx)
        return End(Outcome.REJECTED, response.status_code, UPSTREAM_REJECTED), response
    return End(Outcome.OK, 200), response
