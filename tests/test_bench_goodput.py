"""bench/goodput.py on a tiny configuration: the mix's contract, the JSON's structure, every
policy x load x lengths cell, and ratios that follow from the raw numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from priority.policies import POLICY_NAMES
from priority.profiles import load_profile
from priority.sim import load_trace
from tests.scripts_loader import load_script

LOADS = (1.5, 3.0)
REQUESTS = 24


@pytest.fixture(scope="module")
def goodput() -> ModuleType:
    return load_script("bench/goodput.py")


@pytest.fixture(scope="module")
def code_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, code-like trace (bursts of long prompts, short outputs), generated here."""
    rng = np.random.default_rng(7)
    gaps = np.where(rng.random(60) < 0.4, 0.0, rng.exponential(0.5, 60))
    rows = [
        f"{t:.4f},{int(p)},{int(o)}"
        for t, p, o in zip(
            np.cumsum(gaps), rng.integers(500, 3000, 60), rng.integers(2, 60, 60), strict=True
        )
    ]
    path = tmp_path_factory.mktemp("traces") / "code_like.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def run(goodput: ModuleType, code_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("goodput")
    code = goodput.main(
        [
            "--trace",
            f"azure_conv_20min,{code_trace}",
            "--requests",
            str(REQUESTS),
            "--loads",
            ",".join(map(str, LOADS)),
            "--rel-tol",
            "0.5",
            "--out",
            str(out / "goodput.json"),
            "--markdown",
            str(out / "goodput.md"),
            "--plot",
            str(out),
        ]
    )
    assert code == 0
    # strict JSON: no NaN
    data = json.loads(
        (out / "goodput.json").read_text(), parse_constant=lambda c: pytest.fail(f"JSON has {c}")
    )
    data["_out"] = out
    return data


def test_every_policy_load_and_lengths_cell_appears_once(run: dict) -> None:
    assert set(run) >= {"config", "mix", "capacity", "results", "ratios", "wall_s"}
    cells = [(r["lengths"], r["load"], r["policy"]) for r in run["results"]]
    assert len(cells) == len(set(cells))
    assert set(cells) == {
        (m, x, p) for m in ("predicted", "oracle") for x in LOADS for p in POLICY_NAMES
    }
    capacity = run["capacity"]["rps"]
    assert capacity > 0
    for r in run["results"]:
        assert math.isclose(r["rps"], r["load"] * capacity)
        assert r["submitted"] == run["mix"]["requests"] == 2 * REQUESTS  # same requests each load
        assert 0.0 <= r["request_goodput_share"] <= 1.0 and 0.0 <= r["token_goodput_share"] <= 1
        assert 0.0 <= r["jain_tenant"] <= 1.0
        assert set(r["attainment"]) == {"latency", "deadline", "compound"}


def test_goodput_is_the_sum_over_kinds(run: dict) -> None:
    for r in run["results"]:
        kinds = r["per_kind"]
        assert r["request_goodput"] == sum(k["goodput_requests"] for k in kinds.values())
        assert r["token_goodput"] == pytest.approx(sum(k["goodput_tokens"] for k in kinds.values()))
        assert r["request_goodput_share"] == pytest.approx(r["request_goodput"] / r["submitted"])
        for name, k in kinds.items():
            assert r["attainment"][name] == pytest.approx(k["goodput_requests"] / k["submitted"])


def test_ratios_follow_from_the_raw_numbers(run: dict, goodput: ModuleType) -> None:
    assert [(q["lengths"], q["load"]) for q in run["ratios"]] == [
        (m, x) for m in ("predicted", "oracle") for x in LOADS
    ]
    for q in run["ratios"]:
        cell = {
            r["policy"]: r
            for r in run["results"]
            if (r["lengths"], r["load"]) == (q["lengths"], q["load"])
        }

        def good(p: str, cell: dict = cell) -> float:
            return float(cell[p]["request_goodput"])

        def same(value: float | None, num: float, den: float) -> None:
            if den > 0:
                assert value == pytest.approx(num / den)
            else:
                assert value is None  # NaN in the results, null in the JSON

        same(q["gmax_over_fcfs"], good("gmax"), good("vllm-v0-fcfs"))
        same(q["gmax_over_stock"], good("gmax"), good("vllm-v1"))
        same(q["gmax_over_oracle"], good("gmax"), good("gmax-oracle"))
        others = [p for p in POLICY_NAMES if not p.startswith("gmax")]
        others = [p for p in others if p not in ("sjf", "rr-sjf", "tempo-oracle")]
        assert q["best_non_gmax"] in others
        assert good(q["best_non_gmax"]) == max(good(p) for p in others)
        same(q["gmax_over_best"], good("gmax"), good(q["best_non_gmax"]))
        assert q["fair_jain"] == cell["gmax-fair"]["jain_tenant"]
        if good("gmax") > 0:
            assert q["fair_cost"] == pytest.approx(1 - good("gmax-fair") / good("gmax"))
        # the gain targets apply at 1.5-2x capacity only
        assert ("gmax_over_fcfs" in q["verdicts"]) == (1.5 <= q["load"] <= 2.0)
        assert set(q["verdicts"]) >= {"gmax_over_oracle", "fair_jain", "fair_cost"}


def test_outputs_written(run: dict) -> None:
    out: Path = run["_out"]
    assert sorted(p.name for p in out.glob("*.png")) == [
        "goodput-oracle.png",
        "goodput-predicted.png",
    ]
    markdown = (out / "goodput.md").read_text()
    assert markdown.count("Request-goodput ratios") == 2
    assert markdown.count("| gmax-fair-oracle |") == 2


def test_mix_is_one_third_each_kind_with_workflows_and_scaled_slos(
    goodput: ModuleType, code_trace: Path
) -> None:
    profile = load_profile("a100-qwen2-7b")
    traces = [load_trace("azure_conv_20min"), load_trace(code_trace)]
    mix, info = goodput.build_mix(traces, profile, 30, seed=3)
    again, _ = goodput.build_mix(traces, profile, 30, seed=3)
    other, _ = goodput.build_mix(traces, profile, 30, seed=4)
    assert mix.kind == again.kind and mix.kind != other.kind  # deterministic from the seed
    assert info.per_kind == {"latency": 20, "deadline": 20, "compound": 20}
    assert np.all(np.diff(mix.arrival_s) >= 0)
    assert mix.arrival_s[0] == 0.0 and mix.arrival_s[-1] == 1.0  # both traces on one span
    est = profile.estimator()
    assert info.tpot_s > 4 * est.batch_time(decode_kv=[1])  # S x a real decode step
    workflows: dict[str, list[int]] = {}
    for k, kind in enumerate(mix.kind):
        if kind == "latency":
            assert mix.tpot_slo_s[k] == info.tpot_s and mix.ttft_slo_s[k] >= 0.2
            assert math.isnan(mix.deadline_s[k])
            continue
        assert math.isnan(mix.tpot_slo_s[k])
        source = str(mix.tenant[k]).split("/")[0]
        if kind == "deadline":
            assert mix.deadline_s[k] == info.deadline_s[source]
        else:
            workflows.setdefault(str(mix.workflow_id[k]), []).append(k)
    assert len(workflows) == info.workflows
    for members in workflows.values():
        stages = [int(mix.stage[k]) for k in members]
        assert stages == list(range(len(members))) and len(members) <= 4
        source = str(mix.tenant[members[0]]).split("/")[0]
        think = sum(float(mix.think_s[k]) for k in members)
        assert float(mix.think_s[members[0]]) == 0.0
        expected = len(members) * info.deadline_s[source] + think
        assert all(mix.deadline_s[k] == pytest.approx(expected) for k in members)


def test_verdicts_name_the_miss(goodput: ModuleType) -> None:
    row = {
        "load": 1.5,
        "gmax_over_fcfs": 1.5,
        "gmax_over_best": 1.25,
        "gmax_over_oracle": 0.9,
        "fair_jain": math.nan,
        "fair_cost": 0.02,
    }
    v = goodput.verdicts(row)
    assert v == {
        "gmax_over_fcfs": "missed by 0.500",
        "gmax_over_best": "met",
        "gmax_over_oracle": "missed by 0.050",
        "fair_jain": "n/a",
        "fair_cost": "met",
    }
    assert "gmax_over_fcfs" not in goodput.verdicts({**row, "load": 3.0})
