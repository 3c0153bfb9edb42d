"""Engine-level scheduling policies, all behind :class:`SchedulingPolicy`.

Policies are looked up by the names the CLI and the engine plugins accept.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import (
    BatchBuilder,
    EngineLimits,
    SchedulerInput,
    SchedulingPolicy,
    StepPlan,
)
from priority.policies.params import PolicyParamsError, validate_params

_REGISTRY: dict[str, str] = {
    "vllm-v1": "priority.policies.vllm:VllmV1Policy",
    "vllm-v1-priority": "priority.policies.vllm:VllmV1PriorityPolicy",
    "vllm-v0-fcfs": "priority.policies.vllm:VllmV0FcfsPolicy",
    "sarathi-fcfs": "priority.policies.sarathi:SarathiFcfsPolicy",
    "sarathi-priority": "priority.policies.sarathi:SarathiPriorityPolicy",
    "fairbatching": "priority.policies.fairbatching:FairBatchingPolicy",
    "wvtc": "priority.policies.wvtc:WeightedVtcPolicy",
    "sjf": "priority.policies.sjf:SjfPolicy",
    "rr-sjf": "priority.policies.sjf:RoundRobinSjfPolicy",
    "slide": "priority.policies.slide:SlideBatchingPolicy",
    "gmax": "priority.policies.gmax:GmaxPolicy",
    "gmax-fair": "priority.policies.gmax:GmaxFairPolicy",
    "tempo": "priority.policies.tempo:TempoPolicy",
    "gmax-oracle": "priority.policies.gmax:GmaxOraclePolicy",
    "gmax-fair-oracle": "priority.policies.gmax:GmaxFairOraclePolicy",
    "tempo-oracle": "priority.policies.tempo:TempoOraclePolicy",
    "slos-serve": "priority.policies.slos_serve:SlosServePolicy",
}

POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)

RENAMED: dict[str, str] = {
    "vllm-fcfs": "vllm-v0-fcfs",  # it schedules like vLLM V0, not the V1 users run
    "vllm-priority": "vllm-v1-priority",  # now the exact V1 priority scheduler
}
"""Old names, refused with a pointer to the new one (a silent alias would hide the change)."""


def policy_class(name: str) -> type[SchedulingPolicy]:
    try:
        target = _REGISTRY[name]
    except KeyError:
        if name in RENAMED:
            raise KeyError(f"policy {name!r} is now {RENAMED[name]!r}") from None
        raise KeyError(
            f"unknown policy {name!r}; known policies: {', '.join(POLICY_NAMES)}"
        ) from None
    module_name, _, class_name = target.partition(":")
    cls: type[SchedulingPolicy] = getattr(import_module(module_name), class_name)
    return cls


def make_policy(name: str, estimator: BatchLatencyEstimator, **params: Any) -> SchedulingPolicy:
    """Instantiate a policy by name; ``params`` are its keyword parameters, as Python values or
    as JSON would give them (validated and converted against the constructor, see
    :mod:`priority.policies.params`)."""
    cls = policy_class(name)
    return cls(estimator, **validate_params(cls, params))


__all__ = [
    "POLICY_NAMES",
    "BatchBuilder",
    "EngineLimits",
    "PolicyParamsError",
    "SchedulerInput",
    "SchedulingPolicy",
    "StepPlan",
    "make_policy",
    "policy_class",
]
