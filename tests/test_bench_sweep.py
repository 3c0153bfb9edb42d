"""Smoke test of bench/policy_sweep.py on its tiny ``--quick`` configuration (bundled trace)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from priority.policies import POLICY_NAMES
from priority.routing import ROUTER_NAMES
from priority.sim import Trace, load_trace
from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def sweep() -> ModuleType:
    return load_script("bench/policy_sweep.py")


@pytest.fixture(scope="module")
def quick_run(sweep: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("sweep")
    code = sweep.main(
        [
            "--quick",
            "--out",
            str(out),
            "--json",
            str(out / "sweep.json"),
            "--markdown",
            str(out / "sweep.md"),
        ]
    )
    assert code == 0
    data = json.loads((out / "sweep.json").read_text())
    data["_out"] = out
    return data


def test_single_sweep_covers_every_policy_at_every_load(quick_run: dict, sweep: ModuleType) -> None:
    (scenario,) = quick_run["single"]
    loads = sweep.QUICK["loads"]
    capacity = scenario["capacity"]["rps"]
    assert capacity > 0
    cells = {(r["policy"], r["load"]) for r in scenario["results"]}
    assert cells == {(p, x) for p in POLICY_NAMES for x in loads}
    for r in scenario["results"]:
        assert 0.0 <= r["tdg_ratio"] <= 1.0
        assert 0.0 <= r["slo_attainment"] <= 1.0
        assert set(r["per_tier"]) == {"high", "low"}
        assert math.isclose(r["rps"], r["load"] * capacity)
        assert r["submitted"] == scenario["requests"]  # every load replays the same requests


def test_capacity_is_the_bisected_threshold(quick_run: dict, sweep: ModuleType) -> None:
    cap = quick_run["single"][0]["capacity"]
    probes = cap["probes"]
    assert probes[0][0] == cap["idle_rps"]
    assert math.isclose(cap["target_attainment"], 0.9 * cap["idle_attainment"])
    passing = [rate for rate, att in probes if att >= cap["target_attainment"]]
    failing = [rate for rate, att in probes if att < cap["target_attainment"]]
    assert cap["rps"] == max(passing)
    # the bracket closed to the quick tolerance around the capacity
    above = min(rate for rate in failing if rate > cap["rps"])
    assert above / cap["rps"] <= 1 + sweep.QUICK["rel_tol"] + 1e-9


def test_multi_sweep_covers_routers_modes_and_policies(quick_run: dict) -> None:
    policies = quick_run["config"]["multi_policies"]
    assert policies[0] == "slide" and len(policies) == 3
    assert not {"sjf", "rr-sjf"} & set(policies)  # oracle baselines are not deployable
    modes = [s["mode"] for s in quick_run["multi"]]
    assert modes == ["co-located", "pd"]
    for scenario in quick_run["multi"]:
        assert scenario["capacity"]["rps"] > 0
        cells = {(r["policy"], r["router"], r["load"]) for r in scenario["results"]}
        assert cells == {
            (p, router, x) for p in policies for router in ROUTER_NAMES for x in (0.5, 2.0)
        }


def test_outputs_written(quick_run: dict) -> None:
    out: Path = quick_run["_out"]
    assert len(list(out.glob("*.png"))) == 3
    markdown = (out / "sweep.md").read_text()
    assert markdown.count("slide / best baseline (TDG ratio):") == 3
    assert markdown.count("Same router") == 2


def test_gain_summary_flags_targets(sweep: ModuleType) -> None:
    def row(policy: str, load: float, tdg: float) -> dict:
        return {"policy": policy, "load": load, "tdg_ratio": tdg}

    results = [
        row("slide", 0.5, 0.97),
        row("a", 0.5, 1.0),
        row("b", 0.5, 0.9),
        row("slide", 1.5, 0.70),
        row("a", 1.5, 0.50),
        row("b", 1.5, 0.60),
        row("slide", 2.0, 0.81),
        row("a", 2.0, 0.60),
        row("b", 2.0, 0.55),
    ]
    low, mid, high = sweep.gain_summary(results)
    assert low["best_baseline"] == "a" and not low["meets_floor"] and low["meets_gain"] is None
    assert mid["best_baseline"] == "b" and math.isclose(mid["ratio"], 0.70 / 0.60)
    assert mid["meets_floor"] and mid["meets_gain"] is False
    assert high["meets_gain"] is True


def test_trace_head_keeps_a_prefix_of_the_trace(sweep: ModuleType) -> None:
    trace = load_trace("azure_conv_20min")
    head: Trace = sweep.trace_head(trace, 60.0)
    assert head.arrival_s is not None and trace.arrival_s is not None
    assert 2 <= len(head) < len(trace)
    assert head.arrival_s[-1] < 60.0 <= trace.arrival_s[len(head)]
    assert np.array_equal(head.prompt_tokens, trace.prompt_tokens[: len(head)])
