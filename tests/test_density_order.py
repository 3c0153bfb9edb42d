"""The density order a PrefillQueue keeps (slide's serving order past capacity) equals a sort of
a walk of the queue after any mutations and any recorded progress."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from priority.estimator import BatchLatencyEstimator
from priority.request import SLO, Request
from priority.routing.prefill_queue import PrefillQueue, raw_prefill_work, slide_rank_work
from tests.test_prefill_aggregate import PRICINGS, apply, keys, operations

progress = st.tuples(st.just("progress"), st.tuples(keys, st.integers(0, 40_000)))
steps = st.one_of(operations, progress)


def check_density(queue: PrefillQueue, pricing: int) -> None:
    coefficients, chunk = PRICINGS[pricing]
    order = queue.density_order(coefficients, chunk)
    rows = []
    for key, request in queue.items():
        done = queue.computed(key)
        rest = request.prompt_tokens - done
        exec_s = max(BatchLatencyEstimator(coefficients).request_time(rest, done), 1e-12)
        work = raw_prefill_work(coefficients, chunk, request.prompt_tokens)[0]
        if done:
            work = max(0.0, work - raw_prefill_work(coefficients, chunk, done)[0])
        deadline = request.arrival_s + request.slo.token_due_s(1)
        rows.append((-request.weight / exec_s, deadline, work, request.weight))
    rows.sort(key=lambda row: (row[0], row[1]))
    assert order.keys == [row[0] for row in rows]
    assert order.deadlines == [row[1] for row in rows]
    assert list(order.dues) == order.deadlines
    assert sorted(zip(order.keys, order.deadlines, order.works, order.weights, strict=True)) == (
        sorted(rows)
    )
    assert sorted(e.request.request_id for e in order.entries) == sorted(queue)


@settings(max_examples=200, deadline=None)
@given(st.lists(steps, max_size=80), st.integers(0, 80), st.integers(0, len(PRICINGS) - 1))
def test_the_density_order_follows_any_mutations_and_progress(
    ops: list[tuple[str, object]], ask: int, pricing: int
) -> None:
    queue, twin = PrefillQueue(), dict[str, Request]()
    for i, (op, arg) in enumerate(ops):
        if i == ask:  # kept from its first use on
            check_density(queue, pricing)
        if op == "progress":
            key, tokens = arg  # type: ignore[misc]
            queue.progress(key, tokens)
            if key in queue:
                assert queue.computed(key) == min(tokens, queue[key].prompt_tokens)
        elif op != "ask":
            apply(queue, twin, op, arg)
        assert dict(queue) == twin
    check_density(queue, pricing)
    check_density(queue, (pricing + 1) % len(PRICINGS))  # asked for another profile: re-sorted


def test_a_long_prompt_partly_prefilled_climbs_as_slide_ranks_it() -> None:
    coefficients, chunk = PRICINGS[0]
    queue = PrefillQueue()
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    queue["long"] = Request("long", 0.0, 30_000, slo)
    queue["short"] = Request("short", 0.0, 2_000, slo)
    order = queue.density_order(coefficients, chunk)
    assert [e.request.request_id for e in order.entries] == ["short", "long"]
    queue.progress("long", 29_500)  # 500 tokens left over a long cached prefix
    assert slide_rank_work(coefficients, 500, 29_500) < slide_rank_work(coefficients, 2_000)
    assert [e.request.request_id for e in order.entries] == ["long", "short"]
    # what is left of its work, not the whole prompt's
    assert order.works[0] < raw_prefill_work(coefficients, chunk, 30_000)[0] / 10
    # progress touches neither the totals nor the mutation count
    before = queue.mutations
    queue.progress("long", 30_000)
    assert queue.mutations == before
    assert queue.totals(coefficients, chunk).prompt_tokens == 32_000
    assert order.works[0] == 0.0
    queue.progress("gone", 5)  # not queued: ignored
    assert queue.computed("gone") == 0
