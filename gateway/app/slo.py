"""A request's SLO: its tier's defaults, or what it asks for in headers — never tighter than
the tier allows — as the start of its metadata (:class:`~priority.request.RequestMeta`, which
:func:`engine_common.protocol.encode` writes for the engine).

Headers (milliseconds, from a microsecond to a day: :data:`gateway.bounds.MIN_SLO_MS` and
``MAX_SLO_MS``): ``x-slo-ttft-ms``, ``x-slo-tpot-ms``, ``x-slo-deadline-ms``. The floor of each is
the tier's ``min_*_ms`` when set; a tier without one allows nothing tighter than its own default
(a deadline's floor is then the tier's default deadline, or its TTFT when the tier has no
deadline: a deadline shorter than the first token's objective would be the tighter SLO in
disguise). Looser values are always accepted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from engine_common.protocol import priority_from_weight
from gateway.bounds import MAX_SLO_MS, MIN_SLO_MS
from gateway.db.identity import EffectivePolicy
from gateway.errors import bad_request
from priority.request import SLO, RequestMeta

TTFT_HEADER = "x-slo-ttft-ms"
TPOT_HEADER = "x-slo-tpot-ms"
DEADLINE_HEADER = "x-slo-deadline-ms"


def _header(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise bad_request(
            f"header {name} must be a number of milliseconds, got {raw!r}", name
        ) from None
    if not (math.isfinite(value) and MIN_SLO_MS <= value <= MAX_SLO_MS):
        raise bad_request(
            f"header {name} must be a number of milliseconds from {MIN_SLO_MS:g} up to "
            f"{MAX_SLO_MS:g} (a day), got {raw!r}",
            name,
        )
    return value


def _floor_check(name: str, value: float, floor: float, tier: str, source: str) -> None:
    if value < floor:
        raise bad_request(
            f"header {name}={value:g} is tighter than tier {tier!r} allows: the {source} is "
            f"{floor:g} ms",
            name,
        )


def resolve_slo(
    headers: Mapping[str, str],
    policy: EffectivePolicy,
    tier: str,
    *,
    tenant: str,
    arrival_unix_s: float,
) -> RequestMeta:
    """The request's metadata from its SLO headers and its tier/tenant policy (400 if not
    allowed): its SLO in seconds, the tier's weight, its tier and tenant, its arrival (Unix
    seconds); its kind is the tier's concern next (:mod:`gateway.app.kinds`)."""
    ttft = _header(headers, TTFT_HEADER)
    tpot = _header(headers, TPOT_HEADER)
    deadline = _header(headers, DEADLINE_HEADER)
    if ttft is not None:
        floor, source = _floor(policy.min_ttft_ms, policy.ttft_ms)
        _floor_check(TTFT_HEADER, ttft, floor, tier, source)
    if tpot is not None:
        floor, source = _floor(policy.min_tpot_ms, policy.tpot_ms)
        _floor_check(TPOT_HEADER, tpot, floor, tier, source)
    if deadline is not None:
        default = policy.deadline_ms if policy.deadline_ms is not None else policy.ttft_ms
        floor, source = _floor(policy.min_deadline_ms, default)
        _floor_check(DEADLINE_HEADER, deadline, floor, tier, source)
    if deadline is None:
        deadline = policy.deadline_ms
    slo = SLO(
        ttft_s=(ttft if ttft is not None else policy.ttft_ms) / 1e3,
        tpot_s=(tpot if tpot is not None else policy.tpot_ms) / 1e3,
        deadline_s=deadline / 1e3 if deadline is not None else None,
    )
    return RequestMeta(
        slo=slo, weight=policy.weight, tier=tier, tenant=tenant, arrival_s=arrival_unix_s
    )


def _floor(minimum: float | None, default: float) -> tuple[float, str]:
    if minimum is not None:
        return minimum, "minimum"
    return default, "default (the tier sets no minimum)"


def engine_priority(weight: float) -> int:
    """vLLM's ``priority`` (lower served first) for a tier weight (larger more important):
    :func:`engine_common.protocol.priority_from_weight` (4 / 2 / 1 → -2 / -1 / 0, within ±10)."""
    return priority_from_weight(weight)
