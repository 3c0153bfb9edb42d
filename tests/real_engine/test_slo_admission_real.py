"""SLOs-Serve's decline path in front of real vLLM servers (vLLM's CPU build, the tiny model):
two engines running ``TiergateScheduler`` with ``slos-serve``, driven with the ``openai``
client. The gateway reads each engine's policy and estimator from its ``/metrics`` and asks that
engine's admission planner before dispatch (:mod:`gateway.app.slo_admission`).

A burst of each tier in turn is given a TTFT (``x-slo-ttft-ms``) of a few prefills of its
prompt by the estimator the gateway plans with, so each planner admits a few and declines the
rest: the refused get 503 ``slo_declined`` with ``retry-after`` and never reach an engine (the
engines' count of requests received equals what was served), and the tier with best effort is
served, its declined ones demoted.
No assertion is about how long anything took.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from engine_common.exports import RECEIVED
from gateway.app import BackendSpec, create_app
from gateway.app.schemas import ChatBody
from gateway.app.server import GatewayThread
from gateway.app.slo_admission import TPOT_SHARE
from gateway.db import crud
from gateway.db.models import Base, UsageRecord
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from priority.estimator import LatencyCoefficients
from priority.policies.slos_batch import prefill_capacity
from priority.profiles import Profile, load_profile
from tests.real_engine.vllm_server import MODEL, VllmServer, serving

SECRET = "slo-admission-real-secret"
SLOWDOWN = 20.0
"""Backends and engines run an A100 profile this many times slower (the engines uncorrected:
:data:`FIXED_ESTIMATOR`), so a prefill of the prompt is ~1 s of planned work and the burst's
TTFT a few seconds — far longer than the gateway's own overhead, which the deadline also covers."""
PROMPT = "The quick brown fox jumps over the lazy dog. " * 60
BURST = 12
ADMITTED_PER_ENGINE = 3
"""The TTFT given to the burst: this many prefills' work (and a bit) per engine."""
TPOT_MS = 1000.0
TIERS = {"strict": False, "lenient": True}  # best effort allowed
FIXED_ESTIMATOR = {"TIERGATE_REFIT_EVERY": "0", "TIERGATE_ESTIMATOR_WINDOW": "1000000"}
"""The engines run the gateway's slowed profile and never correct it (no refit; no β update
within the test): the bursts' TTFT is a number of prefills by the estimator the gateway plans
with, and the gateway adopts what an engine exports — the CPU engine's real speed, had it
learned it, made the second burst's TTFT a few tens of ms and every request of it
unattainable before any planner was asked."""


def _slow_profile() -> Profile:
    profile = load_profile("a100-qwen2-7b")
    scaled = {k: v * SLOWDOWN for k, v in profile.coefficients.to_dict().items()}
    return replace(
        profile,
        name=f"{profile.name}-x{SLOWDOWN:g}",
        coefficients=LatencyCoefficients.from_dict(scaled),
    )


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    profile = logs / "slow-profile.json"
    profile.write_text(json.dumps(_slow_profile().to_dict()))
    settings = {**FIXED_ESTIMATOR, "TIERGATE_PROFILE": str(profile)}
    servers = {
        f"slos-{i}": VllmServer(f"slos-{i}", "slos-serve", core=i, log_dir=logs, settings=settings)
        for i in (0, 1)
    }
    with serving(servers):
        yield servers


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('db') / 'tiergate.db'}")
    Base.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def keys(factory: sessionmaker[Session]) -> dict[str, str]:
    with factory.begin() as session:
        for tier, best_effort in TIERS.items():
            crud.create_tier(
                session,
                actor="test",
                name=tier,
                weight=1.0,
                ttft_ms=60_000,
                min_ttft_ms=1.0,  # the burst's x-slo-ttft-ms sets its TTFT
                tpot_ms=TPOT_MS,
                best_effort_allowed=best_effort,
                shed_slack=100.0,  # the gateway's predicted-TTFT rule admits: the planners decide
            )
            crud.create_tenant(session, actor="test", name=tier, tier=tier)
        return {
            tier: crud.create_key(session, actor="test", tenant=tier, secret=SECRET).plaintext
            for tier in TIERS
        }


@pytest.fixture(scope="module")
def gateway(
    factory: sessionmaker[Session],
    engines: dict[str, VllmServer],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayThread]:
    settings = Settings(
        database_url=str(factory.kw["bind"].url),
        secret=SecretStr(SECRET),
        data_dir=Path(tmp_path_factory.mktemp("gw")),
        redis_url=None,
        scrape_interval_s=0.5,
        probe_interval_s=0.25,
        probe_timeout_s=2.0,
        router="round-robin",
        dispatch_horizon_s=60.0,
    )
    backends = [BackendSpec(name, s.url, MODEL, _slow_profile()) for name, s in engines.items()]
    with GatewayThread(create_app(settings, backends=backends)) as gw:
        end = time.monotonic() + 120.0
        while not all(
            b.facts is not None and b.facts.policy == "slos-serve" for b in gw.state.pool.backends
        ):
            assert time.monotonic() < end, [
                (b.name, b.facts and b.facts.policy) for b in gw.state.pool.backends
            ]
            time.sleep(0.05)
        yield gw


def _ttft_ms(gateway: GatewayThread) -> float:
    """A few prefills of the prompt, by the slowest engine's estimator as the gateway has it."""
    tokens = ChatBody.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
    ).prompt_tokens()
    slowest = 0.0
    for backend in gateway.state.pool.backends:
        est = backend.view.estimator
        capacity = prefill_capacity(est, TPOT_SHARE * TPOT_MS / 1e3)
        slowest = max(slowest, est.prefill_time(tokens, 0) / capacity)
    return math.ceil((ADMITTED_PER_ENGINE + 0.5) * slowest * 1e3)


def _one(client: openai.OpenAI, ttft_ms: float, start: threading.Barrier) -> dict[str, Any]:
    start.wait()  # every request of the burst leaves at once, however slowly threads start
    try:
        answer = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=4,
            extra_body={"ignore_eos": True},
            extra_headers={"x-slo-ttft-ms": str(ttft_ms)},
        )
        return {"status": 200, "text": answer.choices[0].message.content or ""}
    except openai.APIStatusError as exc:
        headers = exc.response.headers
        return {
            "status": exc.status_code,
            "reason": headers.get("x-tiergate-reject-reason"),
            "retry_after": headers.get("retry-after"),
            "message": exc.message,
        }


def _burst(gateway: GatewayThread, keys: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """:data:`BURST` requests of each tier at once, the strict tier's burst first and the
    lenient one's once it has ended, each with the TTFT of a few prefills fixed before it goes.
    One tier at a time: the planners admit a few of a burst in the order its requests reach
    them, so an interleaved burst could give every admission to the lenient tier and leave the
    strict one none to serve."""
    shots: dict[str, list[dict[str, Any]]] = {}
    for tier, key in keys.items():
        ttft = _ttft_ms(gateway)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=300)
        start = threading.Barrier(BURST)
        with ThreadPoolExecutor(BURST) as pool:
            shots[tier] = list(pool.map(_one, [client] * BURST, [ttft] * BURST, [start] * BURST))
    return shots


def _received(engines: dict[str, VllmServer]) -> float:
    total = 0.0
    for server in engines.values():
        for line in server.metrics().splitlines():
            if line.startswith(RECEIVED + "{") or line.startswith(RECEIVED + " "):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _rows(factory: sessionmaker[Session]) -> list[UsageRecord]:
    with factory() as session:
        return list(session.scalars(select(UsageRecord)).all())


def test_declined_requests_are_shed_or_demoted_and_never_both_declined_and_served(
    gateway: GatewayThread,
    keys: dict[str, str],
    engines: dict[str, VllmServer],
    factory: sessionmaker[Session],
) -> None:
    before = _received(engines)
    shots = _burst(gateway, keys)
    strict, lenient = shots["strict"], shots["lenient"]
    served = [s for s in strict if s["status"] == 200]
    shed = [s for s in strict if s["status"] != 200]
    assert served and shed, strict
    assert all(s["text"] for s in served)
    for s in shed:  # refused once every engine's planner declined, with a retry hint
        assert (s["status"], s["reason"]) == (503, "slo_declined"), s
        assert s["retry_after"] is not None and 1 <= int(s["retry_after"]) <= 60
    # a tier with best effort is never refused on these grounds: its declined are demoted
    assert all(s["status"] == 200 and s["text"] for s in lenient), lenient
    metrics = gateway.state.metrics.render().decode()
    assert 'tiergate_demotions_total{reason="slo_declined",tier="lenient"}' in metrics
    for name in engines:
        assert f'tiergate_slo_declines_total{{backend="{name}"}}' in metrics
    # no request both declined and served: the engines received exactly the served ones, and
    # the refused ones' usage rows name no engine
    assert _received(engines) - before == len(served) + len(lenient)
    end = time.monotonic() + 30  # the usage writer is asynchronous
    while len(_rows(factory)) < 2 * BURST:
        assert time.monotonic() < end, "usage rows missing"
        time.sleep(0.1)
    declined = [r for r in _rows(factory) if r.reject_reason == "slo_declined"]
    assert len(declined) == len(shed)
    assert all(r.backend is None and r.completion_tokens == 0 for r in declined)
    demoted = [r for r in _rows(factory) if r.reject_reason == "demoted:slo_declined"]
    assert demoted and all(r.status == "ok" and r.backend for r in demoted)
