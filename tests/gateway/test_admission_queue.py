"""The gain-ordered admission queue: order, TTL, bounded size, cancellation, no starvation, and
what SLO-aware admission reads and sets: the measured service rate, the predicted wait, the SLO
limit on a wait, demotion and the ready-backends gate."""

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
from gateway.limits.queue import Grant, Overtakers, ServiceRate
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


# --- SLO-aware waiting: service rate, predicted wait, SLO limit, demotion, ready backends ----


def test_service_rate_counts_dispatches_per_saturated_second_only() -> None:
    rate = ServiceRate(window_s=100.0, min_observation_s=0.5)
    rate.served(1.0)  # nobody was waiting: says nothing about the service rate
    assert rate.rate(1.0) is None
    rate.saturated(10.0, True)
    assert rate.rate(10.2) is None  # too little observed
    for t in (10.5, 11.0, 11.5, 12.0):
        rate.served(t)
    assert rate.rate(12.0) == pytest.approx(2.0, rel=0.05)
    rate.saturated(12.0, False)
    rate.served(50.0)  # idle time and unsaturated dispatches do not dilute it
    assert rate.rate(60.0) == pytest.approx(2.0, rel=0.05)


def test_service_rate_follows_a_slower_service_within_its_window() -> None:
    rate = ServiceRate(window_s=2.0, min_observation_s=0.0)
    rate.saturated(0.0, True)
    t = 0.0
    for _ in range(40):  # 10 per second
        t += 0.1
        rate.served(t)
    assert rate.rate(t) == pytest.approx(10.0, rel=0.15)
    for _ in range(10):  # then 1 per second, for five windows
        t += 1.0
        rate.served(t)
    # read between dispatches, as arrivals do (just after one it reads high: an average of
    # events read at an event)
    assert rate.rate(t + 0.5) == pytest.approx(1.0, rel=0.1)


@pytest.mark.asyncio
async def test_predicted_wait_counts_who_goes_first_over_the_measured_rate() -> None:
    clock = FakeClock()
    queue = AdmissionQueue(
        max_in_flight=1, max_queued=10, clock=clock, service_rate=ServiceRate(100.0, 0.0)
    )
    assert queue.predicted_wait_s(1.0) == 0.0  # a free slot
    await queue.wait_for_turn(item("running", 1.0))
    assert queue.predicted_wait_s(1.0) is None  # full, and no rate measured yet
    rec = Recorder(queue)
    for name, priority in [("a", 5.0), ("b", 3.0), ("c", 1.0)]:
        rec.submit(item(name, priority, aging_s=100.0))  # none overdue: no rescue lane
    await settle()
    for _ in range(3):  # 2 dispatches a second while requests wait
        clock.now += 0.5
        queue.release()
        await settle()
        rec.submit(item(f"more-{clock.now}", 0.5, aging_s=100.0))
        await settle()
    assert queue.measured_rate() == pytest.approx(2.0, rel=0.05)
    first = queue.predicted_wait_s(100.0)  # nobody ahead, nobody arriving above it
    assert first == pytest.approx(1 / 2.0, rel=0.05)
    middle, last = queue.predicted_wait_s(4.0), queue.predicted_wait_s(0.75)
    assert first is not None and middle is not None and last is not None
    assert first < middle < last < math.inf
    await rec.close()


def test_overtakers_are_the_recent_arrivals_above_a_priority() -> None:
    arrivals = Overtakers(window_s=2.0)
    for t, priority in [(0.0, 5.0), (1.0, 5.0), (1.5, 1.0), (2.5, 9.0)]:
        arrivals.arrived(t, priority)
    assert arrivals.rate_above(2.0, 2.5) == pytest.approx(2 / 2.0)  # 1.0 and 2.5; 0.0 is old
    assert arrivals.rate_above(0.5, 2.5) == pytest.approx(3 / 2.0)
    assert arrivals.rate_above(9.0, 2.5) == 0.0


@pytest.mark.asyncio
async def test_predicted_wait_grows_with_higher_priority_arrivals() -> None:
    """A priority queue's wait: requests of higher priority that keep arriving go first too;
    when they alone take the whole service rate, a lower one waits forever."""
    clock = FakeClock()
    queue = AdmissionQueue(
        max_in_flight=1, max_queued=100, clock=clock, service_rate=ServiceRate(100.0, 0.0)
    )
    rec = Recorder(queue)
    await queue.wait_for_turn(item("running", 1.0))
    rec.submit(item("first", 9.0))
    await settle()
    for _ in range(6):  # 2 dispatches a second; 2 high-priority arrivals a second
        clock.now += 0.5
        queue.release()
        await settle()
        rec.submit(item(f"high-{clock.now}", 9.0))
        await settle()
    assert queue.predicted_wait_s(1.0) == math.inf
    assert math.isfinite(queue.predicted_wait_s(10.0) or 0.0)
    await rec.close()


@pytest.mark.asyncio
async def test_waiter_past_its_slo_wait_leaves_with_503_slo_unattainable() -> None:
    clock = FakeClock()
    queue = AdmissionQueue(
        max_in_flight=1, max_queued=10, clock=clock, service_rate=ServiceRate(100.0, 0.0)
    )
    rec = Recorder(queue)
    await queue.wait_for_turn(item("running", 1.0))
    rec.submit(QueueItem("promised", "std", 9.0, ttl_s=30.0, aging_s=1.0, slo_wait_s=0.8))
    rec.submit(item("patient", 1.0, ttl_s=30.0))
    await settle()
    clock.now = 1.0  # by the queue's clock, "promised" can no longer meet its SLO
    queue.release()
    await settle()
    assert rec.admitted == ["patient"]
    refused = rec.refused["promised"]
    assert refused.reason is RejectReason.SLO_UNATTAINABLE and refused.status_code == 503
    assert refused.headers()[REJECT_REASON_HEADER] == "slo_unattainable"
    assert int(refused.headers()["retry-after"]) >= 1
    await rec.close()


@pytest.mark.asyncio
async def test_slo_wait_timer_ends_a_wait_without_any_dispatch() -> None:
    queue = AdmissionQueue(max_in_flight=1, max_queued=10)
    await queue.wait_for_turn(item("running", 1.0))
    with pytest.raises(QueueRejected) as refused:
        await queue.wait_for_turn(
            QueueItem("r", "std", 1.0, ttl_s=30.0, aging_s=1.0, slo_wait_s=0.01)
        )
    assert refused.value.reason is RejectReason.SLO_UNATTAINABLE
    assert queue.queued == 0


@pytest.mark.asyncio
async def test_demotable_waiter_is_demoted_not_refused_and_goes_last() -> None:
    clock = FakeClock()
    queue = AdmissionQueue(max_in_flight=1, max_queued=10, clock=clock)
    grants: dict[str, Grant] = {}

    async def wait(request: QueueItem) -> None:
        grants[request.request_id] = await queue.wait_for_turn(request)

    await queue.wait_for_turn(item("running", 1.0))
    tasks = [
        asyncio.create_task(
            wait(QueueItem("batch", "b", 9.0, 30.0, 1.0, slo_wait_s=0.5, demotable=True))
        ),
        asyncio.create_task(wait(item("low", 1.0, ttl_s=30.0, aging_s=100.0))),
    ]
    await settle()
    clock.now = 1.0  # "batch" is past its SLO wait: demoted below "low", never rescued
    queue.release()
    await settle()
    assert list(grants) == ["low"] and not grants["low"].demoted
    queue.release()
    await settle()
    assert grants["batch"].demoted and grants["batch"].waited_s == pytest.approx(1.0)
    await asyncio.gather(*tasks)


@pytest.mark.asyncio
async def test_demoted_at_admission_goes_at_once_only_where_ready() -> None:
    ready = {"m": False}
    queue = AdmissionQueue(
        max_in_flight=4,
        max_queued=10,
        ready=lambda model, demoted: not demoted or ready[model],
        ready_poll_s=0.001,
    )
    promised = await queue.wait_for_turn(item("promised", 1.0))
    assert not promised.demoted
    task = asyncio.create_task(
        queue.wait_for_turn(QueueItem("be", "b", -1.0, 30.0, 1.0, 0.0, demotable=True, model="m"))
    )
    await asyncio.sleep(0.01)
    assert not task.done() and queue.queued == 1  # slots free, but no spare capacity
    ready["m"] = True
    grant = await asyncio.wait_for(task, 5)  # the queue looks again by itself
    assert grant.demoted and queue.in_flight == 2


@pytest.mark.asyncio
async def test_ready_gate_dispatches_one_request_per_model_per_look() -> None:
    """``ready`` reads backend state that changes only once a granted request is dispatched,
    so one look at it may let only one request through."""
    looks: list[int] = []

    def ready(model: str, demoted: bool) -> bool:
        looks.append(queue.in_flight)
        return True

    queue = AdmissionQueue(max_in_flight=0, max_queued=10, ready=ready)
    rec = Recorder(queue)
    for name in ("a", "b", "c"):
        rec.submit(item(name, 1.0))
    await settle()
    looks.clear()
    queue.set_max_in_flight(3)  # one pump now, the next ones as the granted waiters run
    assert queue.in_flight == 1
    await settle()
    assert sorted(rec.admitted) == ["a", "b", "c"] and looks == [0, 1, 2]
    await rec.close()


def test_full_backlog_drops_a_demoted_entry_before_a_promised_one() -> None:
    backlog = Backlog(2)
    backlog.push(QueueItem("be", "t", 9.0, 30.0, 1.0, slo_wait_s=0.0, demotable=True), 0.0)
    backlog.push(QueueItem("promised", "t", 1.0, 30.0, 1.0), 0.0)
    result = backlog.push(QueueItem("new", "t", 2.0, 30.0, 1.0), 0.0)
    assert result.evicted is not None and result.evicted.item.request_id == "be"
    assert [e.item.request_id for e in backlog.entries] == ["promised", "new"]


def test_queue_item_rejects_a_negative_or_nan_slo_wait() -> None:
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError):
            QueueItem("r", "t", 1.0, 1.0, 1.0, slo_wait_s=bad)


def test_backlog_memory_stays_bounded_when_entries_never_expire() -> None:
    """Entries that leave by dispatch keep no record behind, however long their TTL."""
    backlog = Backlog(10)
    for n in range(5000):
        backlog.push(item(f"r{n}", 1.0), float(n))
        assert backlog.pop(float(n)) is not None
    assert len(backlog) == 0
    assert len(backlog._expiry) <= 64 + 1  # white box: the expiry heap was compacted
