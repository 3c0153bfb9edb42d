"""Per-request SLO metadata as it reaches vLLM's scheduler.

The gateway sends ``vllm_xargs`` (``sampling_params.extra_args`` inside the engine) with the keys
in :data:`XARG_KEYS`, plus the OpenAI ``priority`` field (vLLM: lower is served first). Anything
missing or malformed falls back to the best-effort defaults: a request is never rejected for its
metadata, since a client talking to vLLM directly sends none.

Weight: ``tiergate_weight`` when valid; otherwise the ``priority`` field mapped to a weight as
``default_weight * 2 ** -priority`` (clipped to ``2 ** ±10``), so vLLM's "lower first" becomes our
"larger first": priority 0 is the default weight, -1 doubles it (PROSERVE's high tier), 1 halves
it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine_common.settings import BestEffortDefaults
from priority.request import SLO

WEIGHT = "tiergate_weight"
TTFT_MS = "tiergate_ttft_ms"
TPOT_MS = "tiergate_tpot_ms"
DEADLINE_MS = "tiergate_deadline_ms"
ARRIVAL_UNIX_S = "tiergate_arrival_unix_s"
TIER = "tiergate_tier"
TENANT = "tiergate_tenant"
XARG_KEYS = (WEIGHT, TTFT_MS, TPOT_MS, DEADLINE_MS, ARRIVAL_UNIX_S, TIER, TENANT)

_MAX_PRIORITY_SHIFT = 10


@dataclass(frozen=True, slots=True)
class RequestMeta:
    slo: SLO
    weight: float
    tier: str
    tenant: str
    arrival_s: float | None
    """The gateway's arrival time (Unix seconds), or None: use the engine's arrival time."""
    has_slo: bool
    """True when the request carried an SLO of its own (False: best effort)."""


def parse_meta(
    extra_args: Mapping[str, Any] | None,
    priority: int | None,
    *,
    defaults: BestEffortDefaults,
    zero_load_ttft_s: float,
) -> RequestMeta:
    """The request's SLO, weight, tier, tenant and arrival from its vLLM metadata.

    ``zero_load_ttft_s`` is the prompt's TTFT on an idle engine (from the profile), used for the
    default TTFT SLO when neither the request nor the settings give one.
    """
    args = extra_args if isinstance(extra_args, Mapping) else {}
    ttft = _positive_ms(args.get(TTFT_MS))
    tpot = _positive_ms(args.get(TPOT_MS))
    deadline = _positive_ms(args.get(DEADLINE_MS))
    has_slo = ttft is not None or tpot is not None or deadline is not None
    streaming = ttft is not None or tpot is not None or deadline is None
    if streaming:  # fill in whichever half of the streaming SLO is missing
        if ttft is None:
            ttft = defaults.ttft_s
            if ttft is None:
                ttft = max(defaults.ttft_scale * zero_load_ttft_s, defaults.ttft_floor_s)
        if tpot is None:
            tpot = defaults.tpot_s
    slo = SLO(ttft_s=ttft, tpot_s=tpot, deadline_s=deadline)

    weight = _positive(args.get(WEIGHT))
    if weight is None:
        weight = defaults.weight
        if isinstance(priority, int) and not isinstance(priority, bool) and priority != 0:
            shift = max(-_MAX_PRIORITY_SHIFT, min(_MAX_PRIORITY_SHIFT, priority))
            weight = defaults.weight * 2.0 ** (-shift)
    arrival = _finite(args.get(ARRIVAL_UNIX_S))
    return RequestMeta(
        slo=slo,
        weight=weight,
        tier=_text(args.get(TIER)) or defaults.tier,
        tenant=_text(args.get(TENANT)) or "default",
        arrival_s=arrival,
        has_slo=has_slo,
    )


def _finite(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _positive(value: Any) -> float | None:
    number = _finite(value)
    return number if number is not None and number > 0 else None


def _positive_ms(value: Any) -> float | None:
    number = _positive(value)
    return None if number is None else number / 1e3


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None
