"""The 1× load of a (trace, cluster): SLOs-Serve's serving capacity, measured one way everywhere.

The highest rate at which the default engine (``vllm-v1``, what vLLM 0.33 schedules;
``min-load`` routing on a cluster) keeps SLO attainment >= 90% *of its attainment near zero
load* (5% of the cluster's one-request-at-a-time service rate), found by doubling from that idle
rate then geometric bisection. Where the idle engine attains ~100% this is SLOs-Serve's
definition; bursty traces (Azure code) never reach 90%, so the target is normalised. The policy
sweep and the simulator-fidelity bench both use it, so their "1.5×" mean the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from priority.estimator import BatchLatencyEstimator
from priority.profiles import Profile
from priority.sim.cluster import ClusterConfig
from priority.sim.compare import compare_policies
from priority.sim.traces import Trace
from priority.sim.workload import build_workload

CAPACITY_POLICY = "vllm-v1"
CAPACITY_ROUTER = "min-load"
ATTAINMENT_TARGET = 0.9
IDLE_UTILIZATION = 0.05


def _prefix(trace: Trace, keep: int) -> Trace:
    def cut(column: Any) -> Any:
        return None if column is None else column[:keep]

    return replace(
        trace, **{f.name: cut(getattr(trace, f.name)) for f in fields(trace) if f.name != "name"}
    )


def trace_head(trace: Trace, seconds: float) -> Trace:
    """The requests arriving in the trace's first ``seconds`` (its own clock)."""
    if trace.arrival_s is None:
        raise ValueError(f"trace {trace.name} has no arrival times")
    keep = int(np.searchsorted(trace.arrival_s, trace.arrival_s[0] + seconds, side="left"))
    if keep < 2:
        raise ValueError(f"trace {trace.name}: fewer than 2 requests in the first {seconds} s")
    return _prefix(trace, keep)


def trace_first(trace: Trace, count: int) -> Trace:
    """The first ``count`` requests of ``trace``."""
    if trace.arrival_s is None:
        raise ValueError(f"trace {trace.name} has no arrival times")
    if count < 2:
        raise ValueError("at least 2 requests are needed")
    return _prefix(trace, count)


def zero_load_e2e_s(
    profile: Profile,
    prompt: int,
    output: int,
    estimator: BatchLatencyEstimator | None = None,
) -> float:
    """Time one request takes alone on ``profile``: its prefill plus its decode steps (each at
    the request's mean context)."""
    est = estimator or profile.estimator()
    decode_step = est.batch_time(decode_kv=[prompt + output // 2])
    return profile.zero_load_ttft_s(prompt) + (output - 1) * decode_step


def sequential_service_s(trace: Trace, profile: Profile) -> float:
    """Mean time one request takes alone on ``profile`` (:func:`zero_load_e2e_s`)."""
    est = profile.estimator()
    total = 0.0
    for prompt, output in zip(
        trace.prompt_tokens.tolist(), trace.output_tokens.tolist(), strict=True
    ):
        total += zero_load_e2e_s(profile, prompt, output, est)
    return total / len(trace)


def idle_rate(trace: Trace, profiles: Sequence[Profile]) -> float:
    """A rate at which the cluster is nearly idle: 5% of its one-request-at-a-time service rate."""
    return IDLE_UTILIZATION * sum(1.0 / sequential_service_s(trace, p) for p in profiles)


@dataclass(frozen=True)
class Capacity:
    rps: float
    """Highest probed rate meeting the target (the 1x load)."""
    idle_rps: float
    idle_attainment: float
    target_attainment: float
    probes: tuple[tuple[float, float], ...]
    """(rate, SLO attainment of the default engine), in probe order."""


def attainment_at(segment: Trace, config: ClusterConfig, rps: float, seed: int) -> float:
    workload = build_workload(segment, rps=rps, reference_profile=config.profiles[0], seed=seed)
    (summary,) = compare_policies(workload, config, [CAPACITY_POLICY])
    return float(summary["slo_attainment"])


def find_capacity(
    segment: Trace, config: ClusterConfig, *, seed: int, rel_tol: float = 0.05
) -> Capacity:
    """Bisect the rate at which ``vllm-v1`` drops below 90% of its near-idle SLO attainment.

    The bracket grows by doubling from the idle rate, then closes geometrically until
    ``hi / lo <= 1 + rel_tol``. Attainment is assumed to fall with load (it does, up to noise,
    because every rate replays the same requests).
    """
    probes: list[tuple[float, float]] = []

    def probe(rps: float) -> float:
        value = attainment_at(segment, config, rps, seed)
        probes.append((rps, value))
        return value

    idle = idle_rate(segment, config.profiles)
    idle_att = probe(idle)
    if idle_att <= 0:
        raise RuntimeError(f"{CAPACITY_POLICY} attains no SLO on {segment.name} even when idle")
    target = ATTAINMENT_TARGET * idle_att
    lo, hi = idle, idle * 2
    while probe(hi) >= target:
        lo, hi = hi, hi * 2
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if probe(mid) >= target:
            lo = mid
        else:
            hi = mid
    return Capacity(lo, idle, idle_att, target, tuple(probes))


def single_instance_capacity(segment: Trace, profile: Profile, *, seed: int) -> Capacity:
    """:func:`find_capacity` of one instance of ``profile``."""
    config = ClusterConfig(profiles=[profile], policy=CAPACITY_POLICY, router=CAPACITY_ROUTER)
    return find_capacity(segment, config, seed=seed)
