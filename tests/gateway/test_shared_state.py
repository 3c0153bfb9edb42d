"""What the workers of ``tiergate serve --workers N`` share without Redis
(:mod:`gateway.app.shared_state`): workflows and the tenant limits below N, seen alike by every
worker, in real separate processes; and a lock that a killed holder does not keep."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app.shared_state import SharedFile, SharedState
from gateway.app.ui.sessions import SignInLimiter
from gateway.app.workflows import (
    SHARED_BUCKETS,
    SHARED_TABLE_BYTES,
    SHARED_WAYS,
    SharedWorkflowStore,
    WorkflowExpired,
    WorkflowUnknown,
)
from gateway.limits import InMemoryRateLimiter, LimitExceeded, Limits, RejectReason
from gateway.limits.shared import SharedLimitTable
from gateway.worker_limits import WorkerShareLimiter

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def state() -> Iterator[SharedState]:
    shared = SharedState.create(2)
    try:
        yield shared
    finally:
        shared.close()


def _in_another_process(state: SharedState, code: str) -> str:
    """Run ``code`` in a fresh Python attached to ``state`` as worker slot 1; its stdout."""
    program = textwrap.dedent(
        f"""
        import asyncio
        from gateway.app import shared_state
        state = shared_state.join({str(state.directory)!r}, 2, 1)
        """
    ) + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# ---- workflows ----------------------------------------------------------------------------------


def test_a_workflow_made_by_one_worker_is_joined_by_another(state: SharedState) -> None:
    mine = SharedWorkflowStore(state.workflows)
    first = asyncio.run(mine.join("7:wf", 60_000.0))
    assert (first.stage, first.created) == (0, True)
    stages = _in_another_process(
        state,
        """
        from gateway.app.workflows import SharedWorkflowStore
        store = SharedWorkflowStore(state.workflows)
        calls = [asyncio.run(store.join("7:wf", None)) for _ in range(3)]
        print(",".join(f"{c.stage}:{c.created}:{c.deadline_ms:.0f}" for c in calls))
        """,
    )
    assert stages == "1:False:60000,2:False:60000,3:False:60000"
    assert asyncio.run(mine.join("7:wf", None)).stage == 4  # one counter for both
    with pytest.raises(WorkflowUnknown):
        asyncio.run(mine.join("8:wf", None))  # ids are per tenant


def test_the_shared_store_expires_and_forgets_like_the_memory_one() -> None:
    clock = Clock()
    table = SharedFile.private(SHARED_TABLE_BYTES)
    store = SharedWorkflowStore(table, ttl_s=60.0, clock=clock)

    async def scenario() -> None:
        first = await store.join("1:w", 10_000.0)
        assert (first.stage, first.created, first.remaining_ms) == (0, True, 10_000.0)
        clock.t += 4.0
        second = await store.join("1:w", 99_000.0)  # a later deadline header is ignored
        assert (second.stage, second.deadline_ms) == (1, 10_000.0)
        assert second.remaining_ms == pytest.approx(6_000.0)
        clock.t += 6.5
        with pytest.raises(WorkflowExpired) as info:
            await store.join("1:w", None)
        assert info.value.late_ms == pytest.approx(500.0)
        clock.t += 60.0  # past the TTL after the deadline: forgotten
        with pytest.raises(WorkflowUnknown):
            await store.join("1:w", None)
        assert (await store.join("1:w", 1_000.0)).created

    asyncio.run(scenario())
    table.close()


def test_a_full_bucket_drops_the_workflow_that_expires_first() -> None:
    clock = Clock()
    table = SharedFile.private(SHARED_TABLE_BYTES)
    store = SharedWorkflowStore(table, ttl_s=1.0, clock=clock)
    # keys that share one bucket, found by hashing until a bucket has one more than it holds
    from gateway.app import workflows

    by_bucket: dict[int, list[str]] = {}
    i = 0
    while True:
        key = f"1:w{i}"
        digest = workflows.hashlib.blake2b(key.encode(), digest_size=16).digest()
        bucket = int.from_bytes(digest[:8], "little") % SHARED_BUCKETS
        by_bucket.setdefault(bucket, []).append(key)
        if len(by_bucket[bucket]) == SHARED_WAYS + 1:
            break
        i += 1
    keys = by_bucket[bucket]

    async def scenario() -> None:
        for n, key in enumerate(keys):
            await store.join(key, 1_000.0 + n)  # the first key expires first
        assert store.evicted == 1
        with pytest.raises(WorkflowUnknown):
            await store.join(keys[0], None)
        for key in keys[1:]:
            assert (await store.join(key, None)).stage == 1

    asyncio.run(scenario())
    table.close()


def test_a_holder_killed_inside_the_lock_does_not_keep_it(state: SharedState) -> None:
    code = """
        import os, signal
        with state.workflows.locked():
            os.kill(os.getpid(), signal.SIGKILL)
        """
    program = (
        "from gateway.app import shared_state\n"
        f"state = shared_state.join({str(state.directory)!r}, 2, 1)\n" + textwrap.dedent(code)
    )
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, timeout=60)
    assert done.returncode == -9
    # the lock is free again: another process takes it (bounded against a hang, no timing)
    assert _in_another_process(state, "with state.workflows.locked():\n    print('taken')") == (
        "taken"
    )
    with state.workflows.locked():
        pass


# ---- limits below the number of workers --------------------------------------------------------


def _workers(state: SharedState, clock: Clock) -> list[WorkerShareLimiter]:
    """Two workers' limiters over one shared table (slots 0 and 1)."""
    return [
        WorkerShareLimiter(
            InMemoryRateLimiter(clock=clock),
            2,
            table=SharedLimitTable(state.limits, 2, slot=slot, clock=clock),
        )
        for slot in (0, 1)
    ]


def test_a_limit_below_the_worker_count_is_not_multiplied(state: SharedState) -> None:
    clock = Clock()
    a, b = _workers(state, clock)

    async def scenario() -> None:
        await a.reserve("t", Limits(rpm=1), 10)
        with pytest.raises(LimitExceeded) as refused:
            await b.reserve("t", Limits(rpm=1), 10)
        assert refused.value.reason is RejectReason.RATE_LIMIT_RPM
        message = refused.value.message
        assert "limit of 1 requests per minute" in message and "across the 2" in message
        assert refused.value.retry_after_s == pytest.approx(60.0)
        clock.t += 60.0
        await b.reserve("t", Limits(rpm=1), 10)  # the window moved on

        held = await a.reserve("c", Limits(max_concurrency=1), 10)
        with pytest.raises(LimitExceeded) as busy:
            await b.reserve("c", Limits(max_concurrency=1), 10)
        assert busy.value.reason is RejectReason.CONCURRENCY
        await a.reconcile(held, 12)
        again = await b.reserve("c", Limits(max_concurrency=1), 10)
        # a worker that exits frees the slots it held (its supervisor says so)
        state.worker_exited(1)
        await a.reserve("c", Limits(max_concurrency=1), 10)
        await b.release(again)  # late, after the exit: harmless

    asyncio.run(scenario())


def test_limits_of_at_least_n_are_shared_out_and_the_refusal_says_the_real_share(
    state: SharedState,
) -> None:
    clock = Clock()
    a, b = _workers(state, clock)

    async def scenario() -> None:
        limits = Limits(rpm=5, max_concurrency=1)  # rpm: 2 each; concurrency: 1 in all
        first = await a.reserve("t", limits, 1)
        with pytest.raises(LimitExceeded) as busy:
            await b.reserve("t", limits, 1)
        assert busy.value.reason is RejectReason.CONCURRENCY
        await a.reconcile(first, 1)
        second = await a.reserve("t", limits, 1)
        await a.reconcile(second, 1)
        with pytest.raises(LimitExceeded) as refused:
            await a.reserve("t", limits, 1)  # a's share of 5 is 2
        message = refused.value.message
        assert "share, 2 of the tenant's 5 requests per minute" in message, message
        third = await b.reserve("t", limits, 1)  # b has its own 2
        await b.reconcile(third, 1)
        # refused by its share, the request takes nothing from the shared table either
        extra = await b.reserve("t", limits, 1)
        await b.reconcile(extra, 1)
        with pytest.raises(LimitExceeded):
            await b.reserve("t", limits, 1)
        assert (await a.usage("t")).in_flight == 0
        # refused by its TPM share (10 // 2 = 5), a request leaves no trace in the shared RPM
        small_rpm = Limits(rpm=1, tpm=10)
        with pytest.raises(LimitExceeded) as too_big:
            await a.reserve("u", small_rpm, 6)
        assert too_big.value.reason is RejectReason.RATE_LIMIT_TPM
        await b.reserve("u", small_rpm, 5)  # the tenant's one request a minute is still free

    asyncio.run(scenario())


def test_small_limits_hold_across_real_processes(state: SharedState) -> None:
    limiter = WorkerShareLimiter(
        InMemoryRateLimiter(), 2, table=SharedLimitTable(state.limits, 2, slot=0)
    )
    asyncio.run(limiter.reserve("t", Limits(tpm=1), 1))
    refused = _in_another_process(
        state,
        """
        from gateway.limits import InMemoryRateLimiter, LimitExceeded, Limits
        from gateway.limits.shared import SharedLimitTable
        from gateway.worker_limits import WorkerShareLimiter
        limiter = WorkerShareLimiter(
            InMemoryRateLimiter(), 2, table=SharedLimitTable(state.limits, 2, slot=1)
        )
        try:
            asyncio.run(limiter.reserve("t", Limits(tpm=1), 1))
            print("admitted")
        except LimitExceeded as exc:
            print(exc.reason.value)
        """,
    )
    assert refused == "rate_limit_tpm"


# ---- the dashboard's failed sign-ins --------------------------------------------------------


def test_failed_sign_ins_are_seen_by_every_worker(state: SharedState) -> None:
    at = 5_000.0  # explicit times: each process reads the table at the moment given
    mine = SignInLimiter(table=state.signin)
    mine.failed("10.0.0.1", "tgop-stale", guessable=False, now=at)
    assert mine.retry_after("10.0.0.1", "tgop-stale", now=at) == pytest.approx(1.0)
    answer = _in_another_process(
        state,
        f"""
        from gateway.app.ui.sessions import SignInLimiter
        limiter = SignInLimiter(table=state.signin)
        # the value that failed on the other worker backs off here too; others do not
        print(limiter.retry_after("10.0.0.1", "tgop-stale", now={at} + 0.5),
              limiter.retry_after("10.0.0.1", "tgop-right", now={at} + 0.5))
        for n in range(10):
            limiter.failed("10.0.0.2", f"guess-{{n}}", guessable=True, now={at} + n)
        """,
    )
    assert answer == "0.5 None"
    # ten guesses of a short admin key on the other worker: this one refuses the next
    assert mine.retry_after("10.0.0.2", "guess-x", guessable=True, now=at + 10) == 50.0
    assert mine.retry_after("10.0.0.2", "tgop-right", now=at + 10) is None


def test_the_supervisor_removes_its_tables() -> None:
    shared = SharedState.create(2)
    directory = shared.directory
    assert sorted(os.listdir(directory)) == ["limits", "signin", "workflows"]
    shared.close()
    assert not directory.exists()
