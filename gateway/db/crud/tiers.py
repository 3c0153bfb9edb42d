"""Tiers: create, read, list, update, delete — each mutation audited."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.bounds import MAX_SHED_SLACK
from gateway.db.crud._common import (
    add_named,
    check_bool,
    check_fields,
    check_limit,
    check_name,
    check_optional_text,
    check_positive,
    delete_audited,
    find_named,
    get_named,
    lock,
    update_named,
)
from gateway.db.crud.pages import count_rows, page
from gateway.db.errors import InUse, InvalidInput
from gateway.db.models import Tenant, Tier

ENTITY = "tier"
UPDATABLE = (
    "name",
    "description",
    "weight",
    "ttft_ms",
    "tpot_ms",
    "deadline_ms",
    "min_ttft_ms",
    "min_tpot_ms",
    "min_deadline_ms",
    "rpm_limit",
    "tpm_limit",
    "max_concurrency",
    "best_effort_allowed",
    "shed_slack",
    "default_kind",
)
TIER_KINDS = ("latency", "deadline", "best-effort")
"""A tier's possible default kinds: every request kind but ``compound``, which only a workflow
header makes (:data:`priority.request.REQUEST_KINDS`)."""
# (minimum, the default SLO it bounds): the tier's own defaults must respect its minimums.
_MIN_OF = (
    ("min_ttft_ms", "ttft_ms"),
    ("min_tpot_ms", "tpot_ms"),
    ("min_deadline_ms", "deadline_ms"),
)


def validate_tier(state: Mapping[str, Any]) -> dict[str, Any]:
    """Check a tier's complete state; returns it normalised (numbers as float/int)."""
    out: dict[str, Any] = {
        "name": check_name(state.get("name"), ENTITY),
        "description": check_optional_text(state.get("description"), "description", 1000),
        "weight": check_positive(state.get("weight"), "weight"),
        "ttft_ms": check_positive(state.get("ttft_ms"), "ttft_ms"),
        "tpot_ms": check_positive(state.get("tpot_ms"), "tpot_ms"),
        "deadline_ms": check_positive(state.get("deadline_ms"), "deadline_ms", optional=True),
        "best_effort_allowed": check_bool(
            state.get("best_effort_allowed", False), "best_effort_allowed"
        ),
    }
    for minimum, default in _MIN_OF:
        value = check_positive(state.get(minimum), minimum, optional=True)
        bound = out[default]
        if value is not None and bound is not None and value > bound:
            raise InvalidInput(
                f"{minimum} ({value:g}) exceeds the tier's default {default} ({bound:g}): "
                "the default SLO must itself be allowed",
                param=minimum,
            )
        out[minimum] = value
    for limit in ("rpm_limit", "tpm_limit", "max_concurrency"):
        out[limit] = check_limit(state.get(limit), limit)
    out["shed_slack"] = check_shed_slack(state.get("shed_slack", 0.0))
    out["default_kind"] = check_default_kind(state.get("default_kind", "latency"), out)
    return out


def check_default_kind(value: Any, tier: Mapping[str, Any]) -> str:
    """One of :data:`TIER_KINDS`; ``deadline`` and ``best-effort`` schedule a request to the
    tier's default deadline, so they need ``deadline_ms``."""
    if value not in TIER_KINDS:
        raise InvalidInput(
            f"default_kind must be one of {', '.join(TIER_KINDS)}, got {value!r}",
            param="default_kind",
        )
    if value != "latency" and tier.get("deadline_ms") is None:
        raise InvalidInput(
            f"default_kind {value!r} needs the tier's default deadline: set deadline_ms",
            param="default_kind",
        )
    return str(value)


def check_shed_slack(value: Any) -> float:
    """How late, as a fraction of the TTFT objective, a predicted first token may be and the
    request still be admitted under overload (``docs/operations/overload.md``): 0 to
    :data:`~gateway.bounds.MAX_SHED_SLACK`."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0.0 <= value <= MAX_SHED_SLACK
    ):
        raise InvalidInput(
            f"shed_slack must be a number from 0 to {MAX_SHED_SLACK:g}, got {value!r}",
            param="shed_slack",
        )
    return float(value)


def get_tier(session: Session, ref: int | str) -> Tier:
    """A tier by id (int) or name (str)."""
    return get_named(session, Tier, ref, ENTITY)


def find_tier(session: Session, name: str) -> Tier | None:
    return find_named(session, Tier, name)


def list_tiers(session: Session, *, limit: int | None = None, offset: int = 0) -> list[Tier]:
    """Tiers, most important first (the unique name breaks ties: stable pages)."""
    query = select(Tier).order_by(Tier.weight.desc(), Tier.name)
    return list(session.scalars(page(query, limit, offset)))


def count_tiers(session: Session) -> int:
    return count_rows(session, select(Tier))


def create_tier(
    session: Session,
    *,
    actor: str,
    name: str,
    weight: float,
    ttft_ms: float,
    tpot_ms: float,
    deadline_ms: float | None = None,
    min_ttft_ms: float | None = None,
    min_tpot_ms: float | None = None,
    min_deadline_ms: float | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    max_concurrency: int | None = None,
    best_effort_allowed: bool = False,
    shed_slack: float = 0.0,
    description: str | None = None,
    default_kind: str = "latency",
) -> Tier:
    values = validate_tier(
        {
            "name": name,
            "description": description,
            "weight": weight,
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "deadline_ms": deadline_ms,
            "min_ttft_ms": min_ttft_ms,
            "min_tpot_ms": min_tpot_ms,
            "min_deadline_ms": min_deadline_ms,
            "rpm_limit": rpm_limit,
            "tpm_limit": tpm_limit,
            "max_concurrency": max_concurrency,
            "best_effort_allowed": best_effort_allowed,
            "shed_slack": shed_slack,
            "default_kind": default_kind,
        }
    )
    return add_named(session, Tier(**values), name, find_tier, actor=actor, entity=ENTITY)


def update_tier(
    session: Session, ref: int | str, changes: Mapping[str, Any], *, actor: str
) -> Tier:
    """Apply a partial update (field → new value); a no-op update writes no audit row."""
    check_fields(changes, UPDATABLE, ENTITY)
    tier = lock(session, get_tier(session, ref), ENTITY)
    update_named(
        session,
        tier,
        changes,
        validate=validate_tier,
        find=find_tier,
        actor=actor,
        action="update",
        entity=ENTITY,
    )
    return tier


def delete_tier(session: Session, ref: int | str, *, actor: str) -> None:
    """Delete a tier no tenant is on (tenants must be moved first)."""
    tier = lock(session, get_tier(session, ref), ENTITY)
    tenants = session.scalar(select(func.count()).where(Tenant.tier_id == tier.id)) or 0
    if tenants:
        raise InUse(
            f"tier {tier.name!r} still has {tenants} tenant(s); move or delete them first",
            param="tier",
        )
    delete_audited(session, tier, actor=actor, entity=ENTITY)
