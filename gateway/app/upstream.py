"""The gateway's HTTP client towards its engines: one keep-alive pool for requests and probes.

Its own HTTP/1.1 client (:mod:`gateway.app.h1`: an asyncio protocol over uvicorn's C parser)
because the data plane relays every streamed token: aiohttp's request and response machinery
was about a quarter of the gateway's CPU per streamed request, httpx 0.28 several times that
(measured side by side against the emulated engine, ``docs/results.md``). The pool keeps idle
connections per origin, newest first, and never rescans them (httpcore's did: encode/httpcore
#1035). The rest of the gateway sees only this module's small contract — :class:`Upstream`,
:class:`UpstreamResponse`, :class:`UpstreamError` — so the client stays replaceable.

Cancelling upstream work is closing the connection: an unfinished response is never returned
to the pool, so the engine sees the disconnect and aborts the request. Redirects are not
followed (an engine answers where it is registered).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

from gateway.app.h1 import Connection, Origin, UpstreamError, UpstreamTimeout

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_EVENT_BYTES",
    "Upstream",
    "UpstreamError",
    "UpstreamResponse",
    "UpstreamTimeout",
]

_EVENT_END = b"\n\n"
MAX_EVENT_BYTES = 4 * 1024 * 1024
"""A single SSE event larger than this is a broken upstream, not a token (a chunk of a few
hundred tokens with 20 log-probabilities each is ~0.5 MB)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""A non-streamed answer larger than this is a broken upstream: it is not read into memory."""


class UpstreamResponse:
    """An engine's response, opened with its status and headers; the body is read on demand."""

    def __init__(self, connection: Connection, pool: Upstream) -> None:
        self._connection = connection
        self._pool = pool
        self.status = connection.status
        self.content_type: str | None = connection.headers.get("content-type")
        self._refused = False
        """The body broke a limit: never complete, whatever has arrived."""
        self._partial = b""
        """The start of an SSE event whose end has not arrived yet."""

    @property
    def complete(self) -> bool:
        """The body has been read to its end (the connection can serve another request)."""
        return self._connection.at_end and not self._refused

    async def read(self, max_bytes: int = MAX_BODY_BYTES) -> bytes:
        """The whole body (for non-streamed responses and errors), up to ``max_bytes``."""
        declared = self._connection.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            self._refused = True
            raise UpstreamError(f"a body of {declared} bytes, over {max_bytes}")
        parts: list[bytes] = []
        size = 0
        readany = self._connection.readany
        while data := await readany():
            size += len(data)
            if size > max_bytes:
                self._refused = True
                raise UpstreamError(f"a body longer than {max_bytes} bytes")
            parts.append(data)
        return b"".join(parts)

    async def event_batches(self) -> AsyncIterator[list[bytes]]:
        """The SSE events as they arrive, each with its trailing blank line: one list per
        read, holding the complete events that arrived since the last one (usually one; the
        last few of a stream often come together). Relaying a list in one write saves a socket
        write per extra event. A partial event at the end of the body is completed. Raises
        :class:`UpstreamError` if the connection breaks or times out."""
        readany = self._connection.readany
        while data := await readany():
            if not self._partial and data.endswith(_EVENT_END):  # whole events: no copies
                if data.find(_EVENT_END) == len(data) - 2:
                    yield [data]  # one token's event: the usual read
                else:
                    yield [event + _EVENT_END for event in data[:-2].split(_EVENT_END)]
                continue
            buffer = self._partial + data
            end = buffer.rfind(_EVENT_END)
            if end < 0:
                if len(buffer) > MAX_EVENT_BYTES:
                    self._refused = True
                    raise UpstreamError(f"an event longer than {MAX_EVENT_BYTES} bytes")
                self._partial = buffer
                continue
            complete, self._partial = buffer[: end + 2], buffer[end + 2 :]
            yield [event + _EVENT_END for event in complete[:-2].split(_EVENT_END)]
        if self._partial.strip():
            tail, self._partial = self._partial, b""
            yield [tail + _EVENT_END]
        self._partial = b""

    @property
    def at_end(self) -> bool:
        """Every event of the body has been handed out: nothing more will come (the relay
        then ends the client's response in the same write as the last events)."""
        return self._connection.at_end and not self._partial

    def close(self) -> None:
        """Give the connection back if the body was read to its end; otherwise drop it, which
        tells the engine to abort the request."""
        if self._refused:
            self._connection.close()
        else:
            self._pool.release(self._connection)


class Upstream:
    """A keep-alive connection pool to the engines, used in one running event loop."""

    def __init__(
        self,
        *,
        read_timeout_s: float,
        connect_timeout_s: float,
        keepalive_s: float = 4.0,
        ca_file: str | Path | None = None,
    ) -> None:
        """``keepalive_s`` stays below the engines' own idle timeout (vLLM's uvicorn closes
        idle connections after 5 s), so a request is never sent on a connection the engine is
        closing at that moment — which would fail it before the engine saw it. ``ca_file``: the
        CAs trusted for https engines instead of the system store, loaded now so that a bad
        bundle fails at start-up, not on the first request."""
        self._read_timeout_s = read_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._idle: dict[Origin, list[Connection]] = {}
        self._open: set[Connection] = set()
        self._targets: dict[tuple[bytes, str], tuple[Origin, bytes]] = {}
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context(cafile=str(ca_file)) if ca_file is not None else None
        )
        """Certificates and host names are always verified; created on the first https
        connection when no ``ca_file`` is given (loading the system store takes a while)."""

    async def post_json(self, url: str, payload: bytes) -> UpstreamResponse:
        """POST a JSON body; returns once the response's status line and headers are in."""
        return await self._request(b"POST", url, payload)

    async def get_text(self, url: str, timeout_s: float) -> str:
        """GET a text body with a 2xx status (probes and metric scrapes)."""
        status, body, charset = await self._get(url, timeout_s)
        if not 200 <= status < 300:
            raise UpstreamError(f"HTTP {status} from {url}")
        try:
            return body.decode(charset or "utf-8", "replace")
        except LookupError:  # an unknown charset
            return body.decode("utf-8", "replace")

    async def status(self, url: str, timeout_s: float) -> int:
        """GET ``url`` within ``timeout_s``; its HTTP status (liveness probes: any answer shows
        the server is not frozen, its status says whether it is well)."""
        status, _, _ = await self._get(url, timeout_s)
        return status

    async def _get(self, url: str, timeout_s: float) -> tuple[int, bytes, str | None]:
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._request(b"GET", url, None)
                try:
                    body = await response.read()
                finally:
                    response.close()
        except TimeoutError as exc:
            raise UpstreamTimeout(f"no answer from {url} within {timeout_s:g} s") from exc
        content_type = response.content_type or ""
        _, _, charset = content_type.partition("charset=")
        return response.status, body, charset.split(";")[0].strip().strip('"') or None

    async def _request(self, method: bytes, url: str, body: bytes | None) -> UpstreamResponse:
        origin, head = self._target(method, url)
        if body is None:
            request = head + b"\r\n"
        else:
            request = b"%scontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
                head,
                len(body),
                body,
            )
        connection = await self._connection(origin)
        try:
            connection.send(request)
            await connection.head()
        except UpstreamTimeout:
            connection.close()
            raise
        except UpstreamError:
            connection.close()
            if not connection.reused or connection.received:
                raise
            # A pooled connection closed under the request before any byte of an answer: the
            # engine closed it as idle as the request went out (its keep-alive timer runs on
            # its own clock and loop), so it never saw the request. Every HTTP client retries
            # that once on a new connection; failing it would blame a healthy engine.
            connection = await self._connect(origin)
            try:
                connection.send(request)
                await connection.head()
            except BaseException:
                connection.close()
                raise
        except BaseException:
            connection.close()
            raise
        return UpstreamResponse(connection, self)

    def _target(self, method: bytes, url: str) -> tuple[Origin, bytes]:
        """The origin and request head (without its end) for ``url``, cached per URL."""
        key = (method, url)
        found = self._targets.get(key)
        if found is not None:
            return found
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rpartition("@")[2]  # never send credentials in the host header
        head = (
            f"{method.decode()} {path} HTTP/1.1\r\nhost: {host}\r\naccept-encoding: identity\r\n"
        ).encode("ascii")
        found = ((parts.scheme, parts.hostname, port), head)
        if len(self._targets) > 1024:  # backends come and go: bounded
            self._targets.clear()
        self._targets[key] = found
        return found

    async def _connection(self, origin: Origin) -> Connection:
        """The newest idle connection to ``origin`` that is fresh enough, else a new one."""
        idle = self._idle.get(origin)
        if idle:
            oldest = time.monotonic() - self._keepalive_s
            while idle:
                connection = idle.pop()
                if not connection.closed and connection.idle_since > oldest:
                    connection.reused = True
                    return connection
                connection.close()
        return await self._connect(origin)

    async def _connect(self, origin: Origin) -> Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: Connection(origin, self._read_timeout_s, self._lost),
                    host,
                    port,
                    ssl=self._ssl if scheme == "https" else None,
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"ConnectTimeout: no connection to {host}:{port} within "
                f"{self._connect_timeout_s:g} s"
            ) from exc
        except OSError as exc:  # refused, unreachable, DNS, TLS
            raise UpstreamError(_describe(exc)) from exc
        sock = connection.transport.get_extra_info("socket") if connection.transport else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._open.add(connection)
        return connection

    def release(self, connection: Connection) -> None:
        """Pool a connection whose response was read whole; close any other."""
        if not connection.reusable:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.origin, []).append(connection)

    def _lost(self, connection: Connection) -> None:
        self._open.discard(connection)

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing


def _describe(exc: BaseException) -> str:
    """A short, log-friendly reason: the exception class, plus its message when it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
