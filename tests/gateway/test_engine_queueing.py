"""Queueing is not failure: a request that waits past its first-token budget in the queue of an
engine that is serving others is not the engine's fault, and where no other backend could take
it, it keeps waiting there instead of failing with "no healthy backend".

One emulated engine with a single seat (the engine says so: the gateway reads its seats from
the engine's metrics where it states them, and here the profile is the engine's own), the gateway
allowed to dispatch more than that (``max_in_flight``), so the second request waits in the
engine's own queue while the first decodes. The real-engine suite measures the same behaviour
against vLLM (``tests/real_engine/``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread, RunningEngine
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.seed import seed_defaults
from gateway.settings import Settings
from priority.profiles import load_profile

MODEL = "qwen2-7b"
SECRET = "queueing-secret"
ONE_SEAT = dataclasses.replace(
    load_profile("a100-qwen2-7b"),
    engine=dataclasses.replace(load_profile("a100-qwen2-7b").engine, max_num_seqs=1),
)


@pytest.fixture(scope="module")
def engine() -> Iterator[RunningEngine]:
    with EngineThread([EngineSpec(ONE_SEAT, "vllm-v1", MODEL)]) as running:
        yield running[0]


@pytest.fixture
def key(factory: sessionmaker[Session]) -> str:
    with factory.begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name="acme", tier="premium")
        return crud.create_key(session, actor="test", tenant="acme", secret=SECRET).plaintext


def _stream(base_url: str, key: str, max_tokens: int) -> tuple[int, int, list[str]]:
    """Status, content chunks, error codes of one streamed chat."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello there."}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {key}", "x-slo-ttft-ms": "250", "x-slo-tpot-ms": "25"}
    chunks, errors = 0, []
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", f"{base_url}/chat/completions", json=body, headers=headers
        ) as response,
    ):
        if response.status_code != 200:
            response.read()
            return response.status_code, 0, [response.json()["error"]["code"]]
        for line in response.iter_lines():
            if line.startswith("data: {"):
                data = json.loads(line[6:])
                if "error" in data:
                    errors.append(data["error"]["code"])
                elif data.get("choices") and data["choices"][0]["delta"].get("content"):
                    chunks += 1
    return 200, chunks, errors


def test_a_wait_in_a_serving_engines_queue_is_no_fault_and_is_served(
    engine: RunningEngine, factory: sessionmaker[Session], key: str, tmp_path: Path
) -> None:
    settings = Settings(
        database_url=str(factory.kw["bind"].url),
        secret=SecretStr(SECRET),
        data_dir=tmp_path,
        redis_url=None,
        max_in_flight=4,  # more than the engine's one seat: the second waits in its queue
        first_token_timeout_factor=1.0,
        first_token_timeout_min_s=0.2,
        probe_interval_s=0.05,
        scrape_interval_s=0.1,
    )
    backends = [BackendSpec("engine-0", engine.url, MODEL, ONE_SEAT)]
    with GatewayThread(create_app(settings, backends=backends)) as gateway:
        pool = gateway.state.pool
        (backend,) = pool.backends
        with ThreadPoolExecutor(2) as workers:
            long = workers.submit(_stream, gateway.base_url, key, 300)
            deadline = time.monotonic() + 30
            while not backend.own_decoding and time.monotonic() < deadline:
                time.sleep(0.01)
            assert backend.own_decoding == 1  # the first holds the only seat
            queued = workers.submit(_stream, gateway.base_url, key, 4)
            first, second = long.result(), queued.result()
        registry = gateway.state.metrics.registry
        waited = registry.get_sample_value(
            "tiergate_upstream_timeouts_total", {"backend": "engine-0", "phase": "queued"}
        )
        blamed = registry.get_sample_value(
            "tiergate_upstream_timeouts_total", {"backend": "engine-0", "phase": "first_token"}
        )
        failures = backend.breaker.failures
    assert first == (200, 300, [])
    assert second[0] == 200 and second[1] == 4 and second[2] == []
    assert waited is not None and waited >= 1  # its first-token budget ran out in the queue...
    assert not blamed  # ...which counted nothing against the engine
    assert failures == 0
