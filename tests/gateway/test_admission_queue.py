"""The gain-ordered admission queue: order, TTL, bounded size, cancellation, and no starvation."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.limits import (
    REJECT_REASON_HEADER,
    AdmissionQueue,
    Backlog,
    QueueItem,
    QueueRejected,
    RejectReason,
    gain_density,
)
from priority.gain import GainWeights

INF = math.inf


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def item(
    name: str, priority: float, *, tier: str = "std", ttl_s: float = INF, aging_s: float = 1.0
) -> QueueItem:
    return QueueItem(name, tier, priority, ttl_s, aging_s)


async def settle() -> None:
    """Let every ready task run until it blocks again."""
    for _ in range(5):
        await asyncio.sleep(0)


@dataclass
class Recorder:
    """Runs requests through a queue, recording the order of admission and each refusal."""

    queue: AdmissionQueue
    clock: FakeClock | None = None
    admitted: list[str] = field(default_factory=list)
    admitted_at: list[float] = field(default_factory=list)
    refused: dict[str, QueueRejected] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def submit(self, request: QueueItem) -> asyncio.Task[None]:
        async def run() -> None:
            try:
                await self.queue.wait_for_turn(request)
            except QueueRejected as error:
                self.refused[request.request_id] = error
                return
            self.admitted.append(request.request_id)
            if self.clock is not None:
                self.admitted_at.append(self.clock())

        task = asyncio.create_task(run())
        self.tasks.append(task)
        return task

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


# --- order ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_free_capacity_admits_at_once() -> None:
    queue = AdmissionQueue(max_in_flight=2, max_queued=1)
    await queue.wait_for_turn(item("a", 1.0))
    async with queue.admit(item("b", 1.0)):
        assert (queue.in_flight, queue.queued) == (2, 0)
    assert queue.in_flight == 1


@pytest.mark.asyncio
async def test_higher_gain_request_queued_later_goes_first() -> None:
    queue = AdmissionQueue(max_in_flight=1, max_queued=10)
    rec = Recorder(queue)
    await queue.wait_for_turn(item("running", 1.0))
    for name, priority in [("low", 1.0), ("mid", 5.0), ("first-high", 9.0), ("high", 9.0)]:
        rec.submit(item(name, priority))
        await settle()
    assert rec.admitted == [] and queue.queued == 4
    for _ in range(4):
        queue.release()
        await settle()
    assert rec.admitted == ["first-high", "high", "mid", "low"]  # gain order, FIFO among ties
    await rec.close()


@pytest.mark.asyncio
async def test_growing_capacity_dispatches_waiters() -> None:
    queue = AdmissionQueue(max_in_flight=0, max_queued=10)
    rec = Recorder(queue)
    for name, priority in [("a", 1.0), ("b", 3.0), ("c", 2.0)]:
        rec.submit(item(name, priority))
    await settle()
    queue.set_max_in_flight(2)
    await settle()
    assert rec.admitted == ["b", "c"] and queue.in_flight == 2 and queue.queued == 1
    await rec.close()


# --- TTL ----------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_waiter_past_its_ttl_gets_503_queue_ttl() -> None:
    queue = AdmissionQueue(max_in_flight=1, max_queued=10, retry_after_s=2.0)
    await queue.wait_for_turn(item("running", 1.0))
    with pytest.raises(QueueRejected) as expired:
        await queue.wait_for_turn(item("late", 1.0, ttl_s=0.01))
    assert expired.value.reason is RejectReason.QUEUE_TTL
    assert expired.value.status_code == 503
    assert expired.value.headers() == {REJECT_REASON_HEADER: "queue_ttl", "retry-after": "2"}
    assert queue.queued == 0 and queue.in_flight == 1


@pytest.mark.asyncio
async def test_expired_waiter_is_never_dispatched() -> None:
    clock = FakeClock()
    queue = AdmissionQueue(max_in_flight=1, max_queued=10, clock=clock)
    rec = Recorder(queue)
    await queue.wait_for_turn(item("running", 1.0))
    rec.submit(item("short", 9.0, ttl_s=100.0))  # its event-loop timer will not fire in this test
    rec.submit(item("long", 1.0, ttl_s=1000.0))
    await settle()
    clock.now = 100.0  # the clock the queue orders by says "short" has run out
    queue.release()
    await settle()
    assert rec.admitted == ["long"]
    assert rec.refused["short"].reason is RejectReason.QUEUE_TTL
    await rec.close()


# --- bounded size -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_full_queue_refuses_a_request_not_above_its_tiers_lowest() -> None:
    queue = AdmissionQueue(max_in_flight=0, max_queued=2, retry_after_s=3.0)
    rec = Recorder(queue)
    rec.submit(item("a", 2.0))
    rec.submit(item("b", 5.0))
    await settle()
    with pytest.raises(QueueRejected) as full:
        await asyncio.wait_for(
            queue.wait_for_turn(item("c", 2.0)), 1.0
        )  # ties go to the request already waiting
    assert full.value.reason is RejectReason.QUEUE_FULL
    assert full.value.status_code == 429
    assert full.value.headers()["retry-after"] == "3"
    assert queue.queued == 2 and rec.refused == {}
    await rec.close()


@pytest.mark.asyncio
async def test_full_queue_higher_priority_displaces_the_lowest() -> None:
    queue = AdmissionQueue(max_in_flight=0, max_queued=3)
    rec = Recorder(queue)
    for name, priority in [("a", 2.0), ("b", 1.0), ("c", 1.0), ("d", 4.0)]:
        rec.submit(item(name, priority))
        await settle()
    assert set(rec.refused) == {"c"}  # the lowest; the newest of the two lowest
    assert rec.refused["c"].reason is RejectReason.QUEUE_FULL
    queue.set_max_in_flight(3)
    await settle()
    assert rec.admitted == ["d", "a", "b"]
    await rec.close()


@pytest.mark.asyncio
async def test_full_queue_takes_the_place_from_the_longest_tier() -> None:
    queue = AdmissionQueue(max_in_flight=0, max_queued=3)
    rec = Recorder(queue)
    for name, priority in [("g1", 50.0), ("g2", 40.0), ("g3", 40.0)]:
        rec.submit(item(name, priority, tier="gold"))
    await settle()
    for name in ("b1", "b2"):  # lower gain, but bronze holds fewer places than gold
        rec.submit(item(name, 1.0, tier="bronze"))
        await settle()
    assert set(rec.refused) == {"g3", "g2"}  # gold's lowest, newest first
    rec.submit(item("b3", 1.0, tier="bronze"))  # bronze is now the longest: gain decides
    rec.submit(item("b4", 2.0, tier="bronze"))
    await settle()
    assert set(rec.refused) == {"g3", "g2", "b3", "b2"}
    assert all(error.reason is RejectReason.QUEUE_FULL for error in rec.refused.values())
    queue.set_max_in_flight(3)
    await settle()
    assert rec.admitted == ["g1", "b4", "b1"]
    await rec.close()


# --- cancellation and release ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_cancelled_waiter_leaves_the_queue() -> None:
    queue = AdmissionQueue(max_in_flight=1, max_queued=10)
    rec = Recorder(queue)
    await queue.wait_for_turn(item("running", 1.0))
    gone = rec.submit(item("gone", 9.0))
    rec.submit(item("stays", 1.0))
    await settle()
    gone.cancel()
    await settle()
    assert queue.queued == 1
    queue.release()
    await settle()
    assert rec.admitted == ["stays"] and queue.in_flight == 1
    await rec.close()


@pytest.mark.asyncio
async def test_slot_granted_to_a_cancelled_waiter_is_returned() -> None:
    queue = AdmissionQueue(max_in_flight=0, max_queued=10)
    waiter = asyncio.create_task(queue.wait_for_turn(item("a", 1.0)))
    await settle()
    queue.set_max_in_flight(1)  # grants the slot ...
    waiter.cancel()  # ... and the client disconnects before the waiter runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (queue.in_flight, queue.queued) == (0, 0)


@pytest.mark.asyncio
async def test_admit_releases_on_error() -> None:
    queue = AdmissionQueue(max_in_flight=1, max_queued=1)
    with pytest.raises(RuntimeError, match="upstream"):
        async with queue.admit(item("a", 1.0)):
            raise RuntimeError("upstream failed")
    assert queue.in_flight == 0
    with pytest.raises(RuntimeError, match="without a matching"):
        queue.release()


# --- no starvation ------------------------------------------------------------------------------

MAX_QUEUED = 16
RESCUE_EVERY = 4
BOUND_DISPATCHES = RESCUE_EVERY * MAX_QUEUED  # the module's bound, after a request is overdue
STEP_S = 0.01
GOLD_AGING_S, BRONZE_AGING_S = 0.05, 0.2


@dataclass
class OverloadRun:
    arrived: dict[str, float]  # request id -> arrival (= enqueue) time
    order: list[str]  # request ids in dispatch order
    dispatched_at: list[float]
    refused: dict[str, QueueRejected]

    def dispatches_since_overdue(self, request_id: str, aging_s: float) -> int:
        """Dispatches made since ``request_id`` became overdue, up to and including its own."""
        overdue_at = self.arrived[request_id] + aging_s  # the queue's own arithmetic
        end = self.order.index(request_id) + 1 if request_id in self.order else len(self.order)
        return sum(1 for at in self.dispatched_at[:end] if at >= overdue_at)


async def _sustained_overload(rescue_every: int | None, steps: int = 300) -> OverloadRun:
    """One dispatch per step; 3 gold (high gain) arrivals per step and a bronze one every 4th."""
    clock = FakeClock()
    queue = AdmissionQueue(
        max_in_flight=1, max_queued=MAX_QUEUED, rescue_every=rescue_every, clock=clock
    )
    rec = Recorder(queue, clock)
    arrived: dict[str, float] = {}
    for step in range(steps):
        clock.now = step * STEP_S
        arrivals = [item(f"g{step}.{k}", 10.0, tier="gold", aging_s=GOLD_AGING_S) for k in range(3)]
        if step % 4 == 0:
            arrivals.append(item(f"b{step}", 1.0, tier="bronze", aging_s=BRONZE_AGING_S))
        for request in arrivals:
            arrived[request.request_id] = clock.now
            rec.submit(request)
        await settle()
        if queue.in_flight:
            queue.release()
            await settle()
    await rec.close()
    return OverloadRun(arrived, rec.admitted, rec.admitted_at, rec.refused)


@pytest.mark.asyncio
async def test_bronze_is_served_within_the_bound_under_sustained_gold_overload() -> None:
    run = await _sustained_overload(RESCUE_EVERY)
    bronze = [rid for rid in run.arrived if rid.startswith("b")]
    served = [rid for rid in run.order if rid.startswith("b")]
    queued = [rid for rid in bronze if rid not in run.refused]  # entered and never dropped
    waits = [run.dispatches_since_overdue(rid, BRONZE_AGING_S) for rid in queued]
    print(
        f"bronze: {len(bronze)} arrived, {len(served)} served, {len(run.refused)} refused "
        f"overall; worst wait after overdue {max(waits)} dispatches (bound {BOUND_DISPATCHES})"
    )
    assert len(run.refused) > len(bronze)  # it is an overload: requests are being turned away
    assert served and max(waits) <= BOUND_DISPATCHES
    assert all(rid.startswith("g") for rid in run.refused)  # bronze kept its share of the queue
    gold_share = sum(rid.startswith("g") for rid in run.order) / len(run.order)
    assert gold_share >= (RESCUE_EVERY - 1) / RESCUE_EVERY  # gain order keeps most dispatches


@pytest.mark.asyncio
async def test_without_the_rescue_lane_bronze_starves() -> None:
    run = await _sustained_overload(None)
    bronze = [rid for rid in run.arrived if rid.startswith("b")]
    assert not any(rid.startswith("b") for rid in run.order)
    worst = max(run.dispatches_since_overdue(rid, BRONZE_AGING_S) for rid in bronze)
    assert worst > BOUND_DISPATCHES


@dataclass(frozen=True)
class _Arrival:
    tier: int
    priority: int
    aging_steps: int


_STEPS = st.lists(
    st.tuples(
        st.lists(
            st.builds(_Arrival, st.integers(0, 2), st.integers(0, 9), st.integers(1, 12)),
            max_size=4,
        ),
        st.integers(0, 3),  # dispatches this step
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps=_STEPS, max_size=st.integers(1, 8), rescue_every=st.integers(1, 5))
@example(  # one low-gain request, then a high-gain arrival and a dispatch every step
    steps=[([_Arrival(0, 0, 1)], 0)] + [([_Arrival(1, 9, 5)], 1)] * 6, max_size=2, rescue_every=1
)
def test_backlog_bound_holds_for_every_queued_request(
    steps: list[tuple[list[_Arrival], int]], max_size: int, rescue_every: int
) -> None:
    """No request waits more than ``rescue_every * max_size`` dispatches once overdue, and a
    full backlog only ever drops from the tier holding the most places."""
    backlog = Backlog(max_size, rescue_every=rescue_every)
    bound = rescue_every * max_size
    overdue_at: dict[str, float] = {}  # queued request id -> when overdue
    waited: dict[str, int] = {}  # queued request id -> dispatches made since it was overdue
    for now, (arrivals, dispatches) in enumerate(steps):
        for arrival in arrivals:
            occupancy = Counter(e.item.tier for e in backlog.entries)
            new = item(
                f"r{len(waited)}",
                float(arrival.priority),
                tier=f"t{arrival.tier}",
                aging_s=float(arrival.aging_steps),
            )
            waited[new.request_id] = 0
            result = backlog.push(new, float(now))
            if result.evicted is not None:
                assert occupancy[result.evicted.item.tier] == max(occupancy.values())
                del overdue_at[result.evicted.item.request_id]
            if result.queued is not None:
                overdue_at[new.request_id] = result.queued.overdue_at_s
        for _ in range(dispatches):
            entry = backlog.pop(float(now))
            if entry is None:
                break
            for request_id, due in overdue_at.items():
                if due <= now:
                    waited[request_id] += 1
            assert waited[entry.item.request_id] <= bound
            del overdue_at[entry.item.request_id]
        assert all(waited[request_id] < bound for request_id in overdue_at)  # still within it
        assert len(backlog) <= max_size


# --- priority and items -----------------------------------------------------------------------


def test_gain_density_prefers_weightier_tiers_and_cheaper_prefills() -> None:
    weights = GainWeights(first_token=4.0, decode_token=1.0)
    assert gain_density(weights, 2.0, 0.1) == pytest.approx(80.0)
    assert gain_density(weights, 2.0, 0.1) > gain_density(weights, 1.0, 0.1)
    assert gain_density(weights, 1.0, 0.05) > gain_density(weights, 1.0, 0.1)
    assert math.isfinite(gain_density(weights, 1.0, 0.0))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"priority": math.nan},
        {"priority": math.inf},
        {"ttl_s": 0.0},
        {"aging_s": 0.0},
        {"aging_s": math.inf},
    ],
)
def test_queue_item_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    values: dict[str, Any] = {"priority": 1.0, "ttl_s": 1.0, "aging_s": 1.0} | kwargs
    with pytest.raises(ValueError):
        QueueItem("r", "t", **values)
