"""Discrete-event simulator: engine core, cluster event loop, workloads and metrics."""

from priority.sim.cluster import (
    ClusterConfig,
    InstanceStats,
    KvTransferModel,
    PdConfig,
    SimResult,
    simulate,
)
from priority.sim.engine import EngineCore, PolicyViolation, StepInFlight, StepOutcome
from priority.sim.metrics import summarize
from priority.sim.traces import NAMED_TRACES, Trace, load_trace, resolve_trace, shared_data_dir
from priority.sim.workload import (
    RequestSpec,
    SloPolicy,
    Tier,
    TierMix,
    Workload,
    build_workload,
    poisson_workload,
)

__all__ = [
    "NAMED_TRACES",
    "ClusterConfig",
    "EngineCore",
    "InstanceStats",
    "KvTransferModel",
    "PdConfig",
    "PolicyViolation",
    "RequestSpec",
    "SimResult",
    "SloPolicy",
    "StepInFlight",
    "StepOutcome",
    "Tier",
    "TierMix",
    "Trace",
    "Workload",
    "build_workload",
    "load_trace",
    "poisson_workload",
    "resolve_trace",
    "shared_data_dir",
    "simulate",
    "summarize",
]
