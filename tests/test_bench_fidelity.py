"""bench/sim_fidelity.py without vLLM: arguments, the workload and the simulator side."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from engine_harness.sim_replay import (
    Replay,
    identical_share,
    priority_of,
    replay_simulator,
    request_of,
    tdg_ratio,
    ttft_abs_p99_s,
)
from priority.profiles import load_profile
from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench/sim_fidelity.py")


def test_defaults(bench: ModuleType) -> None:
    cfg = bench.parse_args(["--trace", "azure_conv"])
    assert cfg.requests == 1000
    assert cfg.rate_scales == (1.0, 1.5)
    assert cfg.kv_blocks == (67_659, 12_288, 8_192)
    assert cfg.policies == ("vllm-v1", "vllm-v1-priority", "sarathi-priority", "slide")
    assert cfg.profile == "a100-qwen2-7b" and not cfg.json and not cfg.sim_only


@pytest.mark.parametrize(
    "argv",
    [
        ["--policy", "nope"],
        ["--policy", "sjf"],  # oracle lengths: cannot run in vLLM
        ["--policy", "vllm-fcfs"],  # renamed
        ["--rate-scale", "1,x"],
        ["--kv-blocks", "0"],
        ["--requests", "1"],
        ["--profile", "no-such-profile"],
    ],
)
def test_bad_arguments_exit(bench: ModuleType, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--trace", "azure_conv", *argv])
    assert exc.value.code == 2


def test_weight_and_priority_agree() -> None:
    assert priority_of(2.0) == -1 and priority_of(1.0) == 0 and priority_of(0.5) == 1


def test_sim_only_run(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--trace", "azure_conv_20min", "--requests", "80", "--rate-scale", "1,2"]
    argv += ["--kv-blocks", "67659,700", "--policy", "vllm-v1,slide", "--sim-only", "--json"]
    assert bench.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 * 2 * 2
    keys = {
        "policy",
        "trace",
        "rate_scale",
        "kv_blocks",
        "requests",
        "identical_share",
        "tdg_real",
        "tdg_sim",
        "ttft_abs_p99_s",
        "preemptions_real",
        "preemptions_sim",
        "decision_ms_per_step_real",
        "decision_ms_p99_real",
    }
    for r in rows:
        assert keys <= set(r)
        assert r["requests"] == 80 and r["trace"] == "azure_conv_20min"
        assert 0 < r["tdg_sim"] <= 1 and r["tdg_real"] is None
    tight = [r for r in rows if r["kv_blocks"] == 700 and r["rate_scale"] == 2]
    assert any(r["preemptions_sim"] > 0 for r in tight), "700 blocks at 2x must bind"
    ranks = bench.rankings(rows, ("vllm-v1", "slide"))
    assert len(ranks) == 4 and all(r["agree"] is None and len(r["ranking_sim"]) == 2 for r in ranks)


def test_replay_metrics(bench: ModuleType) -> None:
    cfg = bench.parse_args(["--trace", "azure_conv_20min", "--requests", "40"])
    cells, capacity = bench.build_cells(cfg)
    assert capacity > 0 and len(cells) == 2 * 3 * 4
    cell = cells[0]
    assert [a.priority for a in cell.arrivals] == [
        priority_of(request_of(a).weight) for a in cell.arrivals
    ]
    profile = load_profile(cfg.profile)
    a = replay_simulator(cell.arrivals, profile, "vllm-v1", num_blocks=cell.kv_blocks)
    b = replay_simulator(cell.arrivals, profile, "vllm-v1", num_blocks=cell.kv_blocks)
    assert identical_share(a, b, cell.arrivals) == 1.0
    assert ttft_abs_p99_s(a, b, cell.arrivals) == 0.0
    assert tdg_ratio(a, cell.arrivals, cell.gain_weights) == tdg_ratio(
        b, cell.arrivals, cell.gain_weights
    )
    late = Replay(token_times={k: [t + 1.0 for t in v] for k, v in a.token_times.items()})
    assert identical_share(late, a, cell.arrivals) == 0.0
    assert ttft_abs_p99_s(late, a, cell.arrivals) == pytest.approx(1.0)
    assert tdg_ratio(late, cell.arrivals, cell.gain_weights) < tdg_ratio(
        a, cell.arrivals, cell.gain_weights
    )


def test_goodput_mix_defaults(bench: ModuleType) -> None:
    cfg = bench.parse_args(["--mix", "goodput"])
    assert cfg.trace == "azure_conv,azure_code" and cfg.requests == 300
    assert cfg.rate_scales == (1.5, 2.0) and cfg.kv_blocks == (67_659, 2_048)
    assert cfg.policies == ("gmax", "slide", "vllm-v1") and cfg.lengths == "predicted"
    with pytest.raises(SystemExit):
        bench.parse_args(["--mix", "goodput", "--trace", "azure_conv"])  # one trace: no mix


def test_slide_gets_the_workload_gain_weights_as_json(bench: ModuleType) -> None:
    from priority.gain import GainWeights
    from priority.policies import make_policy

    weights = GainWeights(first_token=3.0, decode_token=1.0)
    params = bench.policy_params("slide", "0.33.0", weights)
    assert params == {"gain_weights": {"first_token": 3.0, "decode_token": 1.0}}
    json.dumps(params)  # what TIERGATE_POLICY_PARAMS carries into the plugin
    policy = make_policy("slide", load_profile("a100-qwen2-7b").estimator(), **params)
    assert policy.params.gain_weights == weights
    assert bench.policy_params("gmax", "0.33.0", weights) == {}
    assert bench.policy_params("vllm-v1", "0.23.0") == {"version": "0.23"}


def test_goodput_mix_sim_only_run(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--mix", "goodput", "--requests", "15", "--rate-scale", "2", "--kv-blocks", "67659"]
    assert bench.main([*argv, "--sim-only", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["gmax", "slide", "vllm-v1"]
    for r in rows:
        assert r["requests"] == 30 and r["goodput_real"] is None
        assert 0 < r["goodput_sim"] <= 1
        assert set(r["attainment_sim"]) == {"latency", "deadline", "compound"}
    (cell,) = bench.goodput_ratios(rows)
    by = {r["policy"]: r["goodput_sim"] for r in rows}
    assert cell["ratios"]["gmax/vllm-v1 sim"] == pytest.approx(by["gmax"] / by["vllm-v1"])
    assert cell["ratios"]["gmax/slide real"] is None
    ranks = bench.rankings(rows, ("gmax", "slide", "vllm-v1"), "goodput")
    assert ranks[0]["ranking_sim"][0] == max(by, key=lambda p: by[p])


def test_max_model_len_argument(bench: ModuleType) -> None:
    assert bench.parse_args(["--trace", "azure_conv"]).max_model_len is None  # from the trace
    assert bench.parse_args(
        ["--trace", "azure_conv", "--max-model-len", "32768"]
    ).max_model_len == (32768)
    for bad in ("x", "1"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--trace", "azure_conv", "--max-model-len", bad])


def test_long_context_sim_only_counts_refusals(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--trace", "mooncake_conv", "--requests", "30", "--rate-scale", "1"]
    argv += ["--kv-blocks", "8192,1024", "--policy", "vllm-v1", "--sim-only", "--json"]
    assert bench.main(argv) == 0
    rows = {r["kv_blocks"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[8192]["refused_sim"] == 0 and rows[8192]["max_model_len"] > 8192
    assert rows[1024]["max_model_len"] == 1023 * 16 and rows[1024]["refused_sim"] > 0


def test_cluster_arguments(bench: ModuleType) -> None:
    cfg = bench.parse_args(["--trace", "azure_conv", "--cluster", "a100-qwen2-7b,910b-qwen2-7b"])
    assert cfg.fleet == ("a100-qwen2-7b", "910b-qwen2-7b")
    assert cfg.routers == bench.DEFAULT_ROUTERS and "goroute" in cfg.routers
    for argv in (
        ["--router", "min-load"],  # without --cluster
        ["--cluster", "a100-qwen2-7b", "--router", "nope"],
        ["--cluster", "no-such-profile"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(["--trace", "azure_conv", *argv])
    with pytest.raises(SystemExit):
        bench.parse_args(["--mix", "goodput", "--cluster", "a100-qwen2-7b"])


def test_cluster_sim_only_run(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--trace", "azure_conv_20min", "--requests", "60", "--rate-scale", "2"]
    argv += ["--kv-blocks", "67659", "--policy", "vllm-v1,slide", "--sim-only", "--json"]
    argv += ["--cluster", "a100-qwen2-7b,910b-qwen2-7b", "--router", "goroute,min-load"]
    assert bench.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["router"], r["policy"]) for r in rows] == [
        ("goroute", "vllm-v1"),
        ("goroute", "slide"),
        ("min-load", "vllm-v1"),
        ("min-load", "slide"),
    ]
    assert all(0 < r["tdg_sim"] <= 1 and r["placement_share"] is None for r in rows)
    ranks = bench.rankings(rows, ("vllm-v1", "slide"))
    assert [r["router"] for r in ranks] == ["goroute", "min-load"]


def test_pd_arguments_and_sim_only_run(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = ["--cluster", "a100-qwen2-7b,910b-qwen2-7b,a100-qwen2-7b"]
    cfg = bench.parse_args(["--trace", "azure_conv", *fleet, "--pd-prefill", "1"])
    assert cfg.pd_prefill == 1 and bench.parse_args(["--trace", "azure_conv"]).pd_prefill == 0
    for argv in (["--pd-prefill", "1"], [*fleet, "--pd-prefill", "3"]):  # no --cluster; no decode
        with pytest.raises(SystemExit):
            bench.parse_args(["--trace", "azure_conv", *argv])
    argv = ["--trace", "azure_conv_20min", "--requests", "40", "--rate-scale", "2"]
    argv += ["--kv-blocks", "67659", "--policy", "vllm-v1", "--sim-only", "--json"]
    argv += [*fleet, "--router", "min-load", "--pd-prefill", "1"]
    assert bench.main(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["pd_prefill"] == 1 and row["router"] == "min-load" and 0 < row["tdg_sim"] <= 1
