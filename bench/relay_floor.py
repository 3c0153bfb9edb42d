"""The least a Python relay can do per streamed request: the floor under the gateway's CPU cost.

``bench/gateway_overhead.py --relay asgi|raw`` puts one of these in the gateway's place, on the
same emulated engine, load generator and CPU accounting, so that the gateway's CPU per request
can be read against what relaying alone costs on the same machine at the same moment.

* :class:`AsgiRelay` — an ASGI app under the gateway role's own uvicorn configuration (uvloop,
  httptools) and the gateway's own upstream client (:class:`gateway.app.upstream.Upstream`): it
  reads the body, posts it unchanged, and sends what each upstream read brought as one ASGI
  body message, the last one ending the response. What remains is uvicorn plus the client.
* :class:`RawRelay` — no ASGI and no coroutine per request: an ``asyncio.Protocol`` server
  parsing requests with httptools, a kept-alive upstream connection of its own whose
  ``data_received`` writes the body that arrived straight to the client transport as one
  chunk (the response head merged into the first). What remains is the event loop, the
  parser and the socket calls.
* :class:`RsgiRelay` — granian's RSGI interface (HTTP in Rust on tokio, the app on this
  process's event loop) with the gateway's upstream client: the body posted unchanged, each
  upstream read sent on the response stream as it arrives. :func:`granian_server` also serves
  :class:`AsgiRelay` through granian's ASGI interface, so that the server layer is the only
  difference from ``asgi``. granian is no dependency of the project: :data:`GRANIAN_MISSING`
  says why it cannot run when it is not installed.

None of them authenticates, admits, parses events or accounts: they bound the cost from below.
All serve only ``POST /v1/chat/completions`` (anything else: 404), on HTTP/1.1 keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

GRANIAN_MISSING: str | None = None
try:
    import granian  # noqa: F401
except ImportError:  # an optional bench dependency
    GRANIAN_MISSING = "granian is not installed (pip install granian)"
"""Why the granian relays cannot run here, or None when they can."""

CHAT_PATH = "/v1/chat/completions"
KEEPALIVE_S = 4.0
"""Idle upstream connections older than this are not reused (the engine's uvicorn closes them
at 5 s), as in the gateway's pool."""
READ_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# ---- ASGI ---------------------------------------------------------------------------------


class AsgiRelay:
    """An ASGI app relaying chat completions to one engine through the gateway's client."""

    def __init__(self, engine_url: str) -> None:
        self.url = engine_url.rstrip("/") + CHAT_PATH
        self._upstream: Any = None
        """:class:`gateway.app.upstream.Upstream`, made at start-up, in the serving loop."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            if scope["method"] == "POST" and scope["path"] == CHAT_PATH:
                await self._relay(receive, send)
            else:
                await _asgi_status(send, 404)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        from gateway.app.upstream import Upstream

        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._upstream = Upstream(
                    read_timeout_s=READ_TIMEOUT_S,
                    connect_timeout_s=CONNECT_TIMEOUT_S,
                    keepalive_s=KEEPALIVE_S,
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._upstream is not None:
                    await self._upstream.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _relay(self, receive: Receive, send: Send) -> None:
        from gateway.app.upstream import UpstreamError

        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            response = await self._upstream.post_json(self.url, body)
        except UpstreamError:
            await _asgi_status(send, 502)
            return
        try:
            content_type = (response.content_type or "text/event-stream").encode("latin-1")
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache")],
                }
            )
            ended = False
            with contextlib.suppress(UpstreamError):  # a broken stream: end what was sent
                async for batch in response.event_batches():  # one list per upstream read
                    ended = response.at_end  # the last read: end the response in this message
                    await send(
                        {
                            "type": "http.response.body",
                            "body": batch[0] if len(batch) == 1 else b"".join(batch),
                            "more_body": not ended,
                        }
                    )
            if not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            response.close()


async def _asgi_status(send: Send, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


# ---- RSGI (granian) ------------------------------------------------------------------------


class RsgiRelay:
    """An RSGI app relaying chat completions to one engine through the gateway's client."""

    def __init__(self, engine_url: str) -> None:
        self.url = engine_url.rstrip("/") + CHAT_PATH
        self._upstream: Any = None
        """:class:`gateway.app.upstream.Upstream`, made in the serving loop."""

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        from gateway.app.upstream import Upstream

        self._upstream = Upstream(
            read_timeout_s=READ_TIMEOUT_S,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            keepalive_s=KEEPALIVE_S,
        )

    async def aclose(self) -> None:
        """Close the upstream connections (granian's own hook cannot await)."""
        if self._upstream is not None:
            await self._upstream.aclose()

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":
            return
        if scope.method != "POST" or scope.path != CHAT_PATH:
            protocol.response_empty(404, [])
            return
        await self._relay(protocol)

    async def _relay(self, protocol: Any) -> None:
        from gateway.app.upstream import UpstreamError

        body = await protocol()
        try:
            response = await self._upstream.post_json(self.url, body)
        except UpstreamError:
            protocol.response_empty(502, [])
            return
        try:
            headers = [
                ("content-type", response.content_type or "text/event-stream"),
                ("cache-control", "no-cache"),
            ]
            stream = protocol.response_stream(response.status, headers)
            with contextlib.suppress(UpstreamError):  # a broken stream: end what was sent
                async for batch in response.event_batches():  # one list per upstream read
                    await stream.send_bytes(batch[0] if len(batch) == 1 else b"".join(batch))
        finally:
            response.close()


def granian_server(app: AsgiRelay | RsgiRelay, port: int, backlog: int = 4096) -> Any:
    """granian's embedded server (one worker, one Rust runtime thread, the app on the running
    event loop) serving ``app`` on 127.0.0.1:``port``: RSGI for :class:`RsgiRelay`, ASGI with
    lifespan for :class:`AsgiRelay`. Run ``await server.serve()``; ``server.stop()`` ends it."""
    if GRANIAN_MISSING is not None:
        raise RuntimeError(GRANIAN_MISSING)
    from granian.constants import HTTPModes, Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server

    interface = Interfaces.RSGI if isinstance(app, RsgiRelay) else Interfaces.ASGI
    return Server(
        app,
        address="127.0.0.1",
        port=port,
        interface=interface,
        runtime_threads=1,
        http=HTTPModes.http1,
        websockets=False,
        backlog=backlog,
        log_level=LogLevels.warning,
    )


# ---- raw asyncio protocols ------------------------------------------------------------------

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 502: b"Bad Gateway"}


def _empty_response(status: int, keep_alive: bool) -> bytes:
    connection = b"" if keep_alive else b"connection: close\r\n"
    reason = _REASONS.get(status, b"")
    return b"HTTP/1.1 %d %s\r\ncontent-length: 0\r\n%s\r\n" % (status, reason, connection)


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class RawRelay:
    """The relay's shared state: the engine's address and the idle upstream connections."""

    def __init__(self, engine_url: str) -> None:
        parts = urlsplit(engine_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"an http:// engine URL is needed, not {engine_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.request_head = (
            f"POST {CHAT_PATH} HTTP/1.1\r\nhost: {parts.netloc}\r\n"
            "accept-encoding: identity\r\ncontent-type: application/json\r\n"
        ).encode("ascii")
        self._idle: list[_Upstream] = []
        self._open: set[_Upstream] = set()

    async def start(self, sock: socket.socket, backlog: int = 4096) -> asyncio.Server:
        """Serve on the bound socket ``sock``."""
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: _Client(self), sock=sock, backlog=backlog)

    def forward(self, client: _Client, body: bytes) -> None:
        """Send ``body`` to the engine on an idle connection, or on a new one."""
        request = b"%scontent-length: %d\r\n\r\n%s" % (self.request_head, len(body), body)
        oldest = time.monotonic() - KEEPALIVE_S
        while self._idle:
            upstream = self._idle.pop()  # the newest first
            if not upstream.closed and upstream.idle_since > oldest:
                upstream.start(client, request)
                return
            upstream.close()
        task = asyncio.ensure_future(self._connect(client, request))
        client.connecting = task

    async def _connect(self, client: _Client, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, upstream = await loop.create_connection(
                    lambda: _Upstream(self), self.host, self.port
                )
        except (OSError, TimeoutError):
            client.connecting = None
            client.fail(502)
            return
        client.connecting = None
        self._open.add(upstream)
        if client.closed:
            self.release(upstream)
        else:
            upstream.start(client, request)

    def release(self, upstream: _Upstream) -> None:
        """Pool a connection whose response ended and that the engine keeps open."""
        if upstream.closed or not upstream.keep_alive:
            upstream.close()
            return
        upstream.idle_since = time.monotonic()
        self._idle.append(upstream)

    def lost(self, upstream: _Upstream) -> None:
        self._open.discard(upstream)

    def close(self) -> None:
        for upstream in list(self._open):
            upstream.close()
        self._idle.clear()


class _Upstream(asyncio.Protocol):
    """One kept-alive connection to the engine, relaying one response at a time."""

    def __init__(self, relay: RawRelay) -> None:
        self.relay = relay
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: _Client | None = None
        self.parts: list[bytes] = []
        self.done = False
        self.keep_alive = True
        """Whether the engine keeps the connection open after the current response."""
        self.closed = False
        self.paused = False
        self.idle_since = 0.0

    def start(self, client: _Client, request: bytes) -> None:
        assert self.transport is not None
        self.client, self.parts, self.done = client, [], False
        client.upstream = self
        if client.writing_paused and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self.transport.write(request)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()  # connection_lost breaks off the client's response
            return
        client = self.client
        if client is None:
            return
        parts = self.parts
        if parts or self.done:
            self.parts = []
            client.write_body(parts, self.done)
        if self.done:
            _unpair(client, self)
            if self.paused and self.transport is not None:
                self.paused = False
                self.transport.resume_reading()
            self.relay.release(self)
            client.response_ended()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.relay.lost(self)
        client = self.client
        if client is not None:  # mid-response: the client cannot get a whole one
            _unpair(client, self)
            client.abort()

    # httptools callbacks

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self.client is not None:
            self.client.status = self.parser.get_status_code()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.client is not None and name.lower() == b"content-type":
            self.client.content_type = value

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class _Client(asyncio.Protocol):
    """One client connection: requests parsed by httptools, answered one after the other."""

    def __init__(self, relay: RawRelay) -> None:
        self.relay = relay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.connecting: asyncio.Future[None] | None = None
        self.closed = False
        self.url = b""
        self.body: list[bytes] = []
        self.pending: deque[tuple[bool, bytes | None]] = deque()
        """Requests parsed and not answered yet: (keep-alive, body or None if not a chat)."""
        self.active = False
        self.writing_paused = False
        self.keep_alive = True
        self.status = 0
        self.content_type = b"text/event-stream"
        self.head_sent = False

    # the relay's side

    def write_body(self, parts: list[bytes], end: bool) -> None:
        """One chunk with what an upstream read brought, the head before the first and the
        last chunk after the end."""
        assert self.transport is not None
        out = b"".join(parts) if len(parts) != 1 else parts[0]
        frame = b"%x\r\n%s\r\n" % (len(out), out) if out else b""
        if end:
            frame += b"0\r\n\r\n"
        if not self.head_sent:
            self.head_sent = True
            frame = (
                b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncache-control: no-cache\r\n"
                b"transfer-encoding: chunked\r\n%s\r\n%s"
                % (
                    self.status,
                    _REASONS.get(self.status, b""),
                    self.content_type,
                    b"" if self.keep_alive else b"connection: close\r\n",
                    frame,
                )
            )
        if not self.closed:
            self.transport.write(frame)

    def response_ended(self) -> None:
        self.active = False
        if not self.keep_alive:
            self.close()
        elif self.pending:
            self._dispatch(*self.pending.popleft())

    def fail(self, status: int) -> None:
        """No upstream: an empty answer, then the next request."""
        if self.transport is not None and not self.closed:
            self.transport.write(_empty_response(status, self.keep_alive))
        self.response_ended()

    def abort(self) -> None:
        """The upstream broke off: close, so the client sees an incomplete response."""
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.close()
        except httptools.HttpParserError:
            if self.transport is not None and not self.active:
                self.transport.write(_empty_response(400, False))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.connecting is not None:
            self.connecting.cancel()
        upstream = self.upstream
        if upstream is not None:  # mid-response: dropping it tells the engine to abort
            _unpair(self, upstream)
            upstream.close()

    def pause_writing(self) -> None:
        """The client reads slower than the engine writes: stop reading the engine."""
        self.writing_paused = True
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None and not upstream.paused:
            upstream.paused = True
            upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None and upstream.paused:
            upstream.paused = False
            upstream.transport.resume_reading()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        chat = self.parser.get_method() == b"POST" and self.url == CHAT_PATH.encode()
        request = (self.parser.should_keep_alive(), b"".join(self.body) if chat else None)
        if self.active:
            self.pending.append(request)  # pipelined: after the current response
        else:
            self._dispatch(*request)

    def _dispatch(self, keep_alive: bool, body: bytes | None) -> None:
        self.keep_alive = keep_alive
        self.active = True
        if body is None:
            self.fail(404)
            return
        self.status, self.content_type, self.head_sent = 0, b"text/event-stream", False
        self.relay.forward(self, body)


def _unpair(client: _Client, upstream: _Upstream) -> None:
    """End a response's link between a client connection and its engine connection."""
    client.upstream = None
    upstream.client = None
