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

_REGISTRY: dict[str, str] = {
    "vllm-fcfs": "priority.policies.vllm:VllmFcfsPolicy",
    "vllm-priority": "priority.policies.vllm:VllmPriorityPolicy",
    "sarathi-fcfs": "priority.policies.sarathi:SarathiFcfsPolicy",
    "sarathi-priority": "priority.policies.sarathi:SarathiPriorityPolicy",
    "fairbatching": "priority.policies.fairbatching:FairBatchingPolicy",
    "wvtc": "priority.policies.wvtc:WeightedVtcPolicy",
    "sjf": "priority.policies.sjf:SjfPolicy",
    "rr-sjf": "priority.policies.sjf:RoundRobinSjfPolicy",
    "slide": "priority.policies.slide:SlideBatchingPolicy",
}

POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def policy_class(name: str) -> type[SchedulingPolicy]:
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown policy {name!r}; known policies: {', '.join(POLICY_NAMES)}"
        ) from None
    module_name, _, class_name = target.partition(":")
    cls: type[SchedulingPolicy] = getattr(import_module(module_name), class_name)
    return cls


def make_policy(name: str, estimator: BatchLatencyEstimator, **params: Any) -> SchedulingPolicy:
    """Instantiate a policy by name; ``params`` are its keyword parameters."""
    return policy_class(name)(estimator, **params)


__all__ = [
    "POLICY_NAMES",
    "BatchBuilder",
    "EngineLimits",
    "SchedulerInput",
    "SchedulingPolicy",
    "StepPlan",
    "make_policy",
    "policy_class",
]
