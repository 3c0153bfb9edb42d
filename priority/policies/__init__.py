"""Engine-level scheduling policies, all behind :class:`SchedulingPolicy`.

Policies are looked up by the names the CLI, the simulator, the emulated engines and the vLLM
plugins accept, in one registry of :class:`~priority.policies.plugin.PolicyPlugin` (name,
parameters dataclass, factory).
"""

from __future__ import annotations

from typing import Any

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import (
    BatchBuilder,
    EngineLimits,
    SchedulerInput,
    SchedulingPolicy,
    StepPlan,
)
from priority.policies.fairbatching import FairBatchingPolicy
from priority.policies.gmax import (
    GmaxFairOraclePolicy,
    GmaxFairPolicy,
    GmaxOraclePolicy,
    GmaxPolicy,
)
from priority.policies.params import PolicyParamsError
from priority.policies.plugin import PolicyPlugin, class_plugin
from priority.policies.sarathi import SarathiFcfsPolicy, SarathiPriorityPolicy
from priority.policies.sjf import RoundRobinSjfPolicy, SjfPolicy
from priority.policies.slide import SlideBatchingPolicy
from priority.policies.slos_serve import SlosServePolicy
from priority.policies.tempo import TempoOraclePolicy, TempoPolicy
from priority.policies.vllm import VllmV0FcfsPolicy, VllmV1Policy, VllmV1PriorityPolicy
from priority.policies.wvtc import WeightedVtcPolicy

_PLUGINS: tuple[PolicyPlugin, ...] = (
    class_plugin(VllmV1Policy, "vLLM V1's scheduler, FCFS (what users run)"),
    class_plugin(VllmV1PriorityPolicy, "vLLM V1's scheduler, --scheduling-policy priority"),
    class_plugin(VllmV0FcfsPolicy, "vLLM V0's prefill-first FCFS (PROSERVE's baseline)"),
    class_plugin(SarathiFcfsPolicy, "Sarathi-Serve's stall-free batching, FCFS"),
    class_plugin(SarathiPriorityPolicy, "Sarathi-Serve's stall-free batching, by tier weight"),
    class_plugin(FairBatchingPolicy, "FairBatching's EDF variant"),
    class_plugin(WeightedVtcPolicy, "weighted Virtual Token Counter (VTC, OSDI'24)"),
    class_plugin(SjfPolicy, "shortest job first on the oracle length (simulation only)"),
    class_plugin(RoundRobinSjfPolicy, "RR-SJF on the oracle length (simulation only)"),
    class_plugin(SlideBatchingPolicy, "PROSERVE's SlideBatching (Algorithm 1)"),
    class_plugin(GmaxPolicy, "JITServe's GMAX, with a slack-aware term"),
    class_plugin(GmaxFairPolicy, "GMAX with VTC fairness blended in"),
    class_plugin(TempoPolicy, "Tempo's service-gain density with graded decay"),
    class_plugin(GmaxOraclePolicy, "GMAX on the true lengths (simulation only)"),
    class_plugin(GmaxFairOraclePolicy, "gmax-fair on the true lengths (simulation only)"),
    class_plugin(TempoOraclePolicy, "Tempo on the true lengths (simulation only)"),
    class_plugin(SlosServePolicy, "SLOs-Serve's planner-based scheduler"),
)
_REGISTRY: dict[str, PolicyPlugin] = {p.name: p for p in _PLUGINS}

POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)

RENAMED: dict[str, str] = {
    "vllm-fcfs": "vllm-v0-fcfs",  # it schedules like vLLM V0, not the V1 users run
    "vllm-priority": "vllm-v1-priority",  # now the exact V1 priority scheduler
}
"""Old names, refused with a pointer to the new one (a silent alias would hide the change)."""


def policy_plugin(name: str) -> PolicyPlugin:
    try:
        return _REGISTRY[name]
    except KeyError:
        if name in RENAMED:
            raise KeyError(f"policy {name!r} is now {RENAMED[name]!r}") from None
        raise KeyError(
            f"unknown policy {name!r}; known policies: {', '.join(POLICY_NAMES)}"
        ) from None


def policy_class(name: str) -> type[SchedulingPolicy]:
    return policy_plugin(name).policy_type


def make_policy(name: str, estimator: BatchLatencyEstimator, **params: Any) -> SchedulingPolicy:
    """Instantiate a policy by name; ``params`` are its parameters, as Python values or as JSON
    would give them (validated and converted against its dataclass, see
    :mod:`priority.policies.params`)."""
    return policy_plugin(name).build(estimator, **params)


__all__ = [
    "POLICY_NAMES",
    "BatchBuilder",
    "EngineLimits",
    "PolicyParamsError",
    "PolicyPlugin",
    "SchedulerInput",
    "SchedulingPolicy",
    "StepPlan",
    "make_policy",
    "policy_class",
    "policy_plugin",
]
