"""bench/relay_floor.py: the bare relays stream an emulated engine's answer whole, kept alive.

Engine and relay run in this process's event loop (the bench runs them as child processes; the
relaying code is the same)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import httpx
import pytest
import uvicorn

from tests.scripts_loader import load_script

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def relay_floor() -> ModuleType:
    return load_script("bench/relay_floor.py")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench/gateway_overhead.py")


def _bound() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.asynccontextmanager
async def _uvicorn(app: object) -> AsyncIterator[str]:
    sock = _bound()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))  # type: ignore[arg-type]
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), "the server did not start"
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def _granian(app: Any, module: ModuleType) -> AsyncIterator[str]:
    with contextlib.closing(_bound()) as probe:  # a free port: granian binds its own socket
        port = probe.getsockname()[1]
    server = module.granian_server(app, port)
    task = asyncio.ensure_future(server.serve())
    while True:
        assert not task.done(), "granian did not start"
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.02)
            continue
        writer.close()
        break
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        await task
        if isinstance(app, module.RsgiRelay):
            await app.aclose()


@contextlib.asynccontextmanager
async def _relay(kind: str, module: ModuleType, engine_url: str) -> AsyncIterator[tuple[str, Any]]:
    if kind in ("granian", "granian-asgi"):
        relay_class = module.RsgiRelay if kind == "granian" else module.AsgiRelay
        async with _granian(relay_class(engine_url), module) as url:
            yield url, None
        return
    if kind == "asgi":
        async with _uvicorn(module.AsgiRelay(engine_url)) as url:
            yield url, None
        return
    relay = module.RawRelay(engine_url)
    sock = _bound()
    server = await relay.start(sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", relay
    finally:
        server.close()
        relay.close()


async def _events(
    client: httpx.AsyncClient, url: str, body: bytes
) -> tuple[httpx.Response, list[str]]:
    async with client.stream(
        "POST",
        f"{url}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    ) as response:
        text = (await response.aread()).decode()
    return response, [e for e in text.split("\n\n") if e.strip()]


def _content(events: list[str]) -> list[str]:
    out = []
    for event in events[:-1]:
        delta = json.loads(event.removeprefix("data: "))["choices"][0]["delta"]
        if delta.get("content"):
            out.append(delta["content"])
    return out


@pytest.mark.parametrize("kind", ["raw", "asgi", "granian", "granian-asgi"])
def test_relay_streams_the_whole_answer_on_kept_alive_connections(
    kind: str, relay_floor: ModuleType, bench: ModuleType
) -> None:
    from engine_emulated.serve import EngineSpec

    if kind.startswith("granian") and relay_floor.GRANIAN_MISSING is not None:
        pytest.skip(f"--relay {kind}: {relay_floor.GRANIAN_MISSING}")

    body = json.dumps(
        {
            "model": bench.MODEL,
            "messages": [{"role": "user", "content": bench.PROMPT}],
            "max_tokens": MAX_TOKENS,
            "stream": True,
        }
    ).encode()

    async def scenario() -> None:
        engine = EngineSpec("a100-qwen2-7b", "vllm-v1", bench.MODEL, time_scale=50.0)
        async with (
            _uvicorn(engine.create_app()) as engine_url,
            _relay(kind, relay_floor, engine_url) as (relay_url, raw),
        ):
            async with httpx.AsyncClient(timeout=30.0) as client:
                direct, direct_events = await _events(client, engine_url, body)
                assert direct.status_code == 200 and direct_events[-1] == "data: [DONE]"
                expected = len(_content(direct_events))
                assert expected > 0
                for _ in range(3):  # one client connection, kept alive
                    response, events = await _events(client, relay_url, body)
                    assert response.status_code == 200
                    assert response.headers["content-type"].startswith("text/event-stream")
                    assert events[-1] == "data: [DONE]"
                    assert len(_content(events)) == expected
                missing = await client.get(f"{relay_url}/v1/models")
                assert missing.status_code == 404
            if raw is not None:  # the engine saw one connection, reused
                assert len(raw._open) == 1
            # the bench's own load generator accepts the relayed stream
            headers = {"content-type": "application/json", "authorization": "Bearer ignored"}
            sse = bench.SseClient(relay_url, "/v1/chat/completions", headers, body)
            try:
                for _ in range(2):
                    sample = bench.Sample(True, 0.0)
                    await sse.stream(sample)
                    assert sample.error is None and sample.first is not None
                    assert len(sample.gaps) == expected - 1
            finally:
                await sse.aclose()

    asyncio.run(scenario())


def test_granian_relays_are_refused_with_the_reason_when_granian_is_missing(
    bench: ModuleType, relay_floor: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay_floor, "GRANIAN_MISSING", "granian is not installed (test)")
    monkeypatch.setitem(sys.modules, "relay_floor", relay_floor)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--relay", "granian", "--duration", "1"])
    assert exit_info.value.code == 2
    with pytest.raises(RuntimeError, match="not installed"):
        relay_floor.granian_server(relay_floor.RsgiRelay("http://127.0.0.1:1"), 1)
