"""Shared replay scenarios of the agreement tests: a real trace's head, with and without KV
pressure (imports nothing from vLLM)."""

from __future__ import annotations

import dataclasses
from functools import cache

from engine_harness.sim_replay import Arrival, arrivals_from_workload
from priority.profiles import load_profile
from priority.sim import build_workload, load_trace

PROFILE = "a100-qwen2-7b"
REQUESTS = 240
RPS = 8.0
"""Above what 1,500 blocks serve without preempting (well below what 67,659 blocks serve)."""
KV_POOLS = {"ample": 67_659, "tight": 1_500}
"""vLLM KV pools in blocks: the profile's (never binds) and one that binds and preempts."""


@cache
def arrivals() -> tuple[Arrival, ...]:
    """The bundled Azure conversation trace's first requests, default tiers and SLOs."""
    trace = load_trace("azure_conv_20min")
    head = dataclasses.replace(
        trace,
        arrival_s=trace.arrival_s[:REQUESTS] if trace.arrival_s is not None else None,
        prompt_tokens=trace.prompt_tokens[:REQUESTS],
        output_tokens=trace.output_tokens[:REQUESTS],
    )
    workload = build_workload(head, rps=RPS, reference_profile=load_profile(PROFILE), seed=0)
    return tuple(arrivals_from_workload(workload))


def vllm_params(policy: str, version: str) -> dict[str, str]:
    """The V1 transcriptions follow the vLLM version under test."""
    if policy.startswith("vllm-v1") and version.startswith("0.23"):
        return {"version": "0.23"}
    return {}
