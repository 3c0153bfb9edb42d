"""Workflow state (:mod:`gateway.app.workflows`) and sub-deadlines (:mod:`gateway.app.kinds`):
in memory on a fake clock, in a real Redis (atomic create-if-absent across two stores), and
through a Redis outage (per-process state, counted, never an exception to the request)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.app.kinds import DEGRADED_OUTCOMES, RequestKinds
from gateway.app.metrics import GatewayMetrics
from gateway.app.workflows import (
    FailoverWorkflowStore,
    MemoryWorkflowStore,
    RedisWorkflowStore,
    WorkflowCall,
    WorkflowExpired,
    WorkflowUnavailable,
    WorkflowUnknown,
    make_workflow_store,
)
from gateway.db.identity import EffectivePolicy
from gateway.errors import ApiError
from priority.request import SLO, RequestMeta

REDIS_URL = os.environ.get("TIERGATE_REDIS_URL") or "redis://127.0.0.1:6379/0"
DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def _run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


# ---- in memory ---------------------------------------------------------------------------------


def test_memory_store_creates_inherits_expires_and_forgets() -> None:
    clock = Clock()
    store = MemoryWorkflowStore(ttl_s=60.0, clock=clock)

    async def scenario() -> None:
        with pytest.raises(WorkflowUnknown):
            await store.join("1:w", None)  # unknown and no deadline: nothing created
        assert len(store) == 0
        first = await store.join("1:w", 10_000.0)
        assert (first.stage, first.created, first.remaining_ms) == (0, True, 10_000.0)
        clock.t += 4.0
        second = await store.join("1:w", 99_000.0)  # a later deadline header is ignored
        assert (second.stage, second.created, second.deadline_ms) == (1, False, 10_000.0)
        assert second.remaining_ms == pytest.approx(6_000.0)
        assert (await store.join("2:w", 5_000.0)).stage == 0  # another tenant's own workflow
        clock.t += 6.5
        with pytest.raises(WorkflowExpired) as info:
            await store.join("1:w", None)
        assert info.value.late_ms == pytest.approx(500.0)
        clock.t += 60.0  # past the TTL after the deadline: forgotten
        with pytest.raises(WorkflowUnknown):
            await store.join("1:w", None)
        again = await store.join("1:w", 1_000.0)  # the id may start a new workflow now
        assert again.created and again.stage == 0

    _run(scenario())


def test_memory_store_stays_bounded() -> None:
    clock = Clock()
    store = MemoryWorkflowStore(ttl_s=1.0, max_entries=10, clock=clock)

    async def scenario() -> None:
        for i in range(25):
            await store.join(f"1:w{i}", 1_000.0 + i)
        assert len(store) <= 10
        assert (await store.join("1:w24", None)).stage == 1  # the latest to expire is kept

    _run(scenario())


# ---- sub-deadlines -----------------------------------------------------------------------------

POLICY = EffectivePolicy(
    weight=1.0,
    ttft_ms=500.0,
    tpot_ms=50.0,
    deadline_ms=None,
    min_ttft_ms=None,
    min_tpot_ms=None,
    min_deadline_ms=1.0,
    best_effort_allowed=False,
    rpm_limit=None,
    tpm_limit=None,
    max_concurrency=None,
)
META = RequestMeta(SLO(ttft_s=0.5, tpot_s=0.05), weight=1.0, tier="t", tenant="a")


def _resolve(kinds: RequestKinds, headers: dict[str, str]) -> RequestMeta:
    async def go() -> RequestMeta:
        return await kinds.resolve(headers, META, POLICY, tier="t", tenant_key="1")

    result = _run(go())
    assert isinstance(result, RequestMeta)
    return result


def test_the_sub_deadline_hook_is_used_clipped_and_survived() -> None:
    calls: list[WorkflowCall] = []

    def quarter(call: WorkflowCall) -> float:
        calls.append(call)
        return call.remaining_ms / 4 if call.stage else 1e12  # stage 0: more than is left

    kinds = RequestKinds(MemoryWorkflowStore(), sub_deadline=quarter)
    start = {"x-tiergate-workflow-id": "w", "x-tiergate-workflow-deadline-ms": "40000"}
    first = _resolve(kinds, start)
    assert first.slo.deadline_s == first.workflow_deadline_s  # clipped to the time left
    second = _resolve(kinds, {"x-tiergate-workflow-id": "w"})
    assert second.stage == 1 and second.workflow_deadline_s is not None
    assert second.slo.deadline_s == pytest.approx(second.workflow_deadline_s / 4)
    assert [c.stage for c in calls] == [0, 1]

    def broken(call: WorkflowCall) -> float:
        raise RuntimeError("no history")

    kinds.sub_deadline = broken
    third = _resolve(kinds, {"x-tiergate-workflow-id": "w"})
    assert third.slo.deadline_s == third.workflow_deadline_s  # the cold start, not a 500


def test_the_workflow_deadline_respects_the_tiers_floor() -> None:
    kinds = RequestKinds(MemoryWorkflowStore())
    strict = dataclasses.replace(POLICY, min_deadline_ms=5_000.0)

    async def go() -> None:
        headers = {"x-tiergate-workflow-id": "w", "x-tiergate-workflow-deadline-ms": "1000"}
        await kinds.resolve(headers, META, strict, tier="gold", tenant_key="1")

    with pytest.raises(ApiError) as info:
        _run(go())
    assert info.value.status == 400 and "5000" in str(info.value)


# ---- Redis -------------------------------------------------------------------------------------


@pytest.fixture
def prefix() -> Iterator[str]:
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5)
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis unreachable at {REDIS_URL}: {exc}")
        pytest.skip(f"Redis unreachable at {REDIS_URL}: {exc}")
    name = f"tg-wf-{uuid.uuid4().hex[:8]}"
    yield name
    keys = list(client.scan_iter(match=f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_redis_creates_once_and_numbers_every_call_across_stores(prefix: str) -> None:
    async def scenario() -> None:
        a = RedisWorkflowStore.from_url(REDIS_URL, prefix=prefix, ttl_s=5.0)
        b = RedisWorkflowStore.from_url(REDIS_URL, prefix=prefix, ttl_s=5.0)
        try:
            calls = await asyncio.gather(
                *(s.join("7:race", 30_000.0) for s in (a, b) for _ in range(10))
            )
            assert sorted(c.stage for c in calls) == list(range(20))
            assert sum(c.created for c in calls) == 1
            assert all(c.deadline_ms == 30_000.0 for c in calls)
            with pytest.raises(WorkflowUnknown):
                await a.join("8:race", None)  # another tenant: unknown
            ttl_ms = redis.Redis.from_url(REDIS_URL).pttl(a.redis_key("7:race"))
            assert 30_000 < ttl_ms <= 35_000  # kept 5 s past the deadline, then gone
        finally:
            await a.aclose()
            await b.aclose()

    _run(scenario())


def test_redis_says_expired_past_the_deadline(prefix: str) -> None:
    async def scenario() -> None:
        store = RedisWorkflowStore.from_url(REDIS_URL, prefix=prefix)
        try:
            await store.join("1:short", 1.0)  # 1 ms
            await asyncio.sleep(0.01)
            with pytest.raises(WorkflowExpired):
                await store.join("1:short", None)
        finally:
            await store.aclose()

    _run(scenario())


def test_an_outage_degrades_to_process_state_counted_and_logged(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        store = make_workflow_store(REDIS_URL, prefix=prefix)
        assert isinstance(store, FailoverWorkflowStore)
        try:
            seen = await store.join("1:seen", 60_000.0)  # Redis answers; mirrored here
            assert store.mode == "redis" and seen.stage == 0

            async def down(key: str, deadline_ms: float | None) -> WorkflowCall:
                raise RedisConnectionError("connection refused")

            store.shared.join = down  # type: ignore[method-assign]
            with caplog.at_level(logging.WARNING, logger="gateway.app.workflows"):
                again = await store.join("1:seen", None)  # the mirror answers
            assert store.mode == "degraded-local" and again.stage == 1
            assert any("Redis unreachable" in r.getMessage() for r in caplog.records)
            fresh = await store.join("1:new", 10_000.0)  # a first call still starts one
            assert fresh.created and fresh.stage == 0
            with pytest.raises(WorkflowUnavailable):  # maybe another gateway's: not a 400
                await store.join("1:elsewhere", None)
            assert store.degraded_calls == 3
        finally:
            await store.aclose()

    _run(scenario())


def _degraded(metrics: GatewayMetrics, outcome: str) -> float:
    sample = "tiergate_workflow_degraded_calls_total"
    value = metrics.registry.get_sample_value(sample, {"outcome": outcome})
    return value or 0.0


def test_a_dead_redis_never_fails_the_request() -> None:
    metrics = GatewayMetrics()

    async def scenario() -> None:
        store = make_workflow_store(DEAD_REDIS, timeout_s=0.2)
        kinds = RequestKinds(store, on_degraded=metrics.workflow_call_degraded)
        try:
            start = {"x-tiergate-workflow-id": "w", "x-tiergate-workflow-deadline-ms": "9000"}
            slo = await kinds.resolve(start, META, POLICY, tier="t", tenant_key="1")
            assert slo.kind == "compound" and slo.stage == 0
            slo = await kinds.resolve(
                {"x-tiergate-workflow-id": "w"}, META, POLICY, tier="t", tenant_key="1"
            )
            assert slo.kind == "compound" and slo.stage == 1  # this process's copy answers
            unseen = {"x-tiergate-workflow-id": "from-another-gateway"}
            slo = await kinds.resolve(unseen, META, POLICY, tier="t", tenant_key="1")
            assert slo.kind == "latency" and slo.workflow_id is None  # served, as its tier's
            assert kinds.served_without_workflow == 1
            # every degraded call is in the metric, by what became of it
            assert _degraded(metrics, "local") == 2.0
            assert _degraded(metrics, "default_kind") == 1.0
            assert isinstance(store, FailoverWorkflowStore) and store.degraded_calls == 3
            assert set(DEGRADED_OUTCOMES) == {"local", "default_kind"}
        finally:
            await kinds.aclose()

    _run(scenario())
    exposition = metrics.render().decode()
    assert 'tiergate_workflow_degraded_calls_total{outcome="default_kind"} 1.0' in exposition


def test_workflow_calls_with_their_state_in_reach_are_not_counted_degraded(
    prefix: str,
) -> None:
    metrics = GatewayMetrics()

    async def scenario() -> None:
        for store in (MemoryWorkflowStore(), make_workflow_store(REDIS_URL, prefix=prefix)):
            kinds = RequestKinds(store, on_degraded=metrics.workflow_call_degraded)
            try:
                start = {"x-tiergate-workflow-id": "w", "x-tiergate-workflow-deadline-ms": "9000"}
                await kinds.resolve(start, META, POLICY, tier="t", tenant_key="1")
                await kinds.resolve(
                    {"x-tiergate-workflow-id": "w"}, META, POLICY, tier="t", tenant_key="1"
                )
            finally:
                await kinds.aclose()

    _run(scenario())
    for outcome in DEGRADED_OUTCOMES:  # a series at 0, not none: the panel reads 0, not "no data"
        sample = "tiergate_workflow_degraded_calls_total"
        assert metrics.registry.get_sample_value(sample, {"outcome": outcome}) == 0.0
