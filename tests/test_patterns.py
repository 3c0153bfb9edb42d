"""Historical pattern graphs (priority.patterns): φ on worked examples, pruning, the kernel's
scale, decay and eviction, monotone φ along a workflow."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority.patterns import (
    EndedStage,
    KnownStage,
    PatternGraph,
    PatternHistory,
    PatternStage,
    model_hash,
    stage_due,
    timeline_graph,
)

A, B = model_hash("model-a"), model_hash("model-b")


def graph(*stages: tuple[int, int, int, float]) -> PatternGraph:
    return PatternGraph(tuple(PatternStage(*s) for s in stages))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_graphs_phi_is_its_cumulative_time_share() -> None:
    g = graph((A, 100, 10, 1.0), (A, 200, 20, 3.0), (B, 50, 5, 4.0))
    assert g.shares == pytest.approx((1 / 8, 4 / 8, 1.0))
    assert g.phi(-1) == 0.0
    with pytest.raises(ValueError):
        graph((A, 1, 1, 0.0))  # no time at all: no shares
    with pytest.raises(ValueError):
        PatternStage(A, 1, 1, -1.0)


def test_a_stage_time_is_what_it_added_to_the_workflows_timeline() -> None:
    # started at 10 s; stage 1 arrived 0.5 s after stage 0's end (think) and ended at 12 s;
    # stage 2 ran beside stage 1 and ended first: it added nothing past 12 s
    ended = [EndedStage(A, 100, 10, 11.0), EndedStage(B, 50, 5, 12.0), EndedStage(A, 9, 9, 11.5)]
    g = timeline_graph(10.0, ended)
    assert g is not None
    assert [s.time_s for s in g.stages] == pytest.approx([1.0, 1.0, 0.0])
    assert [(s.model, s.input_tokens, s.output_tokens) for s in g.stages] == [
        (A, 100, 10),
        (B, 50, 5),
        (A, 9, 9),
    ]
    assert g.shares == pytest.approx((0.5, 1.0, 1.0))
    # nothing after the start: no time to share, no graph
    assert timeline_graph(10.0, [EndedStage(A, 1, 1, 10.0)]) is None
    assert timeline_graph(10.0, []) is None


def test_stage_due_is_phi_d_unless_behind_schedule() -> None:
    # on schedule: φ(s)·D − elapsed
    assert stage_due(0.5, 0.25, 10.0, 2.0) == pytest.approx(3.0)
    # behind: the stage's share of what is left, (0.5 − 0.25) / 0.75 of 4 s
    assert stage_due(0.5, 0.25, 10.0, 6.0) == pytest.approx(4.0 / 3)
    # a φ(s−1) above φ(s) counts as φ(s): the stage's share is 0, φ·D − elapsed stands
    assert stage_due(0.5, 0.75, 10.0, 2.0) == pytest.approx(3.0)
    assert stage_due(1.0, 1.0, 10.0, 12.0) == pytest.approx(-2.0)  # past D: the caller clips


def test_one_candidate_gives_its_own_phi() -> None:
    history = PatternHistory()
    history.add(graph((A, 100, 10, 1.0), (A, 200, 20, 3.0)))
    found = history.match([KnownStage(A, 100)])
    assert found is not None
    assert (found.phi, found.phi_before, found.candidates) == (0.25, 0.0, 1)
    assert found.best_similarity == pytest.approx(1.0)
    second = history.match([KnownStage(A, 100, 10), KnownStage(A, 400)])
    assert second is not None and (second.phi, second.phi_before) == (1.0, 0.25)
    # one term differs by ln(401/201): the kernel exp(-d^2 / (2 * 0.5^2))
    d = math.log(401 / 201)
    assert second.best_similarity == pytest.approx(math.exp(-2 * d * d))


def test_the_blend_weights_candidates_by_their_kernel() -> None:
    history = PatternHistory(sigma=0.5)
    near = graph((A, 100, 10, 1.0), (A, 100, 10, 1.0))  # φ(0) = 0.5
    far = graph((A, 400, 10, 3.0), (A, 100, 10, 1.0))  # φ(0) = 0.75
    history.add(near)
    history.add(far)
    found = history.match([KnownStage(A, 100)])
    assert found is not None and found.candidates == 2
    w_far = math.exp(-2 * math.log(401 / 101) ** 2)  # near's weight is 1
    assert found.phi == pytest.approx((0.5 + 0.75 * w_far) / (1 + w_far))
    assert 0.5 < found.phi < 0.75
    # the kernel is relative: the same ratio 40x larger weighs the same
    scaled = PatternHistory(sigma=0.5)
    scaled.add(graph((A, 4000, 10, 1.0), (A, 1, 1, 1.0)))
    scaled.add(graph((A, 16000, 10, 3.0), (A, 1, 1, 1.0)))
    big = scaled.match([KnownStage(A, 4000)])
    assert big is not None and big.phi == pytest.approx(found.phi, abs=2e-3)


def test_structure_prunes_other_models_and_shorter_workflows() -> None:
    history = PatternHistory()
    history.add(graph((A, 100, 10, 1.0)))  # too short for stage 1
    history.add(graph((B, 100, 10, 1.0), (A, 100, 10, 1.0)))  # another model at stage 0
    history.add(graph((A, 100, 10, 1.0), (B, 100, 10, 1.0), (A, 9, 9, 2.0)))  # B at stage 1
    assert history.match([KnownStage(A, 100, 10), KnownStage(A, 100)]) is None
    found = history.match([KnownStage(A, 100, 10), KnownStage(B, 100)])
    assert found is not None and found.candidates == 1 and found.phi == 0.5
    assert history.match([KnownStage(A, 100)]) is not None  # stage 0: two A-first graphs
    assert PatternHistory().phi([KnownStage(A, 100)]) is None  # cold start: nothing stored


def test_reuse_decays_by_the_hour_and_the_least_reused_is_evicted() -> None:
    clock = Clock()
    history = PatternHistory(capacity=2, clock=clock)
    old = graph((A, 100, 10, 1.0), (A, 100, 10, 1.0))
    other = graph((B, 100, 10, 1.0))
    history.add(old)
    history.add(other)
    assert history.match([KnownStage(A, 100)]) is not None  # old used once: score 2
    clock.t = 3600.0
    assert history.reuse(old) == pytest.approx(2 * 0.9)
    assert history.reuse(other) == pytest.approx(0.9)
    newest = graph((A, 5, 5, 1.0))
    assert history.add(newest) is other  # the least reused goes, not the oldest
    assert history.graphs == [old, newest]
    clock.t = 3600.0 * 20  # old: 2 * 0.9^20 = 0.24 > newest: 0.9^19 = 0.14
    fresh = graph((B, 1, 1, 1.0))
    assert history.add(fresh) is newest
    assert history.add(graph((B, 2, 2, 1.0))) is old  # 0.24 < a fresh graph's 1
    assert len(history) == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.integers(0, 5000), st.integers(0, 2000), st.floats(0.0, 50.0, allow_nan=False)
            ),
            min_size=1,
            max_size=5,
        ),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 2000)), min_size=1, max_size=5),
)
def test_phi_is_in_0_1_and_never_decreases_along_a_workflow(
    stored: list[list[tuple[int, int, float]]], workflow: list[tuple[int, int]]
) -> None:
    history = PatternHistory()
    for stages in stored:
        if sum(t for _, _, t in stages) > 0:
            history.add(graph(*((A, i, o, t) for i, o, t in stages)))
    previous = 0.0
    for s in range(len(workflow)):
        known = [KnownStage(A, i, o) for i, o in workflow[:s]]
        known.append(KnownStage(A, workflow[s][0]))
        phi = history.phi(known, at_least=previous)
        if phi is None:
            assert all(len(g) <= s for g in history.graphs)
            break
        assert 0.0 < phi <= 1.0
        assert phi >= previous
        previous = phi
    for g in history.graphs:  # every stored graph's own φ is monotone up to 1
        assert list(g.shares) == sorted(g.shares) and g.shares[-1] == 1.0
