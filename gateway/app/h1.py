"""One keep-alive HTTP/1.1 connection to an engine, as an asyncio protocol: the upstream wire.

Every streamed token crosses this path, so it is kept to what a read needs: one C parse
(``httptools``, uvicorn's own HTTP parser), one Python callback per body chunk, and the
consumer takes whatever body arrived since its last read in one piece. aiohttp's client did
the same work through its payload parser, a ``StreamReader`` with per-chunk bookkeeping and a
timer rescheduled on every read — about a quarter of the gateway's CPU per streamed request
(cProfile, ``docs/results.md`` § Gateway overhead). Here the read timeout is one timer per
period, checked against the last read when it fires.

Scope: what the gateway asks of its engines. A request is written whole; a response body is
delimited by ``content-length``, chunked, or the connection's end; gzip or deflate is decoded
should a proxy compress despite ``accept-encoding: identity``. No redirects, no HTTP/2, no
pipelining. The pool and the gateway-facing contract are :mod:`gateway.app.upstream`'s.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import cast

import httptools


class UpstreamError(Exception):
    """The engine could not be reached, or broke off or timed out mid-response."""


class UpstreamTimeout(UpstreamError):
    """No answer in time (as opposed to a refused or broken connection)."""


PAUSE_BYTES = 1 << 20
"""Body bytes buffered and not yet taken at which the connection stops reading (a client that
reads slowly holds the relay back; the engine then sees TCP back-pressure, as it would with
aiohttp's 64 KiB-per-stream limit)."""
MAX_INFLATE_BYTES = 16 << 20
"""Most bytes one compressed body chunk may inflate to (a decompression bomb fails instead)."""
Origin = tuple[str, str, int]
"""(scheme, host, port): what a pooled connection is keyed by."""
_DECODED = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class Connection(asyncio.Protocol):
    """A connection's state and its current response. Use: :meth:`send` a request, await
    :meth:`head`, then :meth:`readany` until it returns ``b""``; reusable once ``complete``."""

    def __init__(
        self, origin: Origin, read_timeout_s: float, on_lost: Callable[[Connection], None]
    ) -> None:
        self.origin = origin
        self._loop = asyncio.get_running_loop()
        self._read_timeout_s = read_timeout_s
        self._on_lost = on_lost
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        """Taken from the pool of idle connections (set by the pool) rather than opened for
        the current request."""
        self._timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.complete = False
        self._parts: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder: zlib._Decompress | None = None
        self._until_eof = False
        self._informational = False
        self._keep_alive = False
        self.received = False
        """Some byte of the current response arrived (a failure before any did may be an idle
        connection the engine closed as the request went out: it never saw the request)."""
        self._last_read = self._loop.time()

    # ---- the consumer's side --------------------------------------------------------------

    def send(self, request: bytes) -> None:
        """Write a whole request (head and body) and expect its response."""
        assert self.transport is not None and not self.closed
        self._reset()
        self.transport.write(request)

    @property
    def reusable(self) -> bool:
        """The response was read to its end and the engine keeps the connection open."""
        return (
            self.complete
            and not self._parts
            and not self.closed
            and self._error is None
            and self._keep_alive
        )

    @property
    def at_end(self) -> bool:
        """The whole body has arrived and been taken."""
        return self.complete and not self._parts

    async def head(self) -> None:
        """Wait for the response's status line and headers."""
        while not self.head_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def readany(self) -> bytes:
        """The body that arrived since the last call, at least one byte; ``b""`` at its end.
        What arrived before a failure is returned before the failure is raised."""
        while True:
            parts = self._parts
            if parts:
                self._parts = []
                self._buffered = 0
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                    # the read timeout is the engine's silence, not the time we stopped reading
                    self._last_read = self._loop.time()
                return parts[0] if len(parts) == 1 else b"".join(parts)
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()

    def close(self) -> None:
        """Drop the connection (an unfinished response: the engine sees the disconnect)."""
        self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()

    async def _wait(self) -> None:
        waiter = self._loop.create_future()
        self._waiter = waiter
        if self._timer is None:
            self._timer = self._loop.call_at(
                self._last_read + self._read_timeout_s, self._check_timeout
            )
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None and not self.complete:
            self._error = error
        self.close()
        self._wake()

    def _check_timeout(self) -> None:
        """The read timeout: fires at most once per period, not rescheduled on every read."""
        self._timer = None
        if self._waiter is None or self.complete:
            return  # nobody waits: the next wait re-arms it from the last read
        due = self._last_read + self._read_timeout_s
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._check_timeout)
            return
        self._fail(UpstreamTimeout(f"no data from the engine for {self._read_timeout_s:g} s"))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        self.received = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            cause = exc.__context__ if isinstance(exc.__context__, UpstreamError) else None
            self._fail(cause or UpstreamError(f"malformed HTTP from the engine: {exc}"))
            return
        if self.head_done:
            self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        if self.head_done and not self.complete and self._until_eof and exc is None:
            self.on_message_complete()  # a body delimited by the connection's end
        elif not self.complete:
            reason = f": {type(exc).__name__}: {exc}" if exc is not None else ""
            self._fail(UpstreamError(f"the engine closed the connection{reason}"))
        self._on_lost(self)
        self._wake()

    # ---- httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self.headers.get(key)
        self.headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # an informational answer: the real one follows
            self._informational = True
            self.headers = {}
            return
        self.status = status
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding in _DECODED:
            self._decoder = zlib.decompressobj(_DECODED[encoding])
        elif encoding not in ("identity", ""):
            raise UpstreamError(f"the engine answered in an unsupported encoding {encoding!r}")
        framed = "content-length" in self.headers or "chunked" in self.headers.get(
            "transfer-encoding", ""
        )
        self._until_eof = not framed and status not in (204, 304)
        self._keep_alive = self._parser.should_keep_alive()  # not known after the message
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        if self._decoder is not None:
            try:
                body = self._decoder.decompress(body, MAX_INFLATE_BYTES)
            except zlib.error as exc:
                raise UpstreamError(f"the engine's compressed body is corrupt: {exc}") from None
            if self._decoder.unconsumed_tail:
                raise UpstreamError(f"a compressed chunk inflating past {MAX_INFLATE_BYTES} bytes")
            if not body:
                return
        self._parts.append(body)
        self._buffered += len(body)
        if self._buffered > PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        if self._decoder is not None:
            rest = self._decoder.flush()
            if rest:
                self._parts.append(rest)
            self._decoder = None
        self.complete = True
        self._cancel_timer()
