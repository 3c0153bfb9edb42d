"""SLOs-Serve's decline path through the gateway, with the official ``openai`` client: two
emulated engines running the ``slos-serve`` policy (ten and six times slower than their A100
profile: a fleet of two kinds), behind a round-robin router, and a burst larger than both can
serve within its TTFT. The gateway asks each engine's admission
planner in turn (:mod:`gateway.app.slo_admission`): what the first engine declines goes to the
second, what both decline is refused with 503 ``slo_declined`` and ``retry-after`` — or, for a
tier that allows best effort, demoted and served as such. Asserted: counts and reasons, and that
no request was both declined and served (its usage row names no engine, carries no token) —
never how long anything took.

The gateway's own overload rules (the predicted-TTFT shedding and the dispatch gate,
``gateway.app.shedding``) are set wide here (``shed_slack``, ``dispatch_horizon_s``), so every
request reaches the planners: they are what is tested.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import openai
import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.models import UsageRecord
from gateway.settings import Settings
from priority.estimator import LatencyCoefficients
from priority.profiles import Profile, load_profile
from tests.gateway.polling import wait_for

MODEL = "slos-model"
SECRET = "slos-admission-test-secret"
SLOWDOWNS = (10.0, 6.0)
PROMPT = "word " * 800  # about 1,000 tokens: ~0.5 s and ~0.3 s of prefill on the two engines
BURST = 16
"""Requests at once per tier; the engines' planners admit about 4 and 8 within the TTFT: the
round robin's turns on the first engine past its 4 are declined there and go to the second."""
TTFT_MS, TPOT_MS = 2500.0, 1000.0
TIERS = {"gold": False, "bronze": True}  # best effort allowed


def _slow_profile(slowdown: float) -> Profile:
    profile = load_profile("a100-qwen2-7b")
    scaled = {k: v * slowdown for k, v in profile.coefficients.to_dict().items()}
    return replace(
        profile,
        name=f"{profile.name}-x{slowdown:g}",
        coefficients=LatencyCoefficients.from_dict(scaled),
    )


def _seed(factory: sessionmaker[Session]) -> dict[str, str]:
    keys = {}
    with factory.begin() as session:
        for tier, best_effort in TIERS.items():
            crud.create_tier(
                session,
                actor="test",
                name=tier,
                weight=1.0,
                ttft_ms=TTFT_MS,
                tpot_ms=TPOT_MS,
                best_effort_allowed=best_effort,
                shed_slack=100.0,  # the gateway's predicted-TTFT rule admits: the planners decide
            )
            crud.create_tenant(session, actor="test", name=tier, tier=tier)
            keys[tier] = crud.create_key(
                session, actor="test", tenant=tier, secret=SECRET
            ).plaintext
    return keys


@dataclass
class Shot:
    status: int = 0
    reason: str | None = None
    retry_after: str | None = None
    text: str = ""


async def _one(client: openai.AsyncOpenAI) -> Shot:
    shot = Shot()
    try:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=4,
            stream=True,
        )
        async for chunk in stream:
            for choice in chunk.choices:
                shot.text += choice.delta.content or ""
        shot.status = 200
    except openai.APIStatusError as exc:
        shot.status = exc.status_code
        shot.reason = exc.response.headers.get("x-tiergate-reject-reason")
        shot.retry_after = exc.response.headers.get("retry-after")
    return shot


async def _burst(base_url: str, key: str) -> list[Shot]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)
    try:
        return list(await asyncio.gather(*(_one(client) for _ in range(BURST))))
    finally:
        await client.close()


def _wait_for_facts(gateway: GatewayThread, policy: str) -> None:
    """The planners are asked once the gateway has read each engine's policy from a scrape."""
    end = time.monotonic() + 30
    while time.monotonic() < end:
        backends = gateway.state.pool.backends
        if all(b.facts is not None and b.facts.policy == policy for b in backends):
            return
        time.sleep(0.05)
    pytest.fail("the gateway never learned the engines' policy")


def _wait_idle(gateway: GatewayThread) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if all(
            not b.view.prefill_queue and not b.own_decoding for b in gateway.state.pool.backends
        ):
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_declined_requests_go_to_the_next_engine_then_are_shed_or_demoted(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    keys = _seed(factory)
    profiles = [_slow_profile(slowdown) for slowdown in SLOWDOWNS]
    settings = Settings(
        database_url=str(factory.kw["bind"].url),
        secret=SecretStr(SECRET),
        data_dir=tmp_path,
        redis_url=None,
        dispatch_horizon_s=10.0,  # more than the burst's prefill work: the planners decide
        scrape_interval_s=0.2,
        router="round-robin",
    )
    specs = [EngineSpec(p, "slos-serve", MODEL, seed=i) for i, p in enumerate(profiles)]
    with EngineThread(specs) as engines:
        backends = [
            BackendSpec(f"e{i}", e.url, MODEL, p, kind="emulated")
            for i, (e, p) in enumerate(zip(engines, profiles, strict=True))
        ]
        with GatewayThread(create_app(settings, backends=backends)) as gateway:
            _wait_for_facts(gateway, "slos-serve")
            gold = asyncio.run(_burst(f"{gateway.base_url}", keys["gold"]))
            _wait_idle(gateway)
            bronze = asyncio.run(_burst(f"{gateway.base_url}", keys["bronze"]))
            queue = gateway.state.queue
            # everything ended, nothing leaked (the queue belongs to the gateway's thread: its
            # state is waited for, not raced)
            wait_for(lambda: (queue.in_flight, queue.queued) == (0, 0), "the queue to empty")
            metrics = gateway.state.metrics.render().decode()
    with factory() as session:
        rows = session.scalars(select(UsageRecord)).all()

    planner_lines = "\n".join(
        line
        for line in metrics.splitlines()
        if ("slo_declined" in line or "tiergate_slo_" in line or "tiergate_slo_requests" in line)
        and not line.startswith("#")
        and "_created" not in line
    )
    print(planner_lines)  # the counts, for the record (pytest -s)
    # gold (no best effort): served, or refused once both engines' planners declined
    statuses = Counter((s.status, s.reason) for s in gold)
    assert set(statuses) <= {(200, None), (503, "slo_declined")}, statuses
    shed = [s for s in gold if s.status == 503]
    served = [s for s in gold if s.status == 200]
    assert shed and served, statuses
    assert all(s.text for s in served) and not any(s.text for s in shed)
    for s in shed:
        assert s.retry_after is not None and 1 <= int(s.retry_after) <= 60
    # ... after the first engine declined, the second was asked, and admitted some
    assert 'tiergate_slo_admission_total{outcome="rerouted",tier="gold"}' in metrics, planner_lines
    assert 'tiergate_slo_declines_total{backend="e0"}' in metrics
    assert 'tiergate_slo_declines_total{backend="e1"}' in metrics
    assert f'tiergate_rejections_total{{reason="slo_declined",tier="gold"}} {len(shed)}.0' in (
        metrics
    )

    # bronze (best effort allowed): never refused on these grounds; what both declined is
    # demoted and served as best effort
    assert all(s.status == 200 and s.text for s in bronze), Counter(s.status for s in bronze)
    assert 'tiergate_demotions_total{reason="slo_declined",tier="bronze"}' in metrics, planner_lines

    # one decision per request, and no request both declined and served: a refused one never
    # reached an engine (no backend, no token); a demoted one was served, as best effort
    declined = [r for r in rows if r.reject_reason == "slo_declined"]
    assert len(declined) == len(shed)
    assert all(r.status == "rejected" and r.backend is None for r in declined)
    assert all(r.completion_tokens == 0 for r in declined)
    demoted = [r for r in rows if r.reject_reason == "demoted:slo_declined"]
    assert demoted and all(r.tier == "bronze" for r in demoted)
    assert all(r.status == "ok" and r.backend and r.completion_tokens > 0 for r in demoted)
    served_rows = [r for r in rows if r.status == "ok"]
    assert len(served_rows) == len(served) + len(bronze)
    assert {r.backend for r in served_rows if r.tier == "gold"} == {"e0", "e1"}
