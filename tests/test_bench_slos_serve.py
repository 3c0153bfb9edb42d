"""bench/slos_serve_capacity.py on a tiny input: scenarios, bisection, ratios, planner timing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from priority.sim.traces import Trace
from tests.scripts_loader import load_script

bench = load_script("bench/slos_serve_capacity.py")


def test_tool_scenario_is_a_chain_of_continuations() -> None:
    (scenario,) = bench.scenarios(["tools"], 60, seed=0)
    trace = scenario.trace
    assert len(trace) == 60
    stages = np.asarray(trace.stage)
    assert stages.max() >= 1 and (stages == 0).any()
    for k in np.flatnonzero(stages > 0).tolist():
        # a continuation: same workflow, the previous prompt and output plus a tool response
        assert trace.workflow_id[k] == trace.workflow_id[k - 1]
        grown = trace.prompt_tokens[k] - trace.prompt_tokens[k - 1] - trace.output_tokens[k - 1]
        assert 50 <= grown <= 400
        assert trace.think_s[k] == bench.TOOL_THINK_S


def test_ratios_are_capacity_over_capacity() -> None:
    table = {"a": {"slos-serve": 4.0, "vllm-v1": 2.0}, "b": {"slos-serve": 9.0, "vllm-v1": 1.0}}
    ratios = bench.ratios(table, ["slos-serve", "vllm-v1"])["vllm-v1"]
    assert ratios["a"] == 2.0 and ratios["b"] == 9.0
    assert ratios["geomean"] == pytest.approx(math.sqrt(18.0))


def test_a_small_run_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--requests", "24", "--scenarios", "chat,tools", "--policies", "slos-serve,vllm-v1"]
    assert bench.main([*args, "--planner-repeats", "2", "--rel-tol", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("chat", "tools"):
        row = out["capacity_rps"][name]
        assert set(row) == {"slos-serve", "vllm-v1"} and all(v >= 0 for v in row.values())
    assert out["planner"]["planner_p99_ms"] > 0
    assert 0.0 <= out["planner"]["fallback_share"] <= 1.0


def test_the_cheapest_share_drops_whole_workflows_costliest_first() -> None:
    profile = bench.load_profile("a100-qwen2-7b")
    (tools,) = bench.scenarios(["tools"], 60, seed=0)
    kept = bench.cheapest_share(tools.trace, profile, 0.5)
    assert 0 < len(kept) <= 30
    wids = tools.trace.workflow_id
    assert wids is not None and kept.workflow_id is not None
    for wid in set(kept.workflow_id):  # a workflow is kept with every one of its calls
        assert kept.workflow_id.count(wid) == wids.count(wid)
    (chat,) = bench.scenarios(["chat"], 40, seed=0)
    kept = bench.cheapest_share(chat.trace, profile, 0.9)
    assert len(kept) == 36

    def cost(trace: Trace) -> np.ndarray:  # isolated engine time: prefill, then decodes
        est = profile.estimator()
        p = trace.prompt_tokens
        o = trace.output_tokens.astype(float)
        decode = o * (est.coefficients.b_d + est.coefficients.a_d * (p + o / 2))
        return np.asarray(est.request_times(p, np.zeros_like(p)) + decode)

    every, cheap = sorted(cost(chat.trace).tolist()), sorted(cost(kept).tolist())
    assert cheap == every[:36]  # the four costliest are the ones dropped


def test_the_bound_rises_when_the_costliest_requests_are_dropped() -> None:
    profile = bench.load_profile("a100-qwen2-7b")
    (chat,) = bench.scenarios(["chat"], 40, seed=0)
    everything = bench.throughput_bound(chat, profile, 0, share=1.0)
    assert 0 < everything < bench.throughput_bound(chat, profile, 0, share=0.9)
