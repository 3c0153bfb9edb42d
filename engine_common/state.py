"""The policy state exported as metrics, and its trip from the engine core to the stat logger.

The scheduler runs in the engine-core process; stat loggers run in the API-server process and
receive only ``SchedulerStats``, which vLLM serializes field by field (a subclass or an extra
attribute does not survive). The one field that can carry a few numbers without touching vLLM's
own metrics is ``running_lora_adapters: dict[str, int]``: its only reader is the LoRA info gauge,
and only when LoRA is enabled. :func:`encode` adds integer entries under the ``tiergate:`` prefix
(seconds as microseconds, ratios as parts per million, the estimator's coefficients — far below
a microsecond — as the 64 bits of their IEEE double); :func:`pop_state` takes them out again.
Our stat-logger plugin runs before vLLM's default loggers (vLLM lists plugin loggers first and
hands every logger the same object), so the defaults never see them.
"""

from __future__ import annotations

import struct
from collections.abc import MutableMapping
from dataclasses import dataclass

from priority.estimator_refit import COEFFICIENT_NAMES

KEY_PREFIX = "tiergate:"
_MICRO = 1_000_000


@dataclass(frozen=True, slots=True)
class PolicyState:
    """The policy's view of the latest step (what an operator wants to see next to vLLM's)."""

    num_urgent: int = 0
    num_normal: int = 0
    latency_budget_s: float = 0.0
    beta: float = 1.0
    estimator_error: float = 0.0
    """|T_real / T_predicted - 1| of the latest measured step."""
    plan_deviations: int = 0
    """Steps so far whose executed batch differed from the policy's plan."""
    steps: int = 0
    """Steps planned by the policy so far."""
    num_hopeless: int = 0
    """Waiting requests the latest plan judged unable to meet their objective
    (:attr:`StepPlan.hopeless`: GMAX demotes them behind every other request; vLLM cannot
    answer a client from inside the scheduler, so this count is how an operator sees them)."""
    refits: int = 0
    """Refits of the estimator's coefficients from real steps so far."""
    coefficients: tuple[float, ...] = ()
    """The estimator's current coefficients (``COEFFICIENT_NAMES`` order; with ``beta``, the
    engine's corrected estimator, which the gateway's router uses); empty: not sent."""
    received: tuple[tuple[str, int], ...] = ()
    """Requests received so far by what their metadata said, ``("tier|kind|objective", n)``
    (:func:`received_key`): the proof that the gateway's objectives reach the policy."""


_FIELDS = {
    "num_urgent": 1,
    "num_normal": 1,
    "latency_budget_s": _MICRO,
    "beta": _MICRO,
    "estimator_error": _MICRO,
    "plan_deviations": 1,
    "steps": 1,
    "num_hopeless": 1,
    "refits": 1,
}
_COEFFICIENT_KEY = KEY_PREFIX + "coef:"
_RECEIVED_KEY = KEY_PREFIX + "n:"


def received_key(tier: str, kind: str, objective: str) -> str:
    """The key of :attr:`PolicyState.received` (``|`` never occurs in a tier or kind name the
    gateway sends; it is replaced if it does)."""
    return "|".join(part.replace("|", "/") for part in (tier, kind, objective))


def _bits(value: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def _float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", bits))[0])


def encode(state: PolicyState, into: MutableMapping[str, int]) -> None:
    """Write ``state`` as integer entries into ``into`` (a ``SchedulerStats`` dict field)."""
    for name, scale in _FIELDS.items():
        into[KEY_PREFIX + name] = round(getattr(state, name) * scale)
    for name, value in zip(COEFFICIENT_NAMES, state.coefficients, strict=False):
        into[_COEFFICIENT_KEY + name] = _bits(value)
    for key, count in state.received:
        into[_RECEIVED_KEY + key] = count


def pop_state(source: MutableMapping[str, int]) -> PolicyState | None:
    """Remove our entries from ``source``; the state they encode, or None if there were none."""
    if not any(key.startswith(KEY_PREFIX) for key in source):
        return None
    values: dict[str, float | int | tuple[float, ...] | tuple[tuple[str, int], ...]] = {}
    for name, scale in _FIELDS.items():
        raw = source.pop(KEY_PREFIX + name, None)
        if raw is not None:  # a field an older encoder did not send keeps its default
            values[name] = raw if scale == 1 else raw / scale
    coefficients = [source.pop(_COEFFICIENT_KEY + name, None) for name in COEFFICIENT_NAMES]
    if all(bits is not None for bits in coefficients):
        values["coefficients"] = tuple(_float(bits) for bits in coefficients if bits is not None)
    received = tuple(
        (key[len(_RECEIVED_KEY) :], source.pop(key))
        for key in [k for k in source if k.startswith(_RECEIVED_KEY)]
    )
    if received:
        values["received"] = received
    for key in [k for k in source if k.startswith(KEY_PREFIX)]:
        del source[key]  # entries of a newer encoder: never leak them to vLLM's loggers
    return PolicyState(**values)  # type: ignore[arg-type]
