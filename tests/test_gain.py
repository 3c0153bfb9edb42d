"""Gain functions on hand-computed examples."""

from __future__ import annotations

import math

import pytest

from priority.gain import (
    GainWeights,
    GoodputWeights,
    ideal_tdg,
    mean_tpot_s,
    slo_attained,
    tdg,
    token_deadlines,
    token_goodput,
)
from priority.request import SLO

STREAM = SLO(ttft_s=1.0, tpot_s=0.1)
W = GainWeights(first_token=5.0, decode_token=1.0)


def test_token_deadlines_follow_eq3() -> None:
    due = token_deadlines(10.0, STREAM, 4)
    assert due.tolist() == pytest.approx([11.0, 11.1, 11.2, 11.3])


def test_tdg_all_on_time_equals_ideal() -> None:
    times = [10.5, 10.6, 10.7, 10.8]
    assert tdg(10.0, STREAM, 2.0, times, W) == pytest.approx(ideal_tdg(2.0, 4, W))
    assert ideal_tdg(2.0, 4, W) == pytest.approx(2.0 * (5.0 + 3 * 1.0))


def test_tdg_is_strict_and_per_token() -> None:
    # first token exactly at its deadline earns nothing (strict <); token 3 late, token 4 on time
    times = [11.0, 11.05, 11.25, 11.29]
    # weights: first 5, decodes 1 each; on time: token2 (11.05<11.1), token4 (11.29<11.3)
    assert tdg(10.0, STREAM, 1.0, times, W) == pytest.approx(2.0)


def test_tdg_lateness_propagates_with_fixed_deadlines() -> None:
    # a 0.5 s stall after the first token: the next tokens stay late even if fast afterwards
    times = [10.5, 11.2, 11.21, 11.22, 11.23]
    # deadlines: 11.0, 11.1, 11.2, 11.3, 11.4 -> on time: 1st, 4th, 5th
    assert tdg(10.0, STREAM, 1.0, times, W) == pytest.approx(5.0 + 2.0)


def test_unbuffered_first_token_pulls_deadlines_forward() -> None:
    # footnote 2: first token at 0.2 s -> later deadlines 0.2 + (i-1)*0.1
    times = [10.2, 10.35, 10.45]
    buffered = tdg(10.0, STREAM, 1.0, times, W)
    unbuffered = tdg(10.0, STREAM, 1.0, times, W, first_token_buffered=False)
    assert buffered == pytest.approx(7.0)
    # unbuffered deadlines: 11.0 (min(0.2,1.0)=0.2 -> 10.2 for token 1!), 10.3, 10.4
    # token 1 at 10.2 is not < 10.2 -> 0; tokens 2, 3 late -> 0
    assert unbuffered == pytest.approx(0.0)


def test_deadline_sensitive_tokens_all_due_at_deadline() -> None:
    slo = SLO(deadline_s=2.0)
    due = token_deadlines(0.0, slo, 3)
    assert due.tolist() == [2.0, 2.0, 2.0]
    assert tdg(0.0, slo, 1.0, [0.5, 1.9, 2.0], W) == pytest.approx(5.0 + 1.0)


def test_slo_attainment_is_strict() -> None:
    # mean TPOT exactly equal to the SLO (binary-exact values) does not attain it
    slo = SLO(ttft_s=1.0, tpot_s=0.25)
    assert mean_tpot_s([0.5, 0.75, 1.0]) == 0.25
    assert not slo_attained(0.0, slo, [0.5, 0.75, 1.0])
    assert slo_attained(0.0, slo, [0.5, 0.75, 0.99])


def test_slo_attainment_cases() -> None:
    assert slo_attained(0.0, STREAM, [0.5, 0.55, 0.6])
    assert not slo_attained(0.0, STREAM, [1.0, 1.05])  # TTFT == SLO
    assert not slo_attained(0.0, STREAM, [0.5, 0.7, 0.9])  # mean TPOT 0.2
    assert not slo_attained(0.0, STREAM, [0.5, 0.55], finished=False)
    assert not slo_attained(0.0, STREAM, [])
    assert slo_attained(0.0, SLO(deadline_s=1.0), [0.3, 0.99])
    assert not slo_attained(0.0, SLO(deadline_s=1.0), [0.3, 1.0])


def test_goodput_latency_sensitive_counts_on_time_tokens() -> None:
    # JITServe: token counts if it finishes BY its due time (inclusive)
    times = [1.0, 1.1, 1.5]
    assert token_goodput(0.0, STREAM, 100, times) == pytest.approx(2.0)
    weighted = token_goodput(0.0, STREAM, 100, times, weights=GoodputWeights(1.0, 2.0))
    assert weighted == pytest.approx(100 + 4.0)


def test_goodput_deadline_sensitive_all_or_nothing_and_decay() -> None:
    slo = SLO(deadline_s=2.0)
    w = GoodputWeights(input_token=1.0, output_token=2.0)
    assert token_goodput(0.0, slo, 10, [1.0, 2.0], weights=w) == pytest.approx(10 + 4)
    assert token_goodput(0.0, slo, 10, [1.0, 4.0], weights=w) == 0.0
    # Tempo decay alpha=1: (2/4)^1 = 0.5
    assert token_goodput(0.0, slo, 10, [1.0, 4.0], weights=w, decay_alpha=1.0) == pytest.approx(7.0)
    assert token_goodput(0.0, slo, 10, [1.0, 4.0], weights=w, finished=False) == 0.0


def test_gain_weights_from_lengths() -> None:
    w = GainWeights.from_lengths(1155.0, 211.0)
    assert w.first_token == pytest.approx(1155 / 211)
    assert w.token_value(2.0, 1) == pytest.approx(2 * 1155 / 211)
    assert w.token_value(2.0, 7) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"ttft_s": 1.0},
        {"tpot_s": 0.1, "deadline_s": 1.0},
        {"deadline_s": -1.0},
        {"ttft_s": math.inf, "tpot_s": 0.1},
    ],
)
def test_slo_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SLO(**kwargs)


# ---- request kinds, hand-computed ------------------------------------------------------------


def test_deadline_kind_counts_every_token_only_if_it_ends_in_time() -> None:
    from priority.gain import kind_goodput

    both = SLO(ttft_s=0.1, tpot_s=0.01, deadline_s=3.0)
    w = GoodputWeights(input_token=1.0, output_token=2.0)
    # judged end to end: the streaming part is ignored, 10 + 3 * 2 = 16 if done by 3 s
    assert kind_goodput("deadline", 0.0, both, 10, [1.0, 2.0, 2.9], weights=w) == 16.0
    assert kind_goodput("deadline", 0.0, both, 10, [1.0, 2.0, 3.1], weights=w) == 0.0
    assert kind_goodput("deadline", 0.0, both, 10, [1.0], finished=False, weights=w) == 0.0
    # as a latency request the same times earn nothing: every token is past its TTFT/TPOT due
    assert kind_goodput("latency", 0.0, both, 10, [1.0, 2.0, 2.9], weights=w) == 0.0


def test_best_effort_gets_a_default_deadline() -> None:
    from priority.gain import DEFAULT_BEST_EFFORT_DEADLINE_S, kind_attained, kind_slo

    slo = kind_slo("best-effort", STREAM)
    assert slo.deadline_s == DEFAULT_BEST_EFFORT_DEADLINE_S and not slo.is_streaming
    late = DEFAULT_BEST_EFFORT_DEADLINE_S + 1.0
    assert kind_attained("best-effort", 0.0, STREAM, [5.0, 50.0])  # slow, but before 120 s
    assert not kind_attained("best-effort", 0.0, STREAM, [5.0, late])
    assert kind_slo("best-effort", SLO(deadline_s=7.0)).deadline_s == 7.0


def test_workflow_goodput_counts_all_calls_iff_the_last_is_on_time() -> None:
    from priority.gain import WorkflowCall, workflow_goodput

    calls = [WorkflowCall(100, 10, 3.0), WorkflowCall(50, 20, 9.0)]
    w = GoodputWeights(input_token=1.0, output_token=2.0)
    # all tokens: (100 + 20) + (50 + 40) = 210; last call ends 9.0 - 1.0 = 8 s after the start
    assert workflow_goodput(1.0, 8.0, calls, weights=w) == 210.0
    assert workflow_goodput(1.0, 7.9, calls, weights=w) == 0.0
    # Tempo's graded decay: 210 * (6 / 8) = 157.5
    assert workflow_goodput(1.0, 6.0, calls, weights=w, decay_alpha=1.0) == pytest.approx(157.5)
    unfinished = [*calls, WorkflowCall(10, 1, None)]
    assert workflow_goodput(1.0, 100.0, unfinished, weights=w) == 0.0


def test_jain_index_hand_computed() -> None:
    from priority.gain import jain_index

    assert jain_index([1.0, 1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == 0.25
    # (1 + 3)^2 / (2 * (1 + 9)) = 16 / 20
    assert jain_index([1.0, 3.0]) == pytest.approx(0.8)
    assert jain_index([]) == 1.0
