"""Tenants: create, read, list, update (tier moves, overrides), suspend/activate, delete."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, joinedload

from gateway.db.crud._common import (
    add_audited,
    check_choice,
    check_fields,
    check_limit,
    check_name,
    check_positive,
    delete_audited,
    ensure_name_free,
    lock,
    name_taken,
    update_named,
)
from gateway.db.crud.operators import delete_tenant_admins
from gateway.db.crud.pages import count_rows, page
from gateway.db.crud.tiers import get_tier
from gateway.db.errors import InvalidInput, NotFound
from gateway.db.models import TENANT_STATUSES, Tenant, Tier

ENTITY = "tenant"
SLO_OVERRIDES = (
    ("ttft_ms", "min_ttft_ms"),
    ("tpot_ms", "min_tpot_ms"),
    ("deadline_ms", "min_deadline_ms"),
)
LIMIT_OVERRIDES = ("rpm_limit", "tpm_limit", "max_concurrency")
UPDATABLE = ("name", "tier", "status", *(s for s, _ in SLO_OVERRIDES), *LIMIT_OVERRIDES)


def validate_tenant(state: Mapping[str, Any], tier: Tier) -> dict[str, Any]:
    """Check a tenant's complete state against its tier (SLO overrides respect the minimums)."""
    out: dict[str, Any] = {
        "name": check_name(state.get("name"), ENTITY),
        "status": check_choice(state.get("status", "active"), "status", TENANT_STATUSES),
        "tier_id": tier.id,
    }
    for field, minimum in SLO_OVERRIDES:
        value = check_positive(state.get(field), field, optional=True)
        floor = getattr(tier, minimum)
        if value is not None and floor is not None and value < floor:
            raise InvalidInput(
                f"{field} override {value:g} is tighter than tier {tier.name!r} allows "
                f"({minimum} = {floor:g})",
                param=field,
            )
        out[field] = value
    for field in LIMIT_OVERRIDES:
        out[field] = check_limit(state.get(field), field)
    return out


def get_tenant(session: Session, ref: int | str) -> Tenant:
    """A tenant by id (int) or name (str), with its tier loaded."""
    column = Tenant.id if isinstance(ref, int) else Tenant.name
    tenant = session.scalar(select(Tenant).options(joinedload(Tenant.tier)).where(column == ref))
    if tenant is None:
        raise NotFound(f"tenant {ref!r} does not exist", param="tenant")
    return tenant


def find_tenant(session: Session, name: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.name == name))


def _tenant_query(
    session: Session, tier: int | str | None, status: str | None, search: str | None = None
) -> Select[Any]:
    query = select(Tenant)
    if search:  # the dashboard's name search: case-insensitive, '%' and '_' taken literally
        query = query.where(Tenant.name.icontains(search, autoescape=True))
    if tier is not None:
        query = query.where(Tenant.tier_id == get_tier(session, tier).id)
    if status is not None:
        query = query.where(Tenant.status == check_choice(status, "status", TENANT_STATUSES))
    return query


def list_tenants(
    session: Session,
    *,
    tier: int | str | None = None,
    status: str | None = None,
    search: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[Tenant]:
    """Tenants by name (unique: stable pages), each with its tier loaded; ``search``: names
    containing it, in any case."""
    query = _tenant_query(session, tier, status, search)
    query = query.options(joinedload(Tenant.tier)).order_by(Tenant.name)
    return list(session.scalars(page(query, limit, offset)))


def count_tenants(
    session: Session,
    *,
    tier: int | str | None = None,
    status: str | None = None,
    search: str | None = None,
) -> int:
    """How many tenants :func:`list_tenants` lists with the same filters."""
    return count_rows(session, _tenant_query(session, tier, status, search))


def create_tenant(
    session: Session,
    *,
    actor: str,
    name: str,
    tier: int | str,
    status: str = "active",
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    deadline_ms: float | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    max_concurrency: int | None = None,
) -> Tenant:
    tier_row = get_tier(session, tier)
    values = validate_tenant(
        {
            "name": name,
            "status": status,
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "deadline_ms": deadline_ms,
            "rpm_limit": rpm_limit,
            "tpm_limit": tpm_limit,
            "max_concurrency": max_concurrency,
        },
        tier_row,
    )
    # The name check comes first: it queries, and the query's autoflush must not meet a
    # tenant already attached to its tier but not yet in the session.
    ensure_name_free(session, find_tenant, ENTITY, name)
    tenant = Tenant(**values)
    tenant.tier = tier_row
    conflict = name_taken(ENTITY, name)
    return add_audited(session, tenant, actor=actor, entity=ENTITY, conflict=conflict)


def update_tenant(
    session: Session,
    ref: int | str,
    changes: Mapping[str, Any],
    *,
    actor: str,
    action: str = "update",
) -> Tenant:
    """Partial update; ``tier`` takes a tier id or name. A no-op writes no audit row."""
    check_fields(changes, UPDATABLE, ENTITY)
    tenant = lock(session, get_tenant(session, ref), ENTITY)
    new_tier = get_tier(session, changes["tier"]) if "tier" in changes else tenant.tier

    def move() -> None:
        tenant.tier = new_tier

    update_named(
        session,
        tenant,
        {k: v for k, v in changes.items() if k != "tier"},
        validate=lambda state: validate_tenant(state, new_tier),
        find=find_tenant,
        actor=actor,
        action=action,
        entity=ENTITY,
        on_change=move,
    )
    return tenant


def suspend_tenant(session: Session, ref: int | str, *, actor: str) -> Tenant:
    """Suspend: the tenant's keys stop authenticating (they are kept, not revoked)."""
    return update_tenant(session, ref, {"status": "suspended"}, actor=actor, action="suspend")


def activate_tenant(session: Session, ref: int | str, *, actor: str) -> Tenant:
    return update_tenant(session, ref, {"status": "active"}, actor=actor, action="activate")


def delete_tenant(session: Session, ref: int | str, *, actor: str) -> None:
    """Delete a tenant, its keys and its tenant admins (each admin's deletion audited); its
    usage records stay, with tenant and key set to NULL."""
    tenant = lock(session, get_tenant(session, ref), ENTITY)
    delete_tenant_admins(session, tenant.id, actor=actor)
    delete_audited(session, tenant, actor=actor, entity=ENTITY)
