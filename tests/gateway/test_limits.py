"""Per-tenant RPM/TPM/concurrency limiters: in-process and Redis, held to the same tests.

Redis tests use ``TIERGATE_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) with a fresh key
prefix per test. They skip, saying why, when Redis is unreachable — unless ``CI=true``, where a
missing Redis is a failure.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
import redis
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.limits import (
    REJECT_REASON_HEADER,
    RETRY_AFTER_HEADER,
    FailoverRateLimiter,
    InMemoryRateLimiter,
    LimitExceeded,
    Limits,
    RateLimiter,
    RedisRateLimiter,
    RejectReason,
    Usage,
    make_rate_limiter,
)

REDIS_URL = os.environ.get("TIERGATE_REDIS_URL") or "redis://127.0.0.1:6379/0"


def _redis_unreachable() -> str | None:
    """Why Redis cannot be used, or None when it answers."""
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as error:
        return f"Redis unreachable at {REDIS_URL}: {error}"
    return None


@pytest.fixture(scope="session")
def redis_url() -> str:
    reason = _redis_unreachable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the Redis limiter tests must run)")
        pytest.skip(reason)
    return REDIS_URL


def _delete_prefix(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


MakeLimiter = Callable[..., RateLimiter]


@pytest_asyncio.fixture(params=["memory", "redis", "failover"])
async def make_limiter(request: pytest.FixtureRequest) -> AsyncIterator[MakeLimiter]:
    """A factory of limiters of one kind; Redis ones get a fresh key prefix, cleaned up after.

    ``failover`` is what the gateway runs with Redis: the Redis limiter behind
    :class:`FailoverRateLimiter`, held to the same contract while Redis answers.
    """
    made: list[RateLimiter] = []
    prefix = f"tiergate-test-{uuid.uuid4().hex[:12]}"
    if request.param != "memory":
        request.getfixturevalue("redis_url")

    def make(**options: Any) -> RateLimiter:
        limiter: RateLimiter
        if request.param == "redis":
            limiter = RedisRateLimiter.from_url(REDIS_URL, prefix=prefix, **options)
        elif request.param == "failover":  # the healthy contract: no trip on a slow machine
            shared = RedisRateLimiter.from_url(REDIS_URL, prefix=prefix, timeout_s=5.0, **options)
            limiter = FailoverRateLimiter(shared, clock=options.get("clock", time.monotonic))
        else:
            limiter = InMemoryRateLimiter(**options)
        made.append(limiter)
        return limiter

    yield make
    for limiter in made:
        await limiter.aclose()
    if request.param != "memory":
        _delete_prefix(prefix)


async def _attempt(coro: Awaitable[Any]) -> Any:
    """The result, or the LimitExceeded raised instead."""
    try:
        return await coro
    except LimitExceeded as error:
        return error


# --- bursts cannot overrun a limit ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_burst_of_200_against_rpm_50_admits_exactly_50(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter()
    limits = Limits(rpm=50)
    outcomes = await asyncio.gather(
        *(_attempt(limiter.reserve("t", limits, 10)) for _ in range(200))
    )
    rejected = [o for o in outcomes if isinstance(o, LimitExceeded)]
    assert len(outcomes) - len(rejected) == 50
    assert {e.reason for e in rejected} == {RejectReason.RATE_LIMIT_RPM}
    assert all(e.retry_after_s is not None and 0 < e.retry_after_s <= 60 for e in rejected)
    assert (await limiter.usage("t")).requests == 50


@pytest.mark.asyncio
async def test_burst_against_tpm_admits_floor_of_budget(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter()
    limits = Limits(tpm=10_000)
    outcomes = await asyncio.gather(
        *(_attempt(limiter.reserve("t", limits, 300)) for _ in range(200))
    )
    rejected = [o for o in outcomes if isinstance(o, LimitExceeded)]
    assert len(outcomes) - len(rejected) == 10_000 // 300 == 33
    assert {e.reason for e in rejected} == {RejectReason.RATE_LIMIT_TPM}
    assert (await limiter.usage("t")).tokens == 33 * 300


@pytest.mark.asyncio
async def test_concurrency_never_exceeded_under_random_workload(make_limiter: MakeLimiter) -> None:
    """40 workers take and give back slots after seeded random numbers of event-loop yields.
    No slot is given back before the limit has been reached and a request refused (so both
    happen in every interleaving, whatever Redis's latency); after that, holds are random and
    the limit must hold in whichever order the workers run."""
    limiter = make_limiter()
    limits = Limits(max_concurrency=5)
    rng = random.Random(7)
    contended = asyncio.Event()  # the limit was reached and a request refused
    holding = 0
    peak = 0
    rejections = 0

    async def yields(most: int) -> None:
        for _ in range(rng.randrange(most + 1)):
            await asyncio.sleep(0)

    def note() -> None:
        if peak == limits.max_concurrency and rejections:
            contended.set()

    async def worker() -> None:
        nonlocal holding, peak, rejections
        for _ in range(6):
            await yields(3)
            try:
                reservation = await limiter.reserve("t", limits, 1)
            except LimitExceeded as error:
                assert error.reason is RejectReason.CONCURRENCY
                rejections += 1
                note()
                continue
            holding += 1
            peak = max(peak, holding)
            note()
            await contended.wait()
            await yields(5)
            holding -= 1
            if rng.random() < 0.5:
                await limiter.reconcile(reservation, 1)
            else:
                await limiter.release(reservation)

    await asyncio.gather(*(worker() for _ in range(40)))
    assert peak == 5  # reached, never passed
    assert rejections > 0
    assert (await limiter.usage("t")).in_flight == 0


# --- reconcile and release -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_reconcile_returns_unused_tokens(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter()
    limits = Limits(tpm=1000)
    first = await limiter.reserve("t", limits, 800)
    with pytest.raises(LimitExceeded) as refused:
        await limiter.reserve("t", limits, 400)
    assert refused.value.reason is RejectReason.RATE_LIMIT_TPM
    await limiter.reconcile(first, 200)
    await limiter.reconcile(first, 200)  # idempotent
    second = await limiter.reserve("t", limits, 400)
    assert second.tokens == 400
    assert (await limiter.usage("t")).tokens == 600


@pytest.mark.asyncio
async def test_reconcile_can_count_more_than_reserved(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter()
    limits = Limits(tpm=1000)
    reservation = await limiter.reserve("t", limits, 100)
    await limiter.reconcile(reservation, 950)
    with pytest.raises(LimitExceeded):
        await limiter.reserve("t", limits, 100)


@pytest.mark.asyncio
async def test_release_frees_slot_keeps_request_counts_consumed(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter()
    limits = Limits(rpm=10, tpm=1000, max_concurrency=1)
    reservation = await limiter.reserve("t", limits, 700)
    with pytest.raises(LimitExceeded) as busy:
        await limiter.reserve("t", limits, 10)
    assert busy.value.reason is RejectReason.CONCURRENCY
    await limiter.release(reservation, consumed_tokens=50)
    usage = await limiter.usage("t")
    assert (usage.requests, usage.tokens, usage.in_flight) == (1, 50, 0)
    await limiter.reserve("t", limits, 900)


@pytest.mark.asyncio
async def test_tenants_are_independent(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter()
    limits = Limits(rpm=1)
    await limiter.reserve("a", limits, 1)
    with pytest.raises(LimitExceeded):
        await limiter.reserve("a", limits, 1)
    await limiter.reserve("b", limits, 1)
    await limiter.reserve("{a}", limits, 1)  # braces cannot alias another tenant's keys


# --- windows, retry-after, leak safety (injected clock) -------------------------------------


@pytest.mark.asyncio
async def test_rpm_window_slides_and_retry_after_is_exact(make_limiter: MakeLimiter) -> None:
    clock = FakeClock()
    limiter = make_limiter(clock=clock)
    limits = Limits(rpm=3)
    for offset in (0.0, 10.0, 20.0):
        clock.now = 1000.0 + offset
        await limiter.reserve("t", limits, 0)
    clock.now = 1030.0
    with pytest.raises(LimitExceeded) as refused:
        await limiter.reserve("t", limits, 0)
    assert refused.value.retry_after_s == pytest.approx(30.0)
    assert refused.value.headers() == {
        REJECT_REASON_HEADER: "rate_limit_rpm",
        RETRY_AFTER_HEADER: "30",
    }
    clock.now = 1059.999
    with pytest.raises(LimitExceeded):
        await limiter.reserve("t", limits, 0)
    clock.now = 1060.0  # the first request leaves the window
    await limiter.reserve("t", limits, 0)
    assert (await limiter.usage("t")).requests == 3


@pytest.mark.asyncio
async def test_tpm_retry_after_waits_for_enough_old_tokens(make_limiter: MakeLimiter) -> None:
    clock = FakeClock()
    limiter = make_limiter(clock=clock)
    limits = Limits(tpm=1000)
    await limiter.reserve("t", limits, 400)
    clock.now += 10
    await limiter.reserve("t", limits, 400)
    clock.now += 10
    with pytest.raises(LimitExceeded) as one_entry:
        await limiter.reserve("t", limits, 500)  # needs the first 400 gone: at 1060
    assert one_entry.value.retry_after_s == pytest.approx(40.0)
    with pytest.raises(LimitExceeded) as two_entries:
        await limiter.reserve("t", limits, 700)  # needs both gone: at 1070
    assert two_entries.value.retry_after_s == pytest.approx(50.0)
    clock.now += 40
    await limiter.reserve("t", limits, 500)


@pytest.mark.asyncio
async def test_request_larger_than_tpm_has_no_retry_after(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter()
    with pytest.raises(LimitExceeded) as refused:
        await limiter.reserve("t", Limits(rpm=5, tpm=100), 101)
    assert refused.value.reason is RejectReason.RATE_LIMIT_TPM
    assert refused.value.retry_after_s is None
    assert refused.value.headers() == {REJECT_REASON_HEADER: "rate_limit_tpm"}
    assert (await limiter.usage("t")).requests == 0  # nothing taken


@pytest.mark.asyncio
async def test_crashed_holder_slot_is_reclaimed_after_ttl(make_limiter: MakeLimiter) -> None:
    clock = FakeClock()
    limiter = make_limiter(clock=clock, slot_ttl_s=30.0)
    limits = Limits(max_concurrency=1)
    leaked = await limiter.reserve("t", limits, 0)
    assert leaked.expires_at_s == pytest.approx(clock.now + 30.0)
    clock.now += 29.0
    with pytest.raises(LimitExceeded) as busy:
        await limiter.reserve("t", limits, 0)
    assert busy.value.reason is RejectReason.CONCURRENCY
    assert busy.value.retry_after_s == limiter.concurrency_retry_after_s
    clock.now += 1.0
    await limiter.reserve("t", limits, 0)


@pytest.mark.asyncio
async def test_rpm_checked_before_tpm_before_concurrency(make_limiter: MakeLimiter) -> None:
    limiter = make_limiter()
    await limiter.reserve("t", Limits(rpm=100), 60)  # holds a slot, 1 request, 60 tokens
    cases = [
        (Limits(rpm=1, tpm=100, max_concurrency=1), 60, RejectReason.RATE_LIMIT_RPM),
        (Limits(rpm=2, tpm=100, max_concurrency=1), 60, RejectReason.RATE_LIMIT_TPM),
        (Limits(rpm=2, tpm=100, max_concurrency=1), 10, RejectReason.CONCURRENCY),
        (Limits(rpm=1, tpm=10, max_concurrency=1), 20, RejectReason.RATE_LIMIT_TPM),  # too large
    ]
    for limits, tokens, reason in cases:
        with pytest.raises(LimitExceeded) as refused:
            await limiter.reserve("t", limits, tokens)
        assert refused.value.reason is reason
    assert (await limiter.usage("t")).requests == 1  # refusals take nothing


# --- the sliding log matches a reference model ----------------------------------------------

_OPS = st.lists(
    st.tuples(st.floats(0.0, 25.0), st.integers(0, 400), st.booleans()), min_size=1, max_size=30
)


async def _check_against_model(limiter: RateLimiter, clock: FakeClock, ops: Any) -> None:
    """Every decision and retry-after equals the one recomputed from the admitted history."""
    rpm, tpm, window = 4, 1000, 60.0
    limits = Limits(rpm=rpm, tpm=tpm)
    admitted: list[tuple[float, int]] = []  # (time, tokens counted)
    for step, tokens, reconcile_to_half in ops:
        clock.now += step
        now = clock.now
        live = [(t, n) for t, n in admitted if t > now - window]
        expected: RejectReason | None = None
        retry = 0.0
        if len(live) >= rpm:
            expected, retry = RejectReason.RATE_LIMIT_RPM, live[len(live) - rpm][0] + window - now
        elif sum(n for _, n in live) + tokens > tpm:
            need = sum(n for _, n in live) + tokens - tpm
            for t, n in live:
                need -= n
                if need <= 0:
                    expected, retry = RejectReason.RATE_LIMIT_TPM, t + window - now
                    break
        try:
            reservation = await limiter.reserve("t", limits, tokens)
        except LimitExceeded as error:
            assert error.reason is expected
            assert error.retry_after_s == pytest.approx(retry, abs=1e-6)
            continue
        assert expected is None
        counted = tokens // 2 if reconcile_to_half else tokens
        if reconcile_to_half:
            await limiter.reconcile(reservation, counted)
        admitted.append((now, counted))


@settings(max_examples=150, deadline=None)
@given(ops=_OPS)
def test_memory_sliding_log_matches_model(ops: Any) -> None:
    clock = FakeClock()
    asyncio.run(_check_against_model(InMemoryRateLimiter(clock=clock), clock, ops))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS)
def test_redis_sliding_log_matches_model(redis_url: str, ops: Any) -> None:
    clock = FakeClock()
    prefix = f"tiergate-test-{uuid.uuid4().hex[:12]}"

    async def run() -> None:
        limiter = RedisRateLimiter.from_url(redis_url, prefix=prefix, clock=clock)
        try:
            await _check_against_model(limiter, clock, ops)
        finally:
            await limiter.aclose()

    try:
        asyncio.run(run())
    finally:
        _delete_prefix(prefix)


# --- several gateway processes share one Redis budget ----------------------------------------


def _process_burst(
    url: str, prefix: str, attempts: int, start: Any, results: Any
) -> None:  # runs in a spawned process
    async def burst() -> int:
        # generous timeouts: this tests the shared budget, not faults (four spawned processes
        # connecting at once on a loaded CI machine can take longer than the default 0.25 s)
        limiter = RedisRateLimiter.from_url(url, prefix=prefix, timeout_s=10.0)
        try:
            outcomes = await asyncio.gather(
                *(_attempt(limiter.reserve("shared", Limits(rpm=60), 5)) for _ in range(attempts))
            )
        finally:
            await limiter.aclose()
        return sum(not isinstance(o, LimitExceeded) for o in outcomes)

    start.wait()  # all processes fire together
    results.put(asyncio.run(burst()))


def test_rpm_holds_across_processes(redis_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    processes, attempts = 4, 50
    prefix = f"tiergate-test-{uuid.uuid4().hex[:12]}"
    start = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(target=_process_burst, args=(redis_url, prefix, attempts, start, results))
        for _ in range(processes)
    ]
    try:
        for worker in workers:
            worker.start()
        admitted = [results.get(timeout=20) for _ in workers]
        for worker in workers:
            worker.join(timeout=10)
            assert worker.exitcode == 0
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
        _delete_prefix(prefix)
    assert sum(admitted) == 60
    assert len(admitted) == processes


# --- the pieces around the limiters ----------------------------------------------------------


@pytest.mark.asyncio
async def test_make_rate_limiter_picks_the_backend(redis_url: str) -> None:
    assert isinstance(make_rate_limiter(None), InMemoryRateLimiter)
    assert isinstance(make_rate_limiter("", prefix="x"), InMemoryRateLimiter)
    limiter = make_rate_limiter(
        redis_url, prefix=f"tiergate-test-{uuid.uuid4().hex[:12]}", share=3, lease_s=12.0
    )
    assert isinstance(limiter, FailoverRateLimiter)
    assert isinstance(limiter.shared, RedisRateLimiter)
    assert (limiter.share, limiter.slot_ttl_s, limiter.renew_every_s) == (3, 12.0, 4.0)
    assert limiter.mode == "redis"
    assert make_rate_limiter(None).mode == "local"
    await limiter.aclose()


@pytest.mark.parametrize("field", ["rpm", "tpm", "max_concurrency"])
@pytest.mark.parametrize("value", [0, -3, True])
def test_limits_reject_non_positive_values(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})


def test_reject_reasons_map_to_status_codes() -> None:
    codes = {reason.value: reason.status_code for reason in RejectReason}
    assert codes == {
        "rate_limit_rpm": 429,
        "rate_limit_tpm": 429,
        "concurrency": 429,
        "queue_full": 429,
        "budget_exceeded": 429,
        "queue_ttl": 503,
        "slo_infeasible": 503,
        "slo_unattainable": 503,
        "slo_declined": 503,
    }
    assert LimitExceeded(RejectReason.RATE_LIMIT_RPM, 0.2, "x").headers()[RETRY_AFTER_HEADER] == "1"
    assert (
        LimitExceeded(RejectReason.RATE_LIMIT_RPM, 2.01, "x").headers()[RETRY_AFTER_HEADER] == "3"
    )


@pytest.mark.asyncio
async def test_negative_token_counts_are_refused() -> None:
    limiter = InMemoryRateLimiter()
    with pytest.raises(ValueError):
        await limiter.reserve("t", Limits(), -1)
    reservation = await limiter.reserve("t", Limits(), 1)
    with pytest.raises(ValueError):
        await limiter.reconcile(reservation, -5)


@pytest.mark.asyncio
async def test_script_falls_back_to_eval_when_the_server_lacks_it(redis_url: str) -> None:
    from gateway.limits.redis import _Script

    script = _Script(f"return tonumber(ARGV[1]) + 1 -- {uuid.uuid4().hex}")  # unknown to Redis
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert await client.script_exists(script.sha) == [False]
        assert await script(client, [], ["41"]) == 42  # EVALSHA fails, EVAL runs and caches it
        assert await client.script_exists(script.sha) == [True]
        assert await script(client, [], ["1"]) == 2
    finally:
        await client.aclose()


# --- Redis goes away: degraded mode, recovery, leases (FailoverRateLimiter) ------------------


class FlakyRedis(RedisRateLimiter):
    """A Redis limiter whose link can be cut (every call fails as a dropped connection does)
    and whose server can "restart empty" (keys gone, new run id), to drive the failover."""

    down = False
    run_id = "first"
    calls = 0
    gate: asyncio.Event | None = None  # set: reserve calls wait for it (Redis slow to answer)

    def _call(self) -> None:
        self.calls += 1
        if self.down:
            raise redis.exceptions.ConnectionError("connection cut by the test")

    lose_reply = False  # set: the script runs in Redis, its answer never arrives

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        self._call()
        if self.gate is not None:
            await self.gate.wait()
        reservation = await super().reserve(*args, **kwargs)
        if self.lose_reply:
            raise redis.exceptions.TimeoutError("the answer was lost")
        return reservation

    async def reconcile(self, *args: Any, **kwargs: Any) -> Any:
        self._call()
        return await super().reconcile(*args, **kwargs)

    async def usage(self, tenant: str) -> Any:
        self._call()
        return await super().usage(tenant)

    async def renew(self, *args: Any, **kwargs: Any) -> Any:
        self._call()
        return await super().renew(*args, **kwargs)

    async def reseed(self, *args: Any, **kwargs: Any) -> Any:
        self._call()
        return await super().reseed(*args, **kwargs)

    async def ping(self) -> None:
        self._call()
        await super().ping()

    async def server_id(self) -> str:
        self._call()
        return self.run_id

    def restart_empty(self, prefix: str) -> None:
        _delete_prefix(prefix)
        self.run_id = uuid.uuid4().hex


Failover = Callable[..., tuple[FailoverRateLimiter, FlakyRedis]]


@pytest_asyncio.fixture
async def failover(redis_url: str) -> AsyncIterator[Failover]:
    """``make(share=, clock=, **redis options)`` -> (limiter, its flaky Redis); cleaned up."""
    made: list[FailoverRateLimiter] = []
    prefix = f"tiergate-test-{uuid.uuid4().hex[:12]}"

    def make(
        *,
        share: int = 1,
        clock: Callable[[], float] = time.monotonic,
        settle_s: float = 0.0,
        **options: Any,
    ) -> tuple[FailoverRateLimiter, FlakyRedis]:
        shared = FlakyRedis.from_url(redis_url, prefix=prefix, clock=clock, **options)
        assert isinstance(shared, FlakyRedis)
        limiter = FailoverRateLimiter(
            shared, share=share, clock=clock, probe_min_s=0.01, settle_s=settle_s
        )
        made.append(limiter)
        return limiter, shared

    make.prefix = prefix  # type: ignore[attr-defined]
    yield make
    for limiter in made:
        await limiter.aclose()
    _delete_prefix(prefix)


async def _admitted(limiter: RateLimiter, tenant: str, limits: Limits, n: int) -> list[Any]:
    """Reservations taken of ``n`` sequential attempts (rejections dropped, checked as limits)."""
    taken = []
    for _ in range(n):
        outcome = await _attempt(limiter.reserve(tenant, limits, 1))
        if not isinstance(outcome, LimitExceeded):
            taken.append(outcome)
    return taken


@pytest.mark.asyncio
async def test_unlimited_tenants_never_touch_redis(failover: Failover) -> None:
    limiter, shared = failover()
    shared.down = True
    for _ in range(50):
        reservation = await limiter.reserve("free", Limits(), 10)
        await limiter.reconcile(reservation, 12)
    assert shared.calls == 0
    assert limiter.mode == "redis" and limiter.fallbacks == 0


@pytest.mark.asyncio
async def test_redis_loss_trips_once_to_this_process_share(failover: Failover) -> None:
    changes: list[bool] = []
    limiter, shared = failover(share=2)
    limiter.on_change = changes.append
    shared.down = True
    taken = await _admitted(limiter, "t", Limits(rpm=10), 20)
    assert len(taken) == 5  # 10 // 2 processes
    assert shared.calls == 1  # the first failure trips: no request waits on Redis after it
    assert limiter.mode == "degraded-local" and limiter.degraded
    assert changes == [True] and limiter.fallbacks == 1
    with pytest.raises(LimitExceeded) as refused:
        await limiter.reserve("t", Limits(rpm=10), 1)
    assert refused.value.reason is RejectReason.RATE_LIMIT_RPM
    assert refused.value.retry_after_s is not None


@pytest.mark.asyncio
async def test_calls_still_out_at_the_trip_count_against_the_share(failover: Failover) -> None:
    limiter, shared = failover()
    shared.gate = asyncio.Event()
    slow = [asyncio.ensure_future(limiter.reserve("t", Limits(rpm=5), 1)) for _ in range(5)]
    await asyncio.sleep(0)  # all five wait on Redis
    shared.down = True
    with pytest.raises(LimitExceeded) as refused:  # trips; the five may still be admitted
        await limiter.reserve("t", Limits(rpm=5), 1)
    assert refused.value.reason is RejectReason.RATE_LIMIT_RPM
    shared.down = False
    shared.gate.set()
    assert len(await asyncio.gather(*slow)) == 5  # admitted by Redis: 5 in all, not 6
    assert (await limiter.local.usage("t")).requests == 5


@pytest.mark.asyncio
async def test_admissions_before_the_outage_count_against_the_share(failover: Failover) -> None:
    limiter, shared = failover(share=2)
    assert len(await _admitted(limiter, "t", Limits(rpm=10), 3)) == 3  # through Redis
    shared.down = True
    assert len(await _admitted(limiter, "t", Limits(rpm=10), 10)) == 2  # 5 - 3 already here


@pytest.mark.asyncio
async def test_what_the_fleet_had_left_caps_the_degraded_share(failover: Failover) -> None:
    """Another process took more than its share before the outage: this one may not add its
    whole share on top, only its part of what Redis showed was left."""
    busy, _ = failover(share=2)
    quiet, shared = failover(share=2)
    limits = Limits(rpm=10, tpm=100)
    assert len(await _admitted(busy, "t", limits, 6)) == 6
    assert len(await _admitted(quiet, "t", limits, 2)) == 2  # sees 8 of 10 taken
    shared.down = True
    with_share_only = 5 - 2
    taken = await _admitted(quiet, "t", limits, 5)
    assert len(taken) == 1 < with_share_only  # (10 - 8) // 2
    with pytest.raises(LimitExceeded) as refused:
        await quiet.reserve("t", limits, 1)
    assert refused.value.reason is RejectReason.RATE_LIMIT_RPM
    assert 0 < (refused.value.retry_after_s or 0) <= 60.0  # when that window has passed


@pytest.mark.asyncio
async def test_switching_back_waits_for_the_others_to_reseed(failover: Failover) -> None:
    clock = FakeClock()
    limiter, shared = failover(clock=clock, settle_s=4.0)
    await limiter.reserve("t", Limits(rpm=10), 1)
    shared.down = True
    await limiter.reserve("t", Limits(rpm=10), 1)
    shared.restart_empty(failover.prefix)  # type: ignore[attr-defined]
    shared.down = False
    assert not await limiter.probe()  # answers: re-seeded, but still settling
    assert limiter.mode == "degraded-local"
    assert (await shared.usage("t")).requests == 2
    clock.now += 4.0
    assert await limiter.probe()
    assert limiter.mode == "redis"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("limits", "tokens", "reason"),
    [
        (Limits(max_concurrency=3), 1, RejectReason.CONCURRENCY),  # 3 // 4 == 0
        (Limits(rpm=2), 1, RejectReason.RATE_LIMIT_RPM),
        (Limits(tpm=1000), 300, RejectReason.RATE_LIMIT_TPM),  # fits 1000, not 1000 // 4
    ],
)
async def test_a_share_too_small_is_refused_until_redis_returns(
    failover: Failover, limits: Limits, tokens: int, reason: RejectReason
) -> None:
    limiter, shared = failover(share=4)
    shared.down = True
    with pytest.raises(LimitExceeded) as refused:
        await limiter.reserve("t", limits, tokens)
    assert refused.value.reason is reason
    assert refused.value.status_code == 429
    assert refused.value.retry_after_s == limiter.probe_max_s
    assert "briefly unavailable" in refused.value.message


@pytest.mark.asyncio
async def test_recovery_reseeds_an_emptied_redis_and_replays_releases(
    failover: Failover,
) -> None:
    clock = FakeClock()
    limiter, shared = failover(share=2, clock=clock)
    limits = Limits(rpm=10, tpm=1000, max_concurrency=10)
    before = [await limiter.reserve("t", limits, 10) for _ in range(4)]
    await limiter.reconcile(before[0], 7)
    await limiter.reconcile(before[1], 7)
    clock.now += 5.0
    shared.down = True
    during = await limiter.reserve("t", limits, 10)  # degraded: local share
    await limiter.release(before[2], 3)  # Redis misses this release: queued
    assert limiter.degraded
    shared.restart_empty(failover.prefix)  # type: ignore[attr-defined]
    shared.down = False
    assert await limiter.probe()
    assert limiter.mode == "redis"
    usage = await shared.usage("t")
    # 4 before + 1 during; slots: before[3] and `during`; tokens 7 + 7 + 3 + 10 + 10
    assert usage == Usage(5, 37, 2)
    assert len(await _admitted(limiter, "t", limits, 10)) == 5  # the window survived: 10 in all
    await limiter.reconcile(during, 10)
    assert (await shared.usage("t")).in_flight == 6


@pytest.mark.asyncio
async def test_an_emptied_window_is_noticed_on_the_next_reserve(failover: Failover) -> None:
    limiter, shared = failover()
    assert len(await _admitted(limiter, "t", Limits(rpm=10), 6)) == 6
    shared.restart_empty(failover.prefix)  # type: ignore[attr-defined]  # no error in between
    assert len(await _admitted(limiter, "t", Limits(rpm=10), 10)) == 4
    assert (await shared.usage("t")).requests == 10
    assert limiter.fallbacks == 0


@pytest.mark.asyncio
async def test_heartbeat_reseeds_after_a_restart_seen_by_run_id(failover: Failover) -> None:
    limiter, shared = failover()
    held = [await limiter.reserve("t", Limits(max_concurrency=5), 2) for _ in range(3)]
    await limiter.heartbeat()  # learns the run id
    shared.restart_empty(failover.prefix)  # type: ignore[attr-defined]
    await limiter.heartbeat()
    assert await shared.usage("t") == Usage(3, 6, 3)
    for reservation in held:
        await limiter.reconcile(reservation, 2)
    assert (await shared.usage("t")).in_flight == 0


@pytest.mark.asyncio
async def test_heartbeat_keeps_live_leases_and_a_dead_process_frees_them(
    failover: Failover,
) -> None:
    clock = FakeClock()
    alive, _ = failover(clock=clock, slot_ttl_s=30.0)
    dead, _ = failover(clock=clock, slot_ttl_s=30.0)  # a second process sharing the prefix
    limits = Limits(max_concurrency=2)
    await alive.reserve("t", limits, 0)
    await dead.reserve("t", limits, 0)
    for _ in range(3):  # 75 s: far past the lease, renewed by `alive` only
        clock.now += 25.0
        await alive.heartbeat()
    usage = await alive.shared.usage("t")
    assert usage.in_flight == 1  # the dead process's slot expired within its 30 s lease
    await alive.reserve("t", limits, 0)
    with pytest.raises(LimitExceeded) as busy:
        await alive.reserve("t", limits, 0)
    assert busy.value.reason is RejectReason.CONCURRENCY


@pytest.mark.asyncio
async def test_a_reserve_that_ran_but_timed_out_is_counted_once_and_freed(
    failover: Failover,
) -> None:
    """A frozen Redis runs the calls it queued when it resumes: the one served locally instead
    has the same id, so it is counted once and its lease freed, not left for its TTL."""
    limiter, shared = failover()
    shared.lose_reply = True
    reservation = await limiter.reserve("t", Limits(rpm=5, max_concurrency=5), 3)
    assert limiter.degraded  # served locally, under the id Redis also took
    assert (await shared.usage("t")) == Usage(1, 3, 1)
    await limiter.reconcile(reservation, 2)
    shared.lose_reply = False
    assert await limiter.probe()
    assert await shared.usage("t") == Usage(1, 2, 0)


@pytest.mark.asyncio
async def test_a_release_redis_missed_is_replayed_when_it_answers(failover: Failover) -> None:
    limiter, shared = failover()
    reservation = await limiter.reserve("t", Limits(max_concurrency=1), 5)
    shared.down = True
    await limiter.reconcile(reservation, 4)  # fails in Redis: queued, never raised
    assert limiter.degraded
    shared.down = False
    assert (await shared.usage("t")).in_flight == 1  # Redis still holds the lease
    assert await limiter.probe()
    assert await shared.usage("t") == Usage(1, 4, 0)


@pytest.mark.asyncio
async def test_the_background_task_switches_back_when_redis_answers(failover: Failover) -> None:
    limiter, shared = failover(share=2)
    switched: asyncio.Queue[bool] = asyncio.Queue()
    limiter.on_change = switched.put_nowait
    shared.down = True
    await limiter.reserve("t", Limits(rpm=10), 1)
    assert await asyncio.wait_for(switched.get(), 10) is True
    shared.down = False
    assert await asyncio.wait_for(switched.get(), 10) is False
    assert limiter.mode == "redis"
    assert (await shared.usage("t")).requests == 1  # the degraded admission was re-seeded


@pytest.mark.asyncio
async def test_an_unreachable_redis_serves_from_the_share_never_raises() -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    limiter = make_rate_limiter(f"redis://127.0.0.1:{port}/0", share=1)
    try:
        reservation = await limiter.reserve("t", Limits(rpm=2), 1)
        assert limiter.mode == "degraded-local"
        await limiter.reconcile(reservation, 1)
        assert (await limiter.usage("t")).requests == 1
    finally:
        await limiter.aclose()


@pytest.mark.asyncio
async def test_a_retried_reserve_script_counts_once(redis_url: str) -> None:
    """The connection retry may resend a script Redis already ran: same id, same result."""
    from gateway.limits.redis import _RESERVE_SCRIPT

    prefix = f"tiergate-test-{uuid.uuid4().hex[:12]}"
    limiter = RedisRateLimiter.from_url(redis_url, prefix=prefix)
    try:
        args = ["", "60.0", "5", "", "", "7", "30.0", "same-id", "0"]
        first = await _RESERVE_SCRIPT(limiter._client, limiter.keys("t"), args)
        again = await _RESERVE_SCRIPT(limiter._client, limiter.keys("t"), args)
        assert int(first[0]) == int(again[0]) == 1 and float(first[1]) == float(again[1])
        assert await limiter.usage("t") == Usage(1, 7, 1)
    finally:
        await limiter.aclose()
        _delete_prefix(prefix)
