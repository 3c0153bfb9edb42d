"""A backend that failed a request once is tried again when it is the only one left.

The other backend may have died since the first attempt (``kill -9`` of the engine the request
failed over to): the client must see an error only where no retry could have served it. Here a
single engine answers its first chat request with a 500 and serves the next: the request is
served on the second attempt, the failure counted once, the usage row ``ok``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.models import UsageRecord
from gateway.db.seed import seed_defaults
from gateway.settings import Settings
from tests.gateway.polling import wait_for

MODEL = "flaky-model"
SECRET = "failover-retry-secret"


def _chunk(content: str | None, *, usage: bool = False) -> bytes:
    body: dict[str, object] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": []
        if usage
        else [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class FlakyEngine:
    """An OpenAI-compatible engine whose first ``failures`` chat requests get a 500."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.chats = 0
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.chats += 1
        if self.chats <= self.failures:
            return web.json_response({"error": {"message": "engine hiccup"}}, status=500)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for piece in ("Hello", " there"):
            await response.write(_chunk(piece))
        await response.write(_chunk(None, usage=True) + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _empty(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _main(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._empty)
        app.router.add_get("/metrics", self._empty)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> FlakyEngine:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._stop is not None and self._loop is not None
        self._loop.call_soon_threadsafe(self._stop.set)  # the event belongs to that loop
        self._thread.join(10)


@pytest.fixture
def engine() -> Iterator[FlakyEngine]:
    with FlakyEngine(failures=1) as running:
        yield running


def test_the_only_backend_left_is_tried_again_after_it_failed_once(
    factory: sessionmaker[Session], engine: FlakyEngine, tmp_path: Path
) -> None:
    with factory.begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name="flaky", tier="premium")
        key = crud.create_key(session, actor="test", tenant="flaky", secret=SECRET).plaintext
    settings = Settings(
        database_url=str(factory.kw["bind"].url),
        secret=SecretStr(SECRET),
        data_dir=tmp_path,
        redis_url=None,
        probe_interval_s=0.05,
    )
    backends = [BackendSpec("flaky", engine.url, MODEL, "a100-qwen2-7b")]
    with GatewayThread(create_app(settings, backends=backends)) as gateway:
        wait_for(lambda: gateway.state.pool.ready)
        response = httpx.post(
            f"{gateway.base_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )
        failures = gateway.state.metrics.registry.get_sample_value(
            "tiergate_upstream_failures_total", {"backend": "flaky"}
        )
        wait_for(lambda: gateway.state.queue.in_flight == 0)
    assert response.status_code == 200, response.text
    assert "Hello" in response.text and "[DONE]" in response.text
    assert engine.chats == 2 and failures == 1
    deadline = time.monotonic() + 30  # the usage writer is asynchronous
    while time.monotonic() < deadline:
        with factory() as session:
            rows = session.scalars(select(UsageRecord)).all()
            if rows:
                break
        time.sleep(0.05)
    assert [(r.status, r.backend) for r in rows] == [("ok", "flaky")]
