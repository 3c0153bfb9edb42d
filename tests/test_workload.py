"""Trace CSV contract, rate scaling, tier mix, SLO assignment and reproducibility."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from priority.estimator import LatencyCoefficients
from priority.profiles import EngineConfig, Profile
from priority.sim.traces import load_trace, shared_data_dir
from priority.sim.workload import SloPolicy, Tier, TierMix, build_workload, poisson_workload

PROFILE = Profile(
    name="wl-test",
    hardware="test",
    model="test",
    tensor_parallel=1,
    coefficients=LatencyCoefficients(a_p=1e-8, b_p=2e-9, c_p=5e-5, a_d=2e-7, b_d=2e-4, t_c=5e-3),
    engine=EngineConfig(block_size=16, num_kv_blocks=4096, max_num_batched_tokens=2048),
)


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BASIC = "arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.5,3000,20\n2.0,50,5\n"


def test_basic_trace_loads(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, BASIC))
    assert trace.arrival_s is not None
    assert trace.arrival_s.tolist() == [0.0, 0.5, 2.0]
    assert trace.prompt_tokens.tolist() == [100, 3000, 50]
    assert trace.output_tokens.tolist() == [10, 20, 5]
    assert trace.tier is None and trace.ttft_slo_s is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("arrival_s,prompt_tokens\n0,5\n", "missing required column.*output_tokens"),
        ("arrival_s,prompt_tokens,output_tokens\n0,abc,5\n", "line 2 column prompt_tokens.*'abc'"),
        ("arrival_s,prompt_tokens,output_tokens\n0,5,0\n", "line 2 column output_tokens.*>= 1"),
        ("arrival_s,prompt_tokens,output_tokens\n0,5,-3\n", "output_tokens.*>= 1"),
        ("arrival_s,prompt_tokens,output_tokens\n0,5.5,3\n", "not a whole number"),
        (
            "arrival_s,prompt_tokens,output_tokens\n0,5,3\n1,5,3\n0.5,5,3\n",
            "line 4.*non-decreasing",
        ),
        ("arrival_s,prompt_tokens,output_tokens\n-1,5,3\n", "arrival must be finite and >= 0"),
        ("arrival_s,prompt_tokens,output_tokens\n", "no data rows"),
        ("", "missing header"),
        ("arrival_s,prompt_tokens,output_tokens\n0,5\n", "line 2: 2 cells"),
        ("arrival_s,prompt_tokens,output_tokens,tpot_slo_ms\n0,5,3,-2\n", "tpot_slo_ms.*positive"),
    ],
)
def test_contract_errors_are_precise(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_trace(write(tmp_path, text))


def test_unknown_named_trace_lists_the_names() -> None:
    with pytest.raises(ValueError, match="azure_conv"):
        load_trace("no_such_trace")


OVERRIDES = (
    "arrival_s,prompt_tokens,output_tokens,tenant,tier,weight,ttft_slo_ms,tpot_slo_ms,deadline_ms\n"
    "0.0,100,10,acme,gold,5,,,\n"  # tier outside the mix with its weight
    "0.1,100,10,,low,,300,40,\n"  # mix tier: mix weight; explicit SLOs
    "0.2,100,10,,,,,,\n"  # all defaults
    "0.3,100,10,,,3,none,none,2000\n"  # default tier, weight overridden; deadline-only
    "0.4,100,10,,high,,,,1500\n"  # streaming default plus a deadline
)


def test_override_columns_win_per_row_and_blanks_fall_back(tmp_path: Path) -> None:
    slo = SloPolicy(ttft_scale=5.0, ttft_floor_s=0.0, tpot_s=0.1)
    wl = build_workload(write(tmp_path, OVERRIDES), reference_profile=PROFILE, slo=slo, seed=3)
    specs = wl.specs
    default_ttft = 5.0 * PROFILE.zero_load_ttft_s(100)
    assert (specs[0].tenant, specs[0].tier, specs[0].weight) == ("acme", "gold", 5.0)
    assert specs[0].slo.ttft_s == pytest.approx(default_ttft) and specs[0].slo.tpot_s == 0.1
    assert (specs[1].tier, specs[1].weight, specs[1].tenant) == ("low", 1.0, "low")  # tier = tenant
    assert specs[1].slo.ttft_s == pytest.approx(0.3) and specs[1].slo.tpot_s == pytest.approx(0.04)
    assert specs[2].tier in ("high", "low")
    assert specs[2].weight == {"high": 2.0, "low": 1.0}[specs[2].tier]
    assert specs[2].slo.deadline_s is None
    assert specs[3].weight == 3.0 and specs[3].tier in ("high", "low")
    assert not specs[3].slo.is_streaming and specs[3].slo.deadline_s == pytest.approx(2.0)
    assert specs[4].weight == 2.0 and specs[4].slo.is_streaming
    assert specs[4].slo.deadline_s == pytest.approx(1.5)
    assert wl.tier_weights["gold"] == 5.0


def test_unknown_tier_without_weight_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "arrival_s,prompt_tokens,output_tokens,tier\n0,10,5,silver\n")
    with pytest.raises(ValueError, match="line 2: tier 'silver' is not in the tier mix"):
        build_workload(path, reference_profile=PROFILE)


def test_deadline_only_row_without_deadline_is_an_error(tmp_path: Path) -> None:
    text = "arrival_s,prompt_tokens,output_tokens,ttft_slo_ms,tpot_slo_ms\n0,10,5,none,none\n"
    with pytest.raises(ValueError, match="line 2: an SLO needs"):
        build_workload(write(tmp_path, text), reference_profile=PROFILE)


def _trace_text(n: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.5, size=n))
    lines = ["arrival_s,prompt_tokens,output_tokens"]
    lines += [f"{t:.6f},{rng.integers(1, 4000)},{rng.integers(1, 500)}" for t in arrivals]
    return "\n".join(lines) + "\n"


def test_rate_scale_divides_arrival_times(tmp_path: Path) -> None:
    path = write(tmp_path, _trace_text(200))
    native = build_workload(path, reference_profile=PROFILE)
    fast = build_workload(path, reference_profile=PROFILE, rate_scale=4.0)
    a = np.array([s.arrival_s for s in native.specs])
    b = np.array([s.arrival_s for s in fast.specs])
    assert np.allclose(b, a / 4.0)
    assert fast.rate_rps == pytest.approx(4.0 * native.rate_rps)
    # Priorities and lengths do not depend on the time scaling.
    assert [s.tier for s in fast.specs] == [s.tier for s in native.specs]


def test_rps_rescales_to_the_target_rate_and_duration_cuts(tmp_path: Path) -> None:
    path = write(tmp_path, _trace_text(300))
    wl = build_workload(path, reference_profile=PROFILE, rps=7.5)
    assert wl.rate_rps == pytest.approx(7.5)
    cut = build_workload(path, reference_profile=PROFILE, rps=7.5, duration_s=10.0)
    assert all(s.arrival_s < 10.0 for s in cut.specs)
    assert len(cut) == sum(1 for s in wl.specs if s.arrival_s < 10.0)
    with pytest.raises(ValueError, match="rate_scale or rps"):
        build_workload(path, reference_profile=PROFILE, rps=1.0, rate_scale=2.0)
    with pytest.raises(ValueError, match="rps must be a positive"):
        build_workload(path, reference_profile=PROFILE, rps=0.0)


def test_tier_mix_proportions_and_parse() -> None:
    mix = TierMix.parse("gold:4:0.2, silver:2:0.3, bronze:1:0.5")
    assert mix.names == ("gold", "silver", "bronze") and mix.weight_of("silver") == 2.0
    n = 20_000
    wl = poisson_workload(100.0, reference_profile=PROFILE, num_requests=n, tiers=mix, seed=9)
    counts = {name: sum(1 for s in wl.specs if s.tier == name) for name in mix.names}
    for tier in mix.tiers:
        sigma = math.sqrt(n * tier.share * (1 - tier.share))
        assert abs(counts[tier.name] - n * tier.share) < 4 * sigma
        assert all(s.weight == tier.weight for s in wl.specs if s.tier == tier.name)
    with pytest.raises(ValueError, match="sum to 1"):
        TierMix((Tier("a", 1.0, 0.5), Tier("b", 1.0, 0.6)))
    with pytest.raises(ValueError, match="name:weight:share"):
        TierMix.parse("a:1")


def test_default_tiers_are_proserve_high_low() -> None:
    wl = poisson_workload(50.0, reference_profile=PROFILE, num_requests=4000, seed=1)
    assert wl.tier_weights == {"high": 2.0, "low": 1.0}
    high = sum(1 for s in wl.specs if s.tier == "high")
    assert abs(high - 2000) < 4 * math.sqrt(1000)


def test_slo_formula() -> None:
    prompts = [10, 500, 1500, 6000]
    slo = SloPolicy(ttft_scale=3.0, ttft_floor_s=0.05, tpot_s=0.05)
    wl = poisson_workload(
        5.0, reference_profile=PROFILE, num_requests=400, prompt_tokens=prompts, slo=slo, seed=2
    )
    for spec in wl.specs:
        expected = max(3.0 * PROFILE.zero_load_ttft_s(spec.prompt_tokens), 0.05)
        assert spec.slo.ttft_s == pytest.approx(expected)
        assert spec.slo.tpot_s == 0.05 and spec.slo.deadline_s is None
    # The floor binds for the short prompt, the scale for the long one.
    assert PROFILE.zero_load_ttft_s(10) * 3.0 < 0.05 < PROFILE.zero_load_ttft_s(6000) * 3.0


def test_gain_weights_lengths_and_fresh_requests() -> None:
    wl = poisson_workload(
        5.0,
        reference_profile=PROFILE,
        num_requests=300,
        prompt_tokens=[100, 900],
        output_tokens=[50, 150],
        seed=4,
    )
    prompts = np.array([s.prompt_tokens for s in wl.specs])
    outputs = np.array([s.output_tokens for s in wl.specs])
    assert set(zip(prompts.tolist(), outputs.tolist(), strict=True)) <= {(100, 50), (900, 150)}
    assert wl.gain_weights.first_token == pytest.approx(prompts.mean() / outputs.mean())
    first, second = wl.requests(), wl.requests()
    assert first[0] is not second[0]
    r = first[0]
    assert r.max_output_tokens == r.true_output_tokens == wl.specs[0].output_tokens
    assert r.token_times == [] and r.num_computed_tokens == 0


def test_seeded_reproducibility_and_independent_streams() -> None:
    def make(seed: int, tiers: TierMix | None = None) -> list[tuple[float, int, str]]:
        wl = poisson_workload(
            3.0,
            reference_profile=PROFILE,
            duration_s=60.0,
            prompt_tokens=[10, 20, 30],
            tiers=tiers,
            seed=seed,
        )
        return [(s.arrival_s, s.prompt_tokens, s.tier) for s in wl.specs]

    assert make(1) == make(1)
    assert make(1) != make(2)
    other_mix = TierMix.parse("a:3:0.9,b:1:0.1")
    assert [x[:2] for x in make(1, other_mix)] == [x[:2] for x in make(1)]
    assert all(t < 60.0 for t, _, _ in make(1))


def _has_shared_traces() -> bool:
    try:
        return (shared_data_dir() / "traces" / "azure_conv.csv").is_file()
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _has_shared_traces(), reason="shared trace data not available")
def test_named_traces_resolve() -> None:
    conv = load_trace("azure_conv")
    assert conv.name == "azure_conv" and len(conv) == 19_366
    arxiv = load_trace("arxiv")
    assert arxiv.lengths_only and len(arxiv) > 1000
    with pytest.raises(ValueError, match="lengths only"):
        build_workload(arxiv, reference_profile=PROFILE)
    wl = build_workload(arxiv, reference_profile=PROFILE, rps=4.0, duration_s=30.0, seed=1)
    assert all(s.arrival_s < 30.0 for s in wl.specs)
    assert 60 < len(wl) < 200  # Poisson(120)
