"""The policy plugin shape: a name, a parameters dataclass with defaults, a factory.

Modelled on llm-d's scheduler plugins, as the routers are (:mod:`priority.routing.plugin`):
every policy is registered once under the name the CLI, the simulator, the emulated engines and
the vLLM plugins accept, with the frozen dataclass of its parameters (every field defaulted, so
a caller sees what it takes and operator JSON is validated against it before anything runs) and
a factory ``factory(estimator, params)``. A variant (``gmax-fair``, the ``*-oracle`` twins) is
its family's class with other defaults or a class attribute, never a copied constructor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, is_dataclass
from typing import Any

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import SchedulingPolicy
from priority.policies.params import parameter_names, parse_params

PolicyFactory = Callable[[BatchLatencyEstimator, Any], SchedulingPolicy]
"""Called as ``factory(estimator, params)`` with an instance of the plugin's ``params``."""


@dataclass(frozen=True, slots=True)
class PolicyPlugin:
    name: str
    policy_type: type[SchedulingPolicy]
    factory: PolicyFactory
    params: type[Any]
    """Frozen dataclass of the policy's parameters, every field defaulted."""
    summary: str = ""
    """One line: the system the policy stands for."""

    def __post_init__(self) -> None:
        if not is_dataclass(self.params):
            raise TypeError(f"policy {self.name!r}: params must be a dataclass")
        if not isinstance(self.defaults, self.params):
            raise TypeError(f"policy {self.name!r}: default_params is not a {self.params.__name__}")

    @property
    def defaults(self) -> Any:
        """The parameters the policy runs with when given none (the class's
        ``default_params``: a variant's are its own)."""
        return self.policy_type.default_params

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return parameter_names(self.params)

    def parse(self, raw: Mapping[str, Any]) -> Any:
        """The parameters ``raw`` (JSON or Python values) asks for, over the defaults;
        :class:`~priority.policies.params.PolicyParamsError` naming a bad one."""
        return parse_params(self.name, self.defaults, raw)

    def build(self, estimator: BatchLatencyEstimator, **raw: Any) -> SchedulingPolicy:
        return self.factory(estimator, self.parse(raw))


def class_plugin(policy_type: type[SchedulingPolicy], summary: str = "") -> PolicyPlugin:
    """The plugin of a policy class built as ``policy_type(estimator, params)``."""
    return PolicyPlugin(
        policy_type.name, policy_type, policy_type, type(policy_type.default_params), summary
    )
