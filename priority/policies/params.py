"""Policy parameters from outside (JSON, environment, CLI) checked against the real constructor.

Operators write parameters as JSON (``TIERGATE_POLICY_PARAMS``, the simulator's options); a
policy's constructor takes typed values (``gain_weights: GainWeights``, ``phi: Literal[...]``).
Checking only the *names* let ``{"gain_weights": {"first_token": 4}}`` pass start-up and fail on
the first step with an ``AttributeError``. Here each keyword is validated and converted by
pydantic against the constructor's own annotations, so a bad value fails at start-up with the
parameter's name, and a good one arrives with the type the policy expects.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from functools import cache
from typing import Any, get_type_hints

from pydantic import TypeAdapter, ValidationError

from priority.policies.base import SchedulingPolicy

_NOT_PARAMETERS = frozenset({"self", "estimator"})


class PolicyParamsError(ValueError):
    """A policy parameter that does not exist or has a value of the wrong type."""


@cache
def _annotations(cls: type[SchedulingPolicy]) -> dict[str, Any]:
    """The constructor's keyword parameters and their (resolved) annotations."""
    hints = get_type_hints(cls.__init__)
    return {
        name: hints.get(name, Any)
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if name not in _NOT_PARAMETERS
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }


@cache
def _adapters(cls: type[SchedulingPolicy]) -> dict[str, TypeAdapter[Any]]:
    return {name: TypeAdapter(annotation) for name, annotation in _annotations(cls).items()}


def _unknown_fields(annotation: Any, value: Any) -> list[str]:
    """Keys of a JSON object that the dataclass it becomes has no field for (pydantic drops
    them silently for standard-library dataclasses; a typo must not pass)."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        fields = getattr(candidate, "__dataclass_fields__", None)
        if fields is not None and isinstance(value, Mapping):
            return sorted(str(k) for k in value if k not in fields)
    return []


def parameter_names(cls: type[SchedulingPolicy]) -> tuple[str, ...]:
    return tuple(_adapters(cls))


def validate_params(cls: type[SchedulingPolicy], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` converted to what ``cls.__init__`` takes; :class:`PolicyParamsError` if not."""
    adapters = _adapters(cls)
    unknown = sorted(set(raw) - set(adapters))
    if unknown:
        known = ", ".join(adapters) or "none"
        raise PolicyParamsError(
            f"{cls.name} has no parameter {', '.join(map(repr, unknown))} (parameters: {known})"
        )
    values: dict[str, Any] = {}
    for name, value in raw.items():
        extra = _unknown_fields(_annotations(cls)[name], value)
        if extra:
            raise PolicyParamsError(
                f"{cls.name} parameter {name!r}: unknown field(s) {', '.join(extra)}"
            )
        try:
            values[name] = adapters[name].validate_python(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join([name, *map(str, e['loc'])])}: {e['msg']}" for e in exc.errors()
            )
            raise PolicyParamsError(f"{cls.name} parameter {name!r}: {problems}") from None
    return values
