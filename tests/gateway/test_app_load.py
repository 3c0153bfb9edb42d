"""The gateway under concurrency and faults: limits under a burst (in-process and Redis), no lost
usage records, failover when a backend dies, and client disconnects cancelling upstream work.

Each test runs its own gateway (uvicorn in a thread) so that it can stop it — shutdown is what
flushes the usage writer — or kill its engines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import SecretStr
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread, RunningEngine, stop_engines
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.identity import KeyIdentity
from gateway.db.models import UsageRecord
from gateway.db.seed import seed_defaults
from gateway.settings import Settings
from tests.gateway.polling import wait_for

MODEL = "qwen2-7b"
SECRET = "load-test-secret"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello there."}]
REDIS_URL = os.environ.get("TIERGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _tenant_key(
    factory: sessionmaker[Session], name: str, tier: str = "standard", **limits: Any
) -> str:
    with factory.begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name=name, tier=tier, **limits)
        return crud.create_key(session, actor="test", tenant=name, secret=SECRET).plaintext


@pytest.fixture(scope="module")
def engines() -> Iterator[list[RunningEngine]]:
    specs = [
        EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL),
        EngineSpec("910b-qwen2-7b", "vllm-v1-priority", MODEL),
    ]
    with EngineThread(specs) as running:
        yield running


def _backends(engines: list[RunningEngine]) -> list[BackendSpec]:
    return [BackendSpec(f"engine-{i}", e.url, MODEL, e.spec.profile) for i, e in enumerate(engines)]


@contextmanager
def _gateway(
    factory: sessionmaker[Session], engines: list[RunningEngine], tmp_path: Path, **options: Any
) -> Iterator[GatewayThread]:
    url = str(factory.kw["bind"].url)
    options.setdefault("redis_url", None)
    settings = Settings(database_url=url, secret=SecretStr(SECRET), data_dir=tmp_path, **options)
    with GatewayThread(create_app(settings, backends=_backends(engines))) as gateway:
        yield gateway


async def _burst(base_url: str, key: str, n: int, **create: Any) -> list[int]:
    """``n`` concurrent chat requests; the HTTP status of each."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)

    async def one() -> int:
        try:
            await client.chat.completions.create(model=MODEL, messages=CHAT, **create)
        except openai.APIStatusError as exc:
            return exc.status_code
        return 200

    try:
        return await asyncio.gather(*(one() for _ in range(n)))
    finally:
        await client.close()


def _redis_or_skip() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except Exception as exc:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"Redis unreachable at {REDIS_URL} (CI=true: these tests must run)")
        pytest.skip(f"Redis unreachable at {REDIS_URL}: {type(exc).__name__}")


@pytest.mark.parametrize("limiter", ["memory", "redis"])
def test_rpm_limit_holds_under_a_concurrent_burst(
    factory: sessionmaker[Session], engines: list[RunningEngine], tmp_path: Path, limiter: str
) -> None:
    options: dict[str, Any] = {}
    if limiter == "redis":
        _redis_or_skip()
        options = {"redis_url": REDIS_URL, "redis_prefix": f"tg-test-{uuid.uuid4().hex[:8]}"}
    key = _tenant_key(factory, "bursty", rpm_limit=7)
    with _gateway(factory, engines, tmp_path, **options) as gateway:
        statuses = asyncio.run(_burst(gateway.base_url, key, 40, max_tokens=2))
    assert statuses.count(200) == 7
    assert statuses.count(429) == 33


def test_concurrency_limit_holds_under_a_burst(
    factory: sessionmaker[Session], engines: list[RunningEngine], tmp_path: Path
) -> None:
    key = _tenant_key(factory, "parallel", max_concurrency=3)
    with _gateway(factory, engines, tmp_path) as gateway:
        statuses = asyncio.run(_burst(gateway.base_url, key, 12, max_tokens=40))
    assert statuses.count(200) >= 3  # at least the first three; more once slots free
    assert statuses.count(429) >= 1
    assert set(statuses) <= {200, 429}


def test_no_usage_record_is_lost_under_load(
    factory: sessionmaker[Session], engines: list[RunningEngine], tmp_path: Path
) -> None:
    key = _tenant_key(factory, "busy")
    with _gateway(factory, engines, tmp_path, usage_flush_interval_s=5.0) as gateway:
        statuses = asyncio.run(_burst(gateway.base_url, key, 200, max_tokens=2))
        # every dispatch was matched by a finish: the routing state is back to empty
        assert gateway.state.queue.in_flight == 0
        for backend in gateway.state.pool.backends:
            assert not backend.view.prefill_queue and backend.own_decoding == 0
    # the gateway is stopped: its usage writer was flushed on shutdown
    assert statuses.count(200) == 200
    with factory() as session:
        rows = session.scalars(select(UsageRecord)).all()
    assert len(rows) == 200
    assert {r.status for r in rows} == {"ok"}
    assert all(r.completion_tokens == 2 and r.ttft_ms is not None for r in rows)
    assert len({r.request_id for r in rows}) == 200
    assert {r.backend for r in rows} <= {"engine-0", "engine-1"}


def test_failover_when_a_backend_dies(factory: sessionmaker[Session], tmp_path: Path) -> None:
    """engine-0 (A100) wins idle ties, so the first attempts go to it; after it dies every
    request must still succeed via engine-1, and the failures are counted."""
    key = _tenant_key(factory, "survivor")
    specs = [
        EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL),
        EngineSpec("910b-qwen2-7b", "vllm-v1-priority", MODEL),
    ]
    thread = EngineThread(specs)
    engines = thread.start()
    try:
        with _gateway(
            factory,
            engines,
            tmp_path,
            scrape_interval_s=60.0,
            probe_interval_s=60.0,
            breaker_failures=100,
            metrics_addr="127.0.0.1:0",
        ) as gateway:  # no probe and no breaker: the retry path alone must carry it
            client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
            asyncio.run_coroutine_threadsafe(stop_engines(engines[:1]), thread.loop).result(10)
            for stream in (False, True):
                for _ in range(3):
                    reply = client.chat.completions.create(
                        model=MODEL, messages=CHAT, max_tokens=3, stream=stream
                    )
                    if stream:
                        assert sum(1 for _ in reply) >= 1
            metrics = httpx.get(gateway.app.state.metrics_listener.metrics_url).text
        assert 'tiergate_upstream_failures_total{backend="engine-0"}' in metrics
    finally:
        thread.stop()
    with factory() as session:
        backends = session.scalars(select(UsageRecord.backend)).all()
    assert backends.count("engine-1") >= 6


def test_open_breaker_takes_a_dead_backend_out_of_routing(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    key = _tenant_key(factory, "watcher")
    thread = EngineThread(
        [
            EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL),
            EngineSpec("910b-qwen2-7b", "vllm-v1-priority", MODEL),
        ]
    )
    engines = thread.start()
    try:
        with _gateway(
            factory, engines, tmp_path, scrape_interval_s=0.05, breaker_failures=2
        ) as gateway:
            asyncio.run_coroutine_threadsafe(stop_engines(engines[:1]), thread.loop).result(10)
            wait_for(lambda: not gateway.state.pool.backends[0].view.healthy)
            ready = httpx.get(f"{gateway.url}/health/readiness").json()
            assert ready["healthy_backends"] == ["engine-1"]
            client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    finally:
        thread.stop()


def _engine_load(engines: list[RunningEngine]) -> int:
    return sum(e.sim.core.num_running + e.sim.core.num_waiting for e in engines)


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_cancels_the_upstream_request(
    factory: sessionmaker[Session], engines: list[RunningEngine], tmp_path: Path, stream: bool
) -> None:
    key = _tenant_key(factory, "impatient")
    with _gateway(factory, engines, tmp_path) as gateway:
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 5000, "stream": stream}
        headers = {"authorization": f"Bearer {key}"}
        with httpx.Client(timeout=30) as client:
            if stream:
                with client.stream(
                    "POST", f"{gateway.base_url}/chat/completions", json=body, headers=headers
                ) as response:
                    assert response.status_code == 200
                    # keep the iterator: a discarded one is closed at once, and closing it
                    # closes the connection — the client would leave right after this line
                    lines = response.iter_lines()
                    next(lines)  # the first token arrived
                    # the engine's counters belong to its own thread (read mid-step, they can
                    # be between lists): wait for it to report the request, as below
                    wait_for(lambda: _engine_load(engines) >= 1)
            else:
                with pytest.raises(httpx.ReadTimeout):
                    client.post(
                        f"{gateway.base_url}/chat/completions",
                        json=body,
                        headers=headers,
                        timeout=0.5,
                    )
        wait_for(lambda: _engine_load(engines) == 0)
        wait_for(lambda: gateway.state.queue.in_flight == 0)
        assert all(not b.view.prefill_queue for b in gateway.state.pool.backends)
    with factory() as session:
        statuses = session.scalars(select(UsageRecord.status)).all()
        total = session.scalar(select(func.count()).select_from(UsageRecord))
    assert statuses == ["cancelled"] and total == 1


def test_client_gone_while_sending_its_body_is_a_quiet_499(
    factory: sessionmaker[Session],
    engines: list[RunningEngine],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that announces a body and leaves half-way: a cancelled usage record, no
    traceback in the log, and the gateway keeps serving."""
    key = _tenant_key(factory, "hasty")
    uvicorn_errors = logging.getLogger("uvicorn.error")  # does not propagate to the root
    with _gateway(factory, engines, tmp_path) as gateway:
        uvicorn_errors.addHandler(caplog.handler)  # after uvicorn configured its logging
        host, port = gateway.url.removeprefix("http://").split(":")
        authenticated = threading.Event()  # the request is in the handler, reading its body
        authenticate = gateway.state.auth.authenticate

        async def spy(authorization: str | None) -> KeyIdentity:
            identity = await authenticate(authorization)
            authenticated.set()
            return identity

        gateway.state.auth.authenticate = spy  # type: ignore[method-assign]
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\n"
                + f"host: {host}\r\nauthorization: Bearer {key}\r\n".encode()
                + b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                + b'{"model": "qwen2-7b", "messa'
            )
            assert authenticated.wait(30), "the request never reached the handler"
        wait_for(lambda: gateway.state.usage_writer.submitted == 1)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        assert client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2).choices
    with factory() as session:
        statuses = session.scalars(select(UsageRecord.status).order_by(UsageRecord.id)).all()
    uvicorn_errors.removeHandler(caplog.handler)
    assert statuses == ["cancelled", "ok"]
    assert not [r for r in caplog.records if r.exc_info], "the disconnect was logged as an error"


def test_smoothing_holds_each_chunk_until_shortly_before_its_deadline(
    factory: sessionmaker[Session], engines: list[RunningEngine], tmp_path: Path
) -> None:
    """PROSERVE's buffer: token i leaves no earlier than its due time (TTFT + (i-1) TPOT from
    arrival) minus the margin. A lower bound only: sleeping never makes anything early."""
    key = _tenant_key(factory, "paced", tier="premium")
    margin_ms, ttft_ms, tpot_ms = 20.0, 250.0, 25.0
    with _gateway(factory, engines, tmp_path, smoothing=True, smoothing_margin_ms=margin_ms) as gw:
        client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
        sent = time.monotonic()
        stream = client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=4,
            stream=True,
            extra_headers={"x-slo-ttft-ms": str(ttft_ms), "x-slo-tpot-ms": str(tpot_ms)},
        )
        received = [
            time.monotonic() - sent for c in stream if c.choices and c.choices[0].delta.content
        ]
    assert received
    for i, at in enumerate(received):
        assert at * 1e3 >= ttft_ms + i * tpot_ms - margin_ms


def test_admission_queue_full_is_429_and_ttl_is_503(
    factory: sessionmaker[Session], engines: list[RunningEngine], tmp_path: Path
) -> None:
    """One dispatch slot and one queue place: a long stream holds the slot, a second request
    waits, a third finds the queue full (429); once the queue's clock has passed the waiter's
    TTL, the slot's release finds it expired (503). The stream holds the slot until the test
    closes it and the TTL passes on a stepped clock, so no outcome depends on timing.

    On the batch tier: only best effort keeps the queue TTL; a request with an SLO leaves the
    queue as soon as its wait makes the SLO unattainable (``tests/gateway/
    test_overload_shedding.py``)."""
    key = _tenant_key(factory, "crowd", tier="batch")
    options = {"max_in_flight": 1, "max_queued": 1, "queue_ttl_s": 60.0}  # no timer fires
    with _gateway(factory, engines, tmp_path, **options) as gateway:
        queue = gateway.state.queue
        stepped = time.monotonic()  # the queue's clock: it reads ``stepped`` at each call
        queue._clock = lambda: stepped
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)

        def one() -> tuple[int, str | None]:
            try:
                client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
            except openai.APIStatusError as exc:
                return exc.status_code, exc.response.headers.get("x-tiergate-reject-reason")
            return 200, None

        body = {"model": MODEL, "messages": CHAT, "max_tokens": 5000, "stream": True}
        headers = {"authorization": f"Bearer {key}"}
        with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=30) as http:
            with http.stream(
                "POST", f"{gateway.base_url}/chat/completions", json=body, headers=headers
            ) as running:
                assert running.status_code == 200
                lines = running.iter_lines()  # kept: a dropped iterator closes the stream
                next(lines)  # it holds the slot until this stream closes
                waiting = pool.submit(one)
                wait_for(lambda: queue.queued == 1)
                assert one() == (429, "queue_full")
                stepped += 120.0  # past the waiter's TTL, by the clock the queue orders by
            # the stream is closed: its slot goes back, and the queue drops the expired waiter
            assert waiting.result(timeout=30) == (503, "queue_ttl")
        client.close()
