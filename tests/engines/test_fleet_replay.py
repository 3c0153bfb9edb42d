"""The fleet in the real scheduler: every instance a real vLLM scheduler on the virtual clock, the
router in front, against the cluster simulator request by request (placement, every token time,
steps per instance, refusals); co-located, and PD-disaggregated with the KV handed from prefill
to decode schedulers through vLLM's KV-connector interface."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")
fleet = pytest.importorskip("engine_harness.fleet_replay")

from engine_harness.sim_replay import (  # noqa: E402
    Arrival,
    arrivals_from_workload,
    identical_share,
    placement_share,
    replay_fleet_simulator,
)
from priority.profiles import load_profile  # noqa: E402
from priority.sim import KvTransferModel, PdConfig, build_workload, load_trace  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

FLEET = ("a100-qwen2-7b", "910b-qwen2-7b", "a100-qwen2-7b")
REQUESTS = 90


@cache
def arrivals(trace_name: str = "azure_conv_20min", rps: float = 12.0) -> tuple[Arrival, ...]:
    """A trace's head at a rate that queues work on the three instances."""
    trace = load_trace(trace_name)
    head = dataclasses.replace(
        trace,
        arrival_s=trace.arrival_s[:REQUESTS] if trace.arrival_s is not None else None,
        prompt_tokens=trace.prompt_tokens[:REQUESTS],
        output_tokens=trace.output_tokens[:REQUESTS],
    )
    workload = build_workload(head, rps=rps, reference_profile=load_profile(FLEET[0]), seed=0)
    return tuple(arrivals_from_workload(workload))


@pytest.mark.parametrize(
    ("policy", "router", "blocks"),
    [
        ("slide", "goroute", 67_659),
        ("slide", "least-predicted-ttft", 300),  # the pool binds: preemptions on both sides
        ("vllm-v1", "min-load", 67_659),
        ("sarathi-priority", "power-of-two", 67_659),
    ],
)
def test_fleet_agrees_request_by_request(
    policy: str, router: str, blocks: int, tiny_model_dir: Path
) -> None:
    cases = arrivals()
    profiles = [load_profile(p) for p in FLEET]
    params = {"seed": 0} if router == "goroute" else {}  # power-of-two: seeded by default
    sim = replay_fleet_simulator(
        cases, profiles, policy, router, num_blocks=blocks, router_params=params
    )
    real = fleet.replay_fleet_vllm(
        cases,
        tiny_model_dir,
        profiles,
        router,
        num_blocks=blocks,
        policy=policy,
        router_params=params,
    )
    assert len(set(real.placement.values())) == len(FLEET)  # every instance took work
    assert placement_share(real, sim) == 1.0
    assert real.steps == sim.steps and real.preemptions == sim.preemptions
    assert (sum(real.preemptions) > 0) is (blocks < 10_000)
    assert identical_share(real.replay, sim.replay, cases) == 1.0
    for a in cases:
        assert len(real.replay.token_times[a.request_id]) == a.target_tokens
        np.testing.assert_allclose(
            real.replay.token_times[a.request_id],
            sim.replay.token_times[a.request_id],
            rtol=0,
            atol=1e-9,
        )


def test_stock_vllm_fleet_and_refusals(tiny_model_dir: Path) -> None:
    """Stock vLLM behind Min-Load on long prompts: what the API server refuses is refused on both
    sides, the rest agrees."""
    cases = arrivals("mooncake_conv", rps=1.0)[:30]
    profiles = [load_profile(p) for p in FLEET]
    sim = replay_fleet_simulator(cases, profiles, "vllm-v1", "min-load", num_blocks=2_048)
    real = fleet.replay_fleet_vllm(
        cases, tiny_model_dir, profiles, "min-load", num_blocks=2_048, stock_policy="fcfs"
    )
    assert real.replay.refused == sim.replay.refused and real.replay.refused
    assert placement_share(real, sim) == 1.0 and real.steps == sim.steps
    assert identical_share(real.replay, sim.replay, cases) == 1.0


PD = PdConfig(num_prefill=1, transfer=KvTransferModel(per_token_s=2e-6, fixed_s=1e-3))
"""One prefill instance (the A100) in front of two decode instances (a 910B, an A100)."""


@pytest.mark.parametrize(
    ("policy", "router", "blocks"),
    [
        (None, "min-load", 67_659),  # stock vLLM
        (None, "least-predicted-ttft", 300),  # the decode pools bind: preemptions, recompute
        ("vllm-v1", "power-of-two", 300),
        # the policy plans a landed request as the one token vLLM will compute (its view counts
        # the connector's tokens as computed), as the simulator does
        ("slide", "goroute", 67_659),
        ("slide", "least-predicted-ttft", 300),
    ],
)
def test_pd_fleet_agrees_request_by_request(
    policy: str | None, router: str, blocks: int, tiny_model_dir: Path
) -> None:
    """Prefill schedulers hand each request's KV to the decode scheduler the router binds at the
    first token; the decode side admits it with the prompt computed, as the simulator does."""
    cases = arrivals()
    profiles = [load_profile(p) for p in FLEET]
    params = {"seed": 0} if router == "goroute" else {}
    sim = replay_fleet_simulator(
        cases, profiles, policy or "vllm-v1", router, num_blocks=blocks, router_params=params, pd=PD
    )
    real = fleet.replay_fleet_vllm(
        cases,
        tiny_model_dir,
        profiles,
        router,
        num_blocks=blocks,
        policy=policy,
        router_params=params,
        pd=PD,
    )
    assert set(real.placement.values()) == {0}
    assert set(real.decode_placement.values()) <= {1, 2} and real.decode_placement
    if router != "goroute":  # GoRouting decodes on the A100 alone at this load
        assert set(real.decode_placement.values()) == {1, 2}
    assert placement_share(real, sim) == 1.0  # prefill and decode instance, request by request
    assert real.steps == sim.steps and real.preemptions == sim.preemptions
    assert (sum(real.preemptions[1:]) > 0) is (blocks < 10_000) and real.preemptions[0] == 0
    assert identical_share(real.replay, sim.replay, cases) == 1.0
    for a in cases:
        assert len(real.replay.token_times[a.request_id]) == a.target_tokens


def test_pd_handoff_decodes_without_recomputing_the_prompt(tiny_model_dir: Path) -> None:
    """One request: the prefill scheduler runs the prompt and the first token; the decode
    scheduler, given the KV by the connector, computes only one token a step, and its first
    decode step starts when the KV lands (the transfer time after the first token)."""
    slo = {k: v for k, v in arrivals()[0].extra_args.items()}
    case = [Arrival(0.0, "solo", 1_000, 8, slo)]
    profiles = [load_profile(p) for p in FLEET]
    real = fleet.replay_fleet_vllm(
        case, tiny_model_dir, profiles, "min-load", num_blocks=4_096, pd=PD
    )
    sim = replay_fleet_simulator(case, profiles, "vllm-v1", "min-load", num_blocks=4_096, pd=PD)
    times = real.replay.token_times["solo"]
    decode = real.decode_placement["solo"]
    assert real.steps[0] == 1 and real.steps[decode] == 7 and sum(real.steps) == 8
    assert times == pytest.approx(sim.replay.token_times["solo"], abs=1e-9, rel=0)
    coefficients = profiles[decode].coefficients
    landed = times[0] + PD.transfer.transfer_s(1_000)
    step = coefficients.t_c + coefficients.a_d * 1_000 + coefficients.b_d  # a decode at l_kv 1000
    assert times[1] == pytest.approx(landed + step, abs=1e-12, rel=0)
