"""The gateway's HTTP client towards its engines: one keep-alive pool for requests and probes.

Built on aiohttp because the data plane relays every streamed token: its C HTTP parser and
stream reader cost ~0.5 ms of CPU per 16-token streamed request against ~3.6 ms for httpx 0.28
(measured side by side against the emulated engine, ``docs/results.md``), and its connection
pool does not rescan every pooled connection on each request (httpcore's does: encode/httpcore
#1035). The rest of the gateway sees only this module's small contract — :class:`Upstream`,
:class:`UpstreamResponse`, :class:`UpstreamError` — so the client library stays replaceable.

Cancelling upstream work is closing the connection: an unfinished response is never returned
to the pool, so the engine sees the disconnect and aborts the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp

_EVENT_END = b"\n\n"
MAX_EVENT_BYTES = 4 * 1024 * 1024
"""A single SSE event larger than this is a broken upstream, not a token (a chunk of a few
hundred tokens with 20 log-probabilities each is ~0.5 MB)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""A non-streamed answer larger than this is a broken upstream: it is not read into memory."""


class UpstreamError(Exception):
    """The engine could not be reached, or broke off or timed out mid-response."""


class UpstreamTimeout(UpstreamError):
    """No answer in time (as opposed to a refused or broken connection)."""


class UpstreamResponse:
    """An engine's response, opened with its status and headers; the body is read on demand."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.content_type: str | None = response.headers.get("content-type")
        self.complete = False

    async def read(self, max_bytes: int = MAX_BODY_BYTES) -> bytes:
        """The whole body (for non-streamed responses and errors), up to ``max_bytes``."""
        declared = self._response.content_length
        if declared is not None and declared > max_bytes:
            raise UpstreamError(f"a body of {declared} bytes, over {max_bytes}")
        parts: list[bytes] = []
        size = 0
        content = self._response.content
        try:
            while data := await content.readany():
                size += len(data)
                if size > max_bytes:
                    raise UpstreamError(f"a body longer than {max_bytes} bytes")
                parts.append(data)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(_describe(exc)) from exc
        self.complete = True
        return b"".join(parts)

    async def event_batches(self) -> AsyncIterator[list[bytes]]:
        """The SSE events as they arrive, each with its trailing blank line: one list per
        network read, holding the complete events it brought (usually one; the last few of a
        stream often come together). Relaying a list in one write saves a socket write per
        extra event. A partial event at the end of the body is completed. Raises
        :class:`UpstreamError` if the connection breaks or times out."""
        content = self._response.content
        buffer = b""
        try:
            while data := await content.readany():
                if not buffer and data.endswith(_EVENT_END):  # whole events: no copies
                    if data.find(_EVENT_END) == len(data) - 2:
                        yield [data]  # one token's event: the usual read
                    else:
                        yield [event + _EVENT_END for event in data[:-2].split(_EVENT_END)]
                    continue
                buffer += data
                end = buffer.rfind(_EVENT_END)
                if end < 0:
                    if len(buffer) > MAX_EVENT_BYTES:
                        raise UpstreamError(f"an event longer than {MAX_EVENT_BYTES} bytes")
                    continue
                complete, buffer = buffer[: end + 2], buffer[end + 2 :]
                yield [event + _EVENT_END for event in complete[:-2].split(_EVENT_END)]
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(_describe(exc)) from exc
        if buffer.strip():
            yield [buffer + _EVENT_END]
        self.complete = True

    def close(self) -> None:
        """Give the connection back if the body was read to its end; otherwise drop it, which
        tells the engine to abort the request."""
        if self.complete:
            self._response.release()
        else:
            self._response.close()


class Upstream:
    """A keep-alive connection pool to the engines, created in the running event loop."""

    def __init__(
        self, *, read_timeout_s: float, connect_timeout_s: float, keepalive_s: float = 4.0
    ) -> None:
        """``keepalive_s`` stays below the engines' own idle timeout (vLLM's uvicorn closes
        idle connections after 5 s), so a request is never sent on a connection the engine is
        closing at that moment — which would fail it before the engine saw it."""
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,  # admission control bounds concurrency, not the pool
                keepalive_timeout=self._keepalive_s,
                ttl_dns_cache=300,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                # Ask for plain bytes (they are relayed as they come); should a proxy compress
                # anyway, aiohttp decodes it before the relay sees it.
                headers={"accept-encoding": "identity"},
                skip_auto_headers=("user-agent",),
            )
        return self._session

    async def post_json(self, url: str, payload: bytes) -> UpstreamResponse:
        """POST a JSON body; returns once the response's status line and headers are in."""
        try:
            response = await self.session.post(
                url, data=payload, headers={"content-type": "application/json"}
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise UpstreamError(_describe(exc)) from exc
        return UpstreamResponse(response)

    async def get_text(self, url: str, timeout_s: float) -> str:
        """GET a text body with a 2xx status (probes and metric scrapes)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.get(url, timeout=timeout) as response:
                response.raise_for_status()
                return await response.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise UpstreamError(_describe(exc)) from exc

    async def status(self, url: str, timeout_s: float) -> int:
        """GET ``url`` within ``timeout_s``; its HTTP status (liveness probes: any answer shows
        the server is not frozen, its status says whether it is well)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.get(url, timeout=timeout) as response:
                await response.read()
                return response.status
        except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors too
            raise UpstreamTimeout(_describe(exc)) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(_describe(exc)) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let the connector's transports finish closing


def _describe(exc: BaseException) -> str:
    """A short, log-friendly reason: the exception class, plus its message when it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
