"""The running totals of a prefill queue (:class:`PrefillQueue`) equal a walk of the queue after
any sequence of dict mutations, and the routing summaries built on them are unchanged."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority.estimator import LatencyCoefficients
from priority.profiles import EngineConfig, Profile
from priority.request import SLO, Request
from priority.routing import ExternalPrefills, GoRouter, InstanceView
from priority.routing.goroute import own_prefills
from priority.routing.prefill_queue import PrefillQueue, PrefillTotals, raw_prefill_work

QUADRATIC = LatencyCoefficients(a_p=3e-9, b_p=1.7e-9, c_p=1.1e-4, a_d=0.0, b_d=0.01, t_c=0.02)
LINEAR = LatencyCoefficients(a_p=0.0, b_p=0.0, c_p=1e-4, a_d=0.0, b_d=0.0, t_c=0.0)
PRICINGS = [(QUADRATIC, 2048), (QUADRATIC, 512), (LINEAR, 2048)]
"""(coefficients, chunk tokens) pairs the totals may be asked in: a change recomputes them."""


def walk(queue: dict[str, Request], coefficients: LatencyCoefficients, chunk: int) -> PrefillTotals:
    """The totals from scratch, as the routers used to compute them on every event (work summed
    exactly, see :func:`check`)."""
    works = [raw_prefill_work(coefficients, chunk, r.prompt_tokens) for r in queue.values()]
    tpots = [r.slo.tpot_s for r in queue.values() if r.slo.tpot_s is not None]
    return PrefillTotals(
        len(queue),
        sum(r.prompt_tokens for r in queue.values()),
        math.fsum(w for w, _ in works),
        sum(k for _, k in works),
        min(tpots, default=math.inf),
        min((r.arrival_s + r.slo.token_due_s(1) for r in queue.values()), default=math.inf),
    )


def check(queue: PrefillQueue, coefficients: LatencyCoefficients, chunk: int) -> None:
    got, want = queue.totals(coefficients, chunk), walk(queue, coefficients, chunk)
    # exact: the running sum is kept in integers, so it is the correctly rounded sum (fsum's),
    # whatever requests came and went before; a plain left-to-right sum is within rounding
    assert got == want
    naive = sum(raw_prefill_work(coefficients, chunk, r.prompt_tokens)[0] for r in queue.values())
    assert got.raw_work == pytest.approx(naive, rel=1e-12, abs=0.0)


requests = st.builds(
    lambda rid, arrival, prompt, ttft, tpot, streaming: Request(
        f"r{rid}",
        arrival,
        prompt,
        SLO(ttft_s=ttft, tpot_s=tpot) if streaming else SLO(deadline_s=ttft),
    ),
    rid=st.integers(0, 11),
    arrival=st.floats(0.0, 1e4),
    prompt=st.integers(1, 40_000),
    ttft=st.floats(0.01, 100.0),
    tpot=st.sampled_from([0.02, 0.05, 0.1, 0.1 / 3]),
    streaming=st.booleans(),
)
keys = st.integers(0, 11).map(lambda i: f"r{i}")
operations = st.one_of(
    st.tuples(st.just("set"), requests),
    st.tuples(st.just("del"), keys),
    st.tuples(st.just("pop"), keys),
    st.tuples(st.just("popitem"), st.none()),
    st.tuples(st.just("clear"), st.none()),
    st.tuples(st.just("update"), st.lists(requests, max_size=4)),
    st.tuples(st.just("setdefault"), requests),
    st.tuples(st.just("ask"), st.integers(0, len(PRICINGS) - 1)),
)


def apply(queue: PrefillQueue, twin: dict[str, Request], op: str, arg: object) -> None:
    """Apply one operation to ``queue`` and to the plain dict ``twin``."""
    if op == "set":
        assert isinstance(arg, Request)
        queue[arg.request_id] = twin[arg.request_id] = arg
    elif op in ("del", "pop"):
        assert isinstance(arg, str)
        if arg in twin:
            del twin[arg]
            if op == "del":
                del queue[arg]
            else:
                assert queue.pop(arg) is not None
        else:
            assert queue.pop(arg, None) is None
    elif op == "popitem":
        if twin:
            key, _ = queue.popitem()
            del twin[key]
    elif op == "clear":
        queue.clear()
        twin.clear()
    elif op == "update":
        assert isinstance(arg, list)
        batch = {r.request_id: r for r in arg}
        queue.update(batch)
        twin.update(batch)
    elif op == "setdefault":
        assert isinstance(arg, Request)
        assert queue.setdefault(arg.request_id, arg) is twin.setdefault(arg.request_id, arg)


@settings(max_examples=300, deadline=None)
@given(st.lists(operations, max_size=80), st.integers(0, len(PRICINGS) - 1))
def test_totals_equal_a_walk_after_any_mutations(ops: list[tuple[str, object]], final: int) -> None:
    queue, twin = PrefillQueue(), dict[str, Request]()
    for op, arg in ops:
        if op == "ask":  # totals asked mid-way (in some pricing): kept up to date from then on
            assert isinstance(arg, int)
            check(queue, *PRICINGS[arg])
        else:
            apply(queue, twin, op, arg)
        assert dict(queue) == twin
    check(queue, *PRICINGS[final])
    check(queue, *PRICINGS[0])


def check_order(queue: PrefillQueue) -> None:
    """The deadline order the queue keeps equals a sort of a walk of it."""
    order = queue.deadline_order()
    rows = sorted(
        (
            r.arrival_s + r.slo.token_due_s(1),
            r.weight,
            r.weight if r.slo.tpot_s is not None else 0.0,
        )
        for r in queue.values()
    )
    assert order.deadlines == [d for d, _, _ in rows]
    # the earliest deadline then comes from the order, not a heap
    earliest = rows[0][0] if rows else math.inf
    assert queue.totals(*PRICINGS[0]).earliest_deadline_s == earliest
    assert sorted(zip(order.deadlines, order.weights, order.stream_weights, strict=True)) == rows
    decode = math.fsum(
        r.weight * max(0, r.expected_output_tokens - 1)
        for r in queue.values()
        if r.slo.tpot_s is not None
    )
    assert order.decode_tokens_weighted == pytest.approx(decode, rel=1e-9, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.lists(operations, max_size=80), st.integers(0, 80))
def test_the_deadline_order_follows_any_mutations(ops: list[tuple[str, object]], ask: int) -> None:
    queue, twin = PrefillQueue(), dict[str, Request]()
    for i, (op, arg) in enumerate(ops):
        if i == ask:  # kept from its first use on
            check_order(queue)
        if op != "ask":
            apply(queue, twin, op, arg)
    check_order(queue)


def test_a_queue_emptied_by_removals_sums_to_exactly_zero() -> None:
    # a running float sum would keep the rounding of the large prompts here (1e-16 of ~10 s)
    queue = PrefillQueue()
    for i, prompt in enumerate([37_000, 1, 29_999, 3, 12_345] * 20):
        queue[f"r{i}"] = Request(f"r{i}", 0.0, prompt, SLO(ttft_s=1.0, tpot_s=0.05))
    assert queue.totals(QUADRATIC, 2048).raw_work > 10.0
    for key in list(queue):
        del queue[key]
    assert queue.totals(QUADRATIC, 2048) == PrefillTotals(0, 0, 0.0, 0, math.inf, math.inf)


def test_minimum_survives_removal_of_the_minimum_and_stale_heap_entries() -> None:
    queue = PrefillQueue()
    for i in range(200):  # deadlines 1..200, the earliest first
        queue[f"r{i}"] = Request(f"r{i}", float(i), 10, SLO(ttft_s=1.0, tpot_s=0.05))
    for i in range(199):  # FIFO: the earliest leaves first, every time
        del queue[f"r{i}"]
        assert queue.totals(LINEAR, 2048).earliest_deadline_s == float(i + 2)
    queue["r0"] = Request("r0", 1000.0, 10, SLO(ttft_s=1.0, tpot_s=0.01))
    totals = queue.totals(LINEAR, 2048)
    assert (totals.earliest_deadline_s, totals.min_tpot_s) == (200.0, 0.01)


def test_removed_requests_do_not_pile_up_when_no_one_asks() -> None:
    # a worker that never reads the totals (no GoRouting, one process) churns its queue for ever
    queue = PrefillQueue({"old": Request("old", 0.0, 10, SLO(ttft_s=1.0, tpot_s=0.05))})
    for i in range(5000):
        queue[f"r{i}"] = Request(f"r{i}", float(i), 10, SLO(ttft_s=1.0, tpot_s=0.05))
        del queue[f"r{i}"]
    assert len(queue._deadline._heap) <= 2 * len(queue) + 16
    assert len(queue._tpot._heap) <= 2 * len(queue) + 16
    assert queue.totals(LINEAR, 2048).earliest_deadline_s == 1.0


def test_a_request_leaves_with_what_it_entered_with() -> None:
    queue = PrefillQueue()
    request = Request("r", 0.0, 1000, SLO(ttft_s=1.0, tpot_s=0.05))
    queue["r"] = request
    queue.totals(LINEAR, 2048)
    request.prompt_tokens = 5000  # changed while queued: the totals keep its entry's share
    del queue["r"]
    assert queue.totals(LINEAR, 2048) == PrefillTotals(0, 0, 0.0, 0, math.inf, math.inf)


def test_copies_keep_the_totals() -> None:
    queue = PrefillQueue({"a": Request("a", 1.0, 3000, SLO(ttft_s=2.0, tpot_s=0.05))})
    for clone in (pickle.loads(pickle.dumps(queue)), copy.deepcopy(queue), copy.copy(queue)):
        assert isinstance(clone, PrefillQueue)
        assert clone.totals(QUADRATIC, 2048) == queue.totals(QUADRATIC, 2048)
        clone["b"] = Request("b", 1.0, 10, SLO(ttft_s=1.0, tpot_s=0.02))
        check(clone, QUADRATIC, 2048)
        assert len(queue) == 1


def _view(*queued: Request, chunk: int = 2048) -> InstanceView:
    profile = Profile("q", "test", "test", 1, QUADRATIC, EngineConfig(max_num_batched_tokens=chunk))
    return InstanceView(
        0, "i0", profile, profile.estimator(), prefill_queue={r.request_id: r for r in queued}
    )


def test_a_view_keeps_a_plain_dict_as_a_prefill_queue_and_follows_its_profile() -> None:
    a = Request("a", 1.0, 3000, SLO(ttft_s=2.0, tpot_s=0.05))
    b = Request("b", 2.0, 9000, SLO(deadline_s=0.5))
    view = _view(a, b)
    assert isinstance(view.prefill_queue, PrefillQueue)
    assert view.prefill_totals == walk(view.prefill_queue, QUADRATIC, 2048)
    wider = _view(chunk=8192).profile
    view.profile = wider  # a new chunk size: the work is re-cut
    assert view.prefill_totals == walk(view.prefill_queue, QUADRATIC, 8192)
    assert view.prefill_totals.chunks == 3 and walk(view.prefill_queue, QUADRATIC, 2048).chunks == 7
    view.prefill_queue = {"a": a}  # assigned a plain dict later: summed afresh, still right
    assert view.prefill_totals == walk({"a": a}, QUADRATIC, 8192)


def test_own_prefills_reads_the_totals() -> None:
    a = Request("a", 1.0, 3000, SLO(ttft_s=2.0, tpot_s=0.05))
    b = Request("b", 2.0, 9000, SLO(deadline_s=0.5))
    view = _view(a, b)
    view.queue_updated_s = 7.0
    want = walk(view.prefill_queue, QUADRATIC, 2048)
    assert own_prefills(view) == ExternalPrefills(*want, updated_s=7.0)
    assert (want.earliest_deadline_s, want.min_tpot_s, want.num_requests) == (2.5, 0.05, 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(requests, min_size=1, max_size=12, unique_by=lambda r: r.request_id))
def test_goroute_summary_is_the_walks(queued: list[Request]) -> None:
    view = _view(*queued)
    router = GoRouter([view])
    summary = router._summary(view)
    want = walk(view.prefill_queue, QUADRATIC, 2048)
    assert (summary.raw_work, summary.chunks, summary.min_tpot_s) == (
        want.raw_work,
        want.chunks,
        want.min_tpot_s,
    )
    assert summary.deadlines == sorted(r.arrival_s + r.slo.token_due_s(1) for r in queued)
