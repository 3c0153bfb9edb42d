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
    InMemoryRateLimiter,
    LimitExceeded,
    Limits,
    RateLimiter,
    RedisRateLimiter,
    RejectReason,
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


@pytest_asyncio.fixture(params=["memory", "redis"])
async def make_limiter(request: pytest.FixtureRequest) -> AsyncIterator[MakeLimiter]:
    """A factory of limiters of one kind; Redis ones get a fresh key prefix, cleaned up after."""
    made: list[RateLimiter] = []
    prefix = f"tiergate-test-{uuid.uuid4().hex[:12]}"
    if request.param == "redis":
        request.getfixturevalue("redis_url")

    def make(**options: Any) -> RateLimiter:
        limiter: RateLimiter
        if request.param == "redis":
            limiter = RedisRateLimiter.from_url(REDIS_URL, prefix=prefix, **options)
        else:
            limiter = InMemoryRateLimiter(**options)
        made.append(limiter)
        return limiter

    yield make
    for limiter in made:
        await limiter.aclose()
    if request.param == "redis":
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
    await limiter.reserve("t", Limits(), 60)  # holds a slot, 1 request, 60 tokens
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
        limiter = RedisRateLimiter.from_url(url, prefix=prefix)
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
    limiter = make_rate_limiter(redis_url, prefix=f"tiergate-test-{uuid.uuid4().hex[:12]}")
    assert isinstance(limiter, RedisRateLimiter)
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
        "queue_ttl": 503,
        "slo_infeasible": 503,
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
