"""The upstream client against a real HTTP server: SSE events split and batched as they arrive,
broken streams reported, unfinished responses never returned to the pool."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from gateway.app.upstream import MAX_EVENT_BYTES, Upstream, UpstreamError, UpstreamTimeout

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _serve(handler: Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/stream", handler)
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _writes(
    request: web.Request, *parts: bytes | Callable[[], Awaitable[object]]
) -> web.StreamResponse:
    """Answer with a chunked body written in ``parts``; a callable is awaited between writes
    (the client's signal that it has read what came before)."""
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    for part in parts:
        if isinstance(part, bytes):
            await response.write(part)
        else:
            await part()
    await response.write_eof()
    return response


async def _collect(batches: AsyncIterator[list[bytes]]) -> list[list[bytes]]:
    return [batch async for batch in batches]


def test_events_are_split_completed_and_batched_per_read() -> None:
    read: asyncio.Queue[None] = asyncio.Queue()  # one item per batch the client has taken

    async def handler(request: web.Request) -> web.StreamResponse:
        return await _writes(
            request,
            b"data: 1\n\ndata: 2",  # one whole event and half of the next
            read.get,
            b"\n\ndata: 3\n\n",  # the rest of 2, and 3: they arrive together
            read.get,
            b"data: [DONE]\n\ndata: tail",  # a last event without its blank line
        )

    async def scenario() -> list[list[bytes]]:
        runner, url = await _serve(handler)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        try:
            response = await upstream.post_json(f"{url}/stream", b"{}")
            assert response.status == 200 and response.content_type == "text/event-stream"
            batches = []
            async for batch in response.event_batches():
                batches.append(batch)
                read.put_nowait(None)
            assert response.complete
            response.close()
            return batches
        finally:
            await upstream.aclose()
            await runner.cleanup()

    batches = asyncio.run(scenario())
    assert batches == [
        [b"data: 1\n\n"],
        [b"data: 2\n\n", b"data: 3\n\n"],  # one read, one batch
        [b"data: [DONE]\n\n"],
        [b"data: tail\n\n"],  # completed at the end of the body
    ]


def test_a_stream_cut_mid_body_raises_upstream_error() -> None:
    first_read = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: 1\n\n")
        await first_read.wait()
        assert request.transport is not None
        request.transport.close()  # the engine dies mid-stream
        return response

    async def scenario() -> list[bytes]:
        runner, url = await _serve(handler)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        seen: list[bytes] = []
        try:
            response = await upstream.post_json(f"{url}/stream", b"{}")
            with pytest.raises(UpstreamError):
                async for batch in response.event_batches():
                    seen.extend(batch)
                    first_read.set()
            assert not response.complete
            response.close()
        finally:
            await upstream.aclose()
            await runner.cleanup()
        return seen

    assert asyncio.run(scenario()) == [b"data: 1\n\n"]


def test_closing_an_unfinished_response_disconnects_the_engine() -> None:
    closed = asyncio.Event()
    disconnected = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: x\n\n")
        await closed.wait()
        try:
            while True:  # the engine goes on generating until a write finds the client gone
                await response.write(b"data: x\n\n")
                await asyncio.sleep(0)  # a yield: the loop sees the connection's end
        except (ConnectionResetError, asyncio.CancelledError):
            disconnected.set()
            raise

    async def scenario() -> None:
        runner, url = await _serve(handler)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        try:
            response = await upstream.post_json(f"{url}/stream", b"{}")
            async for _ in response.event_batches():
                break  # the client went away after the first event
            assert not response.complete
            response.close()
            closed.set()
            await asyncio.wait_for(disconnected.wait(), 60.0)  # a bound against a hang only
        finally:
            await upstream.aclose()
            await runner.cleanup()

    asyncio.run(scenario())


def test_unreachable_engine_and_bad_status_are_upstream_errors() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, text="down")

    async def scenario() -> None:
        runner, url = await _serve(handler)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        try:
            with pytest.raises(UpstreamError, match="503"):
                await upstream.get_text(f"{url}/metrics", timeout_s=1.0)
        finally:
            await upstream.aclose()
            await runner.cleanup()
        fresh = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        try:
            with pytest.raises(UpstreamError, match="Connect"):  # nothing listens there now
                await fresh.post_json(f"{url}/stream", b"{}")
        finally:
            await fresh.aclose()

    asyncio.run(scenario())


def test_a_compressed_stream_is_decoded_before_the_relay_sees_it() -> None:
    """The gateway asks for identity encoding; a proxy that compresses anyway is decoded."""
    seen_encoding: list[str | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen_encoding.append(request.headers.get("accept-encoding"))
        body = gzip.compress(b"data: 1\n\ndata: [DONE]\n\n")
        return web.Response(
            body=body, headers={"content-type": "text/event-stream", "content-encoding": "gzip"}
        )

    async def scenario() -> list[bytes]:
        runner, url = await _serve(handler)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        try:
            response = await upstream.post_json(f"{url}/stream", b"{}")
            events = [e for batch in await _collect(response.event_batches()) for e in batch]
            response.close()
            return events
        finally:
            await upstream.aclose()
            await runner.cleanup()

    assert asyncio.run(scenario()) == [b"data: 1\n\n", b"data: [DONE]\n\n"]
    assert seen_encoding == ["identity"]


def test_an_event_without_end_beyond_the_limit_is_an_upstream_error() -> None:
    """A garbling engine that never ends its event: the relay stops at MAX_EVENT_BYTES instead
    of buffering it all (the gateway then fails the attempt over or ends the stream)."""
    chunk = b"x" * (1 << 20)

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: {")
        with contextlib.suppress(ConnectionResetError):
            for _ in range(2 * MAX_EVENT_BYTES // len(chunk) + 1):
                await response.write(chunk)
        return response

    async def scenario() -> None:
        runner, url = await _serve(handler)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        try:
            response = await upstream.post_json(f"{url}/stream", b"{}")
            with pytest.raises(UpstreamError, match="longer than"):
                await _collect(response.event_batches())
            response.close()
        finally:
            await upstream.aclose()
            await runner.cleanup()

    asyncio.run(scenario())


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_the_limit_is_not_read_into_memory(declared: bool) -> None:
    body = b"{" + b" " * 4096 + b"}"

    async def handler(request: web.Request) -> web.StreamResponse:
        if declared:
            return web.Response(body=body, content_type="application/json")
        return await _writes(request, body[:2048], body[2048:])  # chunked: no length declared

    async def scenario() -> None:
        runner, url = await _serve(handler)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        try:
            response = await upstream.post_json(f"{url}/stream", b"{}")
            with pytest.raises(UpstreamError, match=r"over|longer"):
                await response.read(max_bytes=1024)
            assert not response.complete
            response.close()
            response = await upstream.post_json(f"{url}/stream", b"{}")
            assert await response.read() == body  # within the default limit
            assert response.complete
            response.close()
        finally:
            await upstream.aclose()
            await runner.cleanup()

    asyncio.run(scenario())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_connection_is_reused_only_after_a_whole_body(loop: str) -> None:
    """Keep-alive: a body read to its end gives the connection back (the next request reuses
    it); a stream given up before its end closes it. Under uvloop too, as the gateway runs."""
    peers: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername")[1])
        return await _writes(request, b"data: 1\n\n", b"data: [DONE]\n\n")

    async def scenario() -> list[bool]:
        runner, url = await _serve(handler)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        ends: list[bool] = []
        try:
            for _ in range(2):  # read whole: the same connection
                response = await upstream.post_json(f"{url}/stream", b"{}")
                events = [e for batch in await _collect(response.event_batches()) for e in batch]
                assert events == [b"data: 1\n\n", b"data: [DONE]\n\n"]
                ends.append(response.at_end and response.complete)
                response.close()
            response = await upstream.post_json(f"{url}/stream", b"{}")
            async for _ in response.event_batches():
                break  # given up: this connection is dropped
            ends.append(response.complete)
            response.close()
            response = await upstream.post_json(f"{url}/stream", b"{}")
            await response.read()
            response.close()
            assert await upstream.get_text(f"{url}/metrics", timeout_s=1.0)  # reuses it too
        finally:
            await upstream.aclose()
            await runner.cleanup()
        return ends

    if loop == "uvloop":
        import uvloop

        ends = uvloop.run(scenario())
    else:
        ends = asyncio.run(scenario())
    assert ends[:2] == [True, True]
    assert peers[0] == peers[1]  # kept alive and reused
    assert peers[2] != peers[1] or ends[2]  # a response given up early is not reused
    assert peers[3] != peers[2] or ends[2]
    assert peers[4] == peers[3]


def test_a_read_timeout_is_an_upstream_timeout() -> None:
    """An engine that sends its headers and then nothing: the read timeout ends the wait."""
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: 1\n\n")
        await release.wait()
        return response

    async def scenario() -> None:
        runner, url = await _serve(handler)
        upstream = Upstream(read_timeout_s=0.2, connect_timeout_s=1.0)
        try:
            response = await upstream.post_json(f"{url}/stream", b"{}")
            seen: list[bytes] = []
            with pytest.raises(UpstreamTimeout):
                async for batch in response.event_batches():
                    seen.extend(batch)
            assert seen == [b"data: 1\n\n"] and not response.complete
            response.close()
        finally:
            release.set()
            await upstream.aclose()
            await runner.cleanup()

    asyncio.run(scenario())


_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def _keepalive_server(answers_per_connection: int) -> tuple[asyncio.Server, str, list[int]]:
    """A server that answers ``answers_per_connection`` requests on a connection and then
    closes it, unanswered, as the next request arrives: an engine's keep-alive timer firing
    just as a pooled connection is used. Returns the server, its URL and the requests seen
    per connection."""
    seen: list[int] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(0)
        index = len(seen) - 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                seen[index] += 1
                if seen[index] > answers_per_connection:
                    return  # closed without a byte of an answer
                writer.write(_ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/stream", seen


def test_a_pooled_connection_closed_under_the_request_is_retried_on_a_new_one() -> None:
    """The engine closes an idle keep-alive connection as the gateway sends on it: the request
    goes out again on a new connection (the engine never saw it), so no request fails on a
    healthy engine for a race of two idle timers."""

    async def scenario() -> list[int]:
        server, url, seen = await _keepalive_server(answers_per_connection=1)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        try:
            for _ in range(3):
                response = await upstream.post_json(url, b"{}")
                assert response.status == 200 and await response.read() == b"{}"
                response.close()  # back to the pool: the next request takes it
        finally:
            await upstream.aclose()
            server.close()
            await server.wait_closed()
        return seen

    seen = asyncio.run(scenario())
    # each pooled connection failed its second request unanswered; each retry opened a new one
    assert seen == [2, 2, 1]


def test_a_new_connection_closed_before_an_answer_is_not_retried() -> None:
    """Only a reused connection is retried: a new one that the engine closes unanswered is an
    engine fault, reported once (the gateway's failover decides what happens next)."""

    async def scenario() -> list[int]:
        server, url, seen = await _keepalive_server(answers_per_connection=0)
        upstream = Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)
        try:
            with pytest.raises(UpstreamError, match="closed the connection"):
                await upstream.post_json(url, b"{}")
        finally:
            await upstream.aclose()
            server.close()
            await server.wait_closed()
        return seen

    assert asyncio.run(scenario()) == [1]
