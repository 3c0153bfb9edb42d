"""The fleet in the real scheduler: every instance a real vLLM scheduler on the virtual clock, the
router in front, against the cluster simulator request by request (placement, every token time,
steps per instance, refusals)."""

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
from priority.sim import build_workload, load_trace  # noqa: E402

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
