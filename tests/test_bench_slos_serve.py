"""bench/slos_serve_capacity.py on a tiny input: scenarios, bisection, ratios, planner timing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

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
