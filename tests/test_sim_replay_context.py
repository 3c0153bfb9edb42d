"""The replay's context-length rule without vLLM: what vLLM's API server refuses or cuts, the
model length set from the trace, and refused requests counted on the simulator side
(``engine_harness.sim_replay``; the rule against vLLM's own validators: tests/engines/)."""

from __future__ import annotations

import pytest

from engine_common.protocol import TPOT_MS, TTFT_MS
from engine_harness.sim_replay import (
    Arrival,
    admitted,
    api_max_tokens,
    model_len_for,
    replay_simulator,
    tdg_ratio,
)
from priority.gain import GainWeights
from priority.profiles import load_profile
from priority.sim.workflows import WorkflowCall

PROFILE = load_profile("a100-qwen2-7b")
SLO = {TTFT_MS: 60_000.0, TPOT_MS: 1_000.0}


def test_api_rule() -> None:
    assert api_max_tokens(100, 50, None) == 50  # no limit
    assert api_max_tokens(100, 50, 200) == 50
    assert api_max_tokens(100, 150, 200) == 100  # cut to the room left, served
    assert api_max_tokens(199, 50, 200) == 1
    assert api_max_tokens(200, 50, 200) is None  # no room for one output token
    assert api_max_tokens(300, 5, 200) is None
    assert api_max_tokens(10, 201, 200) is None  # max_tokens alone beyond the length
    a = Arrival(0.0, "a", 100, 150, SLO, output_tokens=120)
    cut = admitted(a, 200)
    assert cut is not None and cut.max_tokens == 100 and cut.target_tokens == 100
    assert admitted(a, 1000) is a and admitted(a, 100) is None


def test_model_len_from_the_trace_capped_by_the_pool() -> None:
    arrivals = [Arrival(0.0, "a", 100, 50, SLO), Arrival(0.0, "b", 30_000, 500, SLO)]
    assert model_len_for(arrivals, num_blocks=10_000) == 30_500
    assert model_len_for(arrivals, num_blocks=1_001) == 16_000  # 1,000 usable blocks of 16


def test_simulator_refuses_counts_and_cuts() -> None:
    arrivals = [
        Arrival(0.0, "short", 1_000, 20, SLO),
        Arrival(0.1, "long", 40_000, 20, SLO),  # beyond the pool's 16,000 tokens: refused
        Arrival(0.2, "edge", 15_990, 20, SLO),  # served, its output cut to 10 tokens
    ]
    replay = replay_simulator(arrivals, PROFILE, "slide", num_blocks=1_001)
    assert replay.refused == ["long"]
    assert {k: len(v) for k, v in replay.token_times.items()} == {
        "short": 20,
        "long": 0,
        "edge": 10,
    }
    assert replay.arrivals["edge"].max_tokens == 10
    weights = GainWeights.from_lengths(1000.0, 250.0)
    assert tdg_ratio(replay, arrivals, weights) < 1.0  # the refused request's gain is lost
    with pytest.raises(ValueError, match="never fit"):  # a length the pool cannot hold
        replay_simulator(arrivals, PROFILE, "slide", num_blocks=1_001, max_model_len=50_000)


def test_a_refused_stage_releases_the_next() -> None:
    """The client has its 400 at once; the workflow's next stage follows ``think_s`` later."""
    first = WorkflowCall("w", 0, None, 0.0, 30.0, 60.0)
    second = WorkflowCall("w", 1, "w0", 0.5, 50.0, 60.0)
    w0 = Arrival(1.0, "w0", 40_000, 8, SLO, call=first)
    w1 = Arrival(1.0, "w1", 64, 8, SLO, call=second)
    replay = replay_simulator([w0, w1], PROFILE, "vllm-v1", num_blocks=1_001)
    assert replay.refused == ["w0"]
    assert replay.arrivals["w1"].time == 1.5 and len(replay.token_times["w1"]) == 8
