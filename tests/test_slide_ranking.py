"""SlideBatching's fast ranking decides exactly as the plain one (decision time).

The ranking keeps its per-position arrays as numpy and converts them only as far as the fill loop
reads (:class:`_Heads`), sorts through :func:`_lexsort` instead of ``np.lexsort``, finds runs and
the next running request with :func:`_first_at_or_after`, and keys its static column table by
request object. Each is checked here against the plain computation it replaces, on the busy
engine states of ``bench/scheduler_overhead.py`` pushed into starvation, KV shortage and small
step budgets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from priority.gain import GainWeights
from priority.policies import columns as columns_module
from priority.policies import slide as slide_module
from priority.policies.base import SchedulerInput, StepPlan
from priority.policies.slide import SlideBatchingPolicy, SlideParams, _first_at_or_after, _lexsort
from priority.profiles import load_profile
from priority.request import SLO, Request
from tests.scripts_loader import load_script

PROFILE = load_profile("a100-qwen2-7b")
GAIN = GainWeights.from_lengths(1155.0, 211.0)
SETTINGS: list[dict[str, object]] = [
    {},
    {"phi": "c"},
    {"phi": "p"},
    {"gamma": 0.05},
    {"preempt_for_admission": True, "kv_reserve_tokens": 0},
    {"starve_threshold": 0.0, "max_starved_per_step": 3},
]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench/scheduler_overhead.py")


def states(bench: ModuleType, seed: int, count: int) -> Iterator[SchedulerInput]:
    """Busy engine states, some later (overdue requests: starvation), some short of KV blocks or
    of step tokens (the fill loop walks far down the order)."""
    rng = np.random.default_rng(seed)
    for k in range(count):
        waiting = int(rng.choice([1, 40, 300, 700]))
        running = int(rng.choice([0, 3, 64, 256]))
        state = bench.engine_state(PROFILE, waiting, running, rng, tag=f"{seed}-{k}-")
        limits = dataclasses.replace(
            state.limits,
            num_free_blocks=int(rng.choice([0, 40, 600, state.limits.num_free_blocks])),
            token_budget=int(rng.choice([300, 2048, state.limits.token_budget])),
        )
        later = state.now + float(rng.choice([0.0, 3.0, 12.0]))
        yield dataclasses.replace(state, now=later, limits=limits)


def policy(**settings: Any) -> SlideBatchingPolicy:
    return SlideBatchingPolicy(PROFILE.estimator(), SlideParams(gain_weights=GAIN, **settings))


def summary(plan: StepPlan) -> tuple[object, ...]:
    return (
        [(r.request_id, tokens) for r, tokens in plan.scheduled],
        [r.request_id for r in plan.preempted],
        plan.num_urgent,
        plan.repeatable,
    )


def test_lexsort_matches_numpy_lexsort_with_ties_infinities_and_nan() -> None:
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 17, 500, 3000):
        key = rng.choice([-1.5, -0.0, 0.0, 0.25, 2.0, np.inf], size=n)  # mostly ties
        key[: n // 3] = rng.normal(size=n // 3)
        group = rng.choice([0, 1, 2, 3], size=n)
        assert np.array_equal(_lexsort(key, group), np.lexsort((key, group)))
    key = np.array([1.0, np.nan, 0.5, np.nan, 1.0])
    group = np.array([3, 0, 3, 0, 0])
    assert np.array_equal(_lexsort(key, group), np.lexsort((key, group)))


def test_lexsort_matches_on_the_keys_slide_sorts(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def spy(key: np.ndarray, group: np.ndarray) -> np.ndarray:
        seen.append((key.copy(), group.copy()))
        return _lexsort(key, group)

    monkeypatch.setattr(slide_module, "_lexsort", spy)
    for state in states(bench, seed=1, count=12):
        policy(starve_threshold=0.0, max_starved_per_step=3).rank(state)
        policy().rank(state)
    assert len({int(g.max()) for _, g in seen}) > 1  # starved and plain orders both sorted
    for key, group in seen:
        assert np.array_equal(_lexsort(key, group), np.lexsort((key, group)))


def test_first_at_or_after_matches_a_binary_search() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 50, 999):
        for share in (0.0, 0.1, 0.9, 1.0):
            mask = rng.random(n) < share
            position = np.arange(n)
            marked = np.flatnonzero(mask)
            expected = np.append(marked, n)[np.searchsorted(marked, position)]
            assert np.array_equal(_first_at_or_after(mask, position), expected)


def test_plans_do_not_depend_on_how_far_the_loop_lists_are_converted(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lists grown one position at a time give the plans of lists converted whole up front."""
    cases = [(s, settings) for s in states(bench, seed=2, count=10) for settings in SETTINGS]
    whole = [summary(policy(**settings).schedule(state)) for state, settings in cases]
    init = slide_module._Heads.__init__

    def one_at_a_time(self: object, arrays: object, first: int = 256) -> None:
        init(self, arrays, first=1)  # type: ignore[arg-type]

    monkeypatch.setattr(slide_module._Heads, "__init__", one_at_a_time)
    grown = [summary(policy(**settings).schedule(state)) for state, settings in cases]
    assert grown == whole
    assert any(len(plan[0]) > 1 for plan in whole)  # type: ignore[arg-type]
    assert any(plan[1] for plan in whole)  # some plans preempt (KV shortage)


def test_a_warm_or_compacted_column_table_plans_as_a_fresh_one(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One policy over many states (its table holds every request it saw, and compacts when
    told to keep no stale rows) plans each state as a policy that sees only that state."""
    cases = list(states(bench, seed=4, count=8))
    warm = policy()
    for state in cases:
        warm.schedule(state)
    for state in cases:
        assert summary(warm.schedule(state)) == summary(policy().schedule(state))
    seen = len(warm._columns._rows)
    monkeypatch.setattr(columns_module, "_STALE_ROWS", 0)
    for state in cases:
        assert summary(warm.schedule(state)) == summary(policy().schedule(state))
        # at most 4 stale rows per queued request before this call, plus this call's new ones
        assert len(warm._columns._rows) <= 5 * (len(state.running) + len(state.waiting))
    assert len(warm._columns._rows) < seen


def test_a_new_request_object_with_a_reused_id_gets_its_own_static_columns() -> None:
    """The table is keyed by request object: a request id seen before (an engine reusing ids,
    a test building a second scenario) never reads the earlier request's arrival or SLO."""
    table = columns_module.RequestColumns()
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    first = Request("r", 1.0, 100, slo)
    table.gather([first])
    again = Request("r", 7.0, 300, SLO(ttft_s=2.0, tpot_s=0.1), weight=2.0)
    static, computed, outputs = table.gather([again, first])
    assert static[columns_module.ARRIVAL].tolist() == [7.0, 1.0]
    assert static[columns_module.PROMPT].tolist() == [300.0, 100.0]
    assert static[columns_module.WEIGHT].tolist() == [2.0, 1.0]
    assert computed.tolist() == [0, 0] and outputs.tolist() == [0, 0]
