"""Whole-simulator scenarios: SLOs-Serve's Fig. 3 and every policy draining a real workload."""

from __future__ import annotations

import pytest

from priority.estimator import LatencyCoefficients
from priority.gain import GainWeights, mean_tpot_s, ttft_s
from priority.policies import POLICY_NAMES
from priority.profiles import EngineConfig, Profile, load_profile
from priority.request import SLO, Request
from priority.sim import ClusterConfig, PdConfig, build_workload, load_trace, simulate
from priority.sim.compare import configure
from priority.sim.workload import RequestSpec, Workload

# SLOs-Serve Fig. 3: the engine computes 6 tokens per time unit (1/6 unit per token, no fixed
# cost); 3 decodes are running when a burst of 4 requests with 6-token prompts arrives.
# SLOs: TTFT 6 units, TPOT 1 unit.
FIG3_PROFILE = Profile(
    "slos-serve-fig3",
    "toy",
    "toy",
    1,
    LatencyCoefficients(a_p=0.0, b_p=0.0, c_p=1 / 6, a_d=0.0, b_d=1 / 6, t_c=0.0),
    EngineConfig(block_size=1, num_kv_blocks=10_000, max_num_batched_tokens=6, max_num_seqs=64),
)


def fig3_workload() -> Workload:
    running = [
        RequestSpec(f"d{i}", 0.0, 1, 16, SLO(ttft_s=1.0, tpot_s=1.0), "t", 1.0, "t")
        for i in (1, 2, 3)
    ]
    burst = [
        RequestSpec(f"n{i}", 1.0, 6, 8, SLO(ttft_s=6.0, tpot_s=1.0), "t", 1.0, "t")
        for i in (1, 2, 3, 4)
    ]
    return Workload("slos-serve-fig3", tuple(running + burst), GainWeights(6.0, 1.0))


def run_fig3(policy: str) -> dict[str, Request]:
    workload = fig3_workload()
    params = {"min_chunk_tokens": 1} if policy == "slide" else {}
    config = ClusterConfig(
        profiles=[FIG3_PROFILE], policy=policy, router="round-robin", policy_params=params
    )
    run = simulate(workload, configure(config, policy, workload))
    assert all(r.is_finished for r in run.requests)
    return {r.request_id: r for r in run.requests}


def test_fig3_prefill_first_breaks_the_running_decodes() -> None:
    done = run_fig3("vllm-v0-fcfs")
    # the burst's prompts run as whole prefill-only batches: the 3 running streams stall
    for rid in ("d1", "d2", "d3"):
        assert mean_tpot_s(done[rid].token_times) > 1.0
    first_tokens = sorted(done[f"n{i}"].token_times[0] for i in (1, 2, 3, 4))
    assert first_tokens == pytest.approx([2.0, 3.0, 4.0, 5.0])  # one prompt per unit


def test_fig3_decode_first_delays_the_third_prefill_to_slot_11() -> None:
    done = run_fig3("sarathi-fcfs")
    for rid in ("d1", "d2", "d3"):
        assert mean_tpot_s(done[rid].token_times) < 1.0  # the running streams are protected
    # "request three's prefill completion delayed to the 11th time slot"
    assert done["n3"].token_times[0] == pytest.approx(11.0)
    assert ttft_s(done["n3"].arrival_s, done["n3"].token_times) > 6.0
    assert ttft_s(done["n4"].arrival_s, done["n4"].token_times) > 6.0


def on_time_first_tokens(done: dict[str, Request]) -> int:
    """Burst prompts whose first token came by its TTFT deadline (arrival 1 + 6 units)."""
    return sum(done[f"n{i}"].token_times[0] <= 7.0 + 1e-9 for i in (1, 2, 3, 4))


def test_fig3_slide_balances_both_stages() -> None:
    slide, prefill_first, decode_first = (
        run_fig3(p) for p in ("slide", "vllm-v0-fcfs", "sarathi-fcfs")
    )
    # SlideBatching serves 3 of the 4 new prompts in time (SLOs-Serve's outcome) where
    # decode-first manages 2 ...
    assert on_time_first_tokens(slide) == 3
    assert on_time_first_tokens(decode_first) == 2
    # ... while stalling the running streams less than prefill-first does.
    for rid in ("d1", "d2", "d3"):
        assert mean_tpot_s(slide[rid].token_times) < mean_tpot_s(prefill_first[rid].token_times)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_drains_a_real_trace_with_preemption(policy: str) -> None:
    """Tight KV (forces recompute preemption), 2x load, two instances: all requests finish."""
    base = load_profile("a100-qwen2-7b")
    tight = Profile(
        "tight",
        base.hardware,
        base.model,
        1,
        base.coefficients,
        EngineConfig(
            block_size=16, num_kv_blocks=400, max_num_batched_tokens=2048, max_num_seqs=64
        ),
    )
    workload = build_workload(
        load_trace("azure_conv_20min"),
        rate_scale=2.0,
        duration_s=20.0,
        seed=1,
        reference_profile=tight,
    )
    config = configure(
        ClusterConfig(profiles=[tight, tight], policy=policy, router="min-load"), policy, workload
    )
    run = simulate(workload, config)
    assert not run.stalled
    servable = [r for r in run.requests if r not in run.rejected]
    assert servable and all(r.is_finished for r in servable)
    for r in servable:
        assert r.num_output_tokens == r.target_output_tokens
        assert all(a < b for a, b in zip(r.token_times, r.token_times[1:], strict=False))
    assert sum(s.preemptions for s in run.instances) > 0 or policy == "vllm-v0-fcfs"


@pytest.mark.parametrize("policy", ["slide", "sarathi-priority"])
def test_pd_disaggregated_cluster_drains(policy: str) -> None:
    profile = load_profile("910b-qwen2-7b")
    workload = build_workload(
        load_trace("azure_conv_20min"),
        rate_scale=1.0,
        duration_s=20.0,
        seed=2,
        reference_profile=profile,
    )
    config = ClusterConfig(
        profiles=[profile] * 3, policy=policy, router="goroute", pd=PdConfig(num_prefill=1)
    )
    run = simulate(workload, configure(config, policy, workload))
    assert all(r.is_finished for r in run.requests)
