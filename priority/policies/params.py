"""Policy parameters from outside (JSON, environment, CLI) checked against the policy's dataclass.

Every policy keeps its parameters in one frozen dataclass, every field defaulted (the shape of
llm-d's plugin parameters). Operators write them as JSON (``TIERGATE_POLICY_PARAMS``, the
simulator's options), while a policy reads typed values (``gain_weights: GainWeights``,
``phi: Literal[...]``): checking only the *names* let ``{"gain_weights": {"first_token": 4}}``
pass start-up and fail on the first step with an ``AttributeError``. Here each key is validated
and converted by pydantic against the field's own annotation, and the ranges by the dataclass's
``__post_init__``, so a bad value fails at start-up with the parameter's name and a good one
arrives with the type the policy expects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import cache
from typing import Any, TypeVar, get_type_hints

from pydantic import TypeAdapter, ValidationError

P = TypeVar("P")


class PolicyParamsError(ValueError):
    """A policy parameter that does not exist or has a value of the wrong type or range."""


@dataclass(frozen=True, slots=True)
class NoParams:
    """The parameters of a policy that takes none."""


NO_PARAMS = NoParams()


def require_finite_non_negative(**values: float) -> None:
    """The range check most parameters share: ValueError naming the first of ``values`` that
    is negative, infinite or NaN."""
    for label, value in values.items():
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{label} must be finite and >= 0, got {value}")


def require_unit_interval(**values: float) -> None:
    """ValueError naming the first of ``values`` outside [0, 1]."""
    for label, value in values.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{label} must be in [0, 1], got {value}")


@cache
def _annotations(params: type) -> dict[str, Any]:
    """The dataclass's fields and their (resolved) annotations."""
    hints = get_type_hints(params)
    return {f.name: hints.get(f.name, Any) for f in fields(params)}


@cache
def _adapters(params: type) -> dict[str, TypeAdapter[Any]]:
    return {name: TypeAdapter(annotation) for name, annotation in _annotations(params).items()}


def _unknown_fields(annotation: Any, value: Any) -> list[str]:
    """Keys of a JSON object that the dataclass it becomes has no field for (pydantic drops
    them silently for standard-library dataclasses; a typo must not pass)."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        known = getattr(candidate, "__dataclass_fields__", None)
        if known is not None and isinstance(value, Mapping):
            return sorted(str(k) for k in value if k not in known)
    return []


def parameter_names(params: type) -> tuple[str, ...]:
    """The parameters a policy whose dataclass is ``params`` accepts."""
    if not is_dataclass(params):
        raise TypeError(f"{params!r} is not a dataclass")
    return tuple(f.name for f in fields(params))


def parse_params(owner: str, defaults: P, raw: Mapping[str, Any]) -> P:
    """``defaults`` with the values of ``raw`` (JSON or Python values) validated and converted
    against the fields' annotations; :class:`PolicyParamsError` naming the parameter if not."""
    params: type = type(defaults)
    adapters = _adapters(params)
    unknown = sorted(set(raw) - set(adapters))
    if unknown:
        known = ", ".join(adapters) or "none"
        raise PolicyParamsError(
            f"{owner} has no parameter {', '.join(map(repr, unknown))} (parameters: {known})"
        )
    if not raw:
        return defaults
    values: dict[str, Any] = {}
    for name, value in raw.items():
        extra = _unknown_fields(_annotations(params)[name], value)
        if extra:
            raise PolicyParamsError(
                f"{owner} parameter {name!r}: unknown field(s) {', '.join(extra)}"
            )
        try:
            values[name] = adapters[name].validate_python(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join([name, *map(str, e['loc'])])}: {e['msg']}" for e in exc.errors()
            )
            raise PolicyParamsError(f"{owner} parameter {name!r}: {problems}") from None
    try:
        return replace(defaults, **values)  # type: ignore[type-var]
    except ValueError as exc:  # a range check of the dataclass
        raise PolicyParamsError(f"{owner}: {exc}") from None
