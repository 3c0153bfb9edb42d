"""``/tenants``: who sends requests, on which tier, with which overrides; suspend and activate.

Every change drops the cached identities of the tenant's keys once committed: overrides, tier
and status are part of each identity.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from gateway.app.admin import helpers
from gateway.app.admin.deps import ActorDep, AdminRoute, PageDep, SessionDep, StateDep
from gateway.app.admin.helpers import (
    change_and_invalidate,
    changes_of,
    delete_row,
    invalidate,
    key_prefixes,
    resolve,
)
from gateway.app.admin.schemas import (
    DeletedOut,
    ListOut,
    TenantCreate,
    TenantOut,
    TenantUpdate,
)
from gateway.app.state import GatewayState
from gateway.db import crud
from gateway.db.models import Tenant

router = APIRouter(route_class=AdminRoute, tags=["tenants"])


@router.get("/tenants")
def list_tenants(
    session: SessionDep,
    tier: Annotated[str | None, Query(description="tier name or id")] = None,
    status: Annotated[str | None, Query(description="active | suspended")] = None,
    *,
    page: PageDep,
) -> ListOut[TenantOut]:
    """Tenants by name; the total is in ``x-total-count``."""
    tier_id = resolve(crud.get_tier, session, tier).id if tier is not None else None
    rows = crud.list_tenants(
        session, tier=tier_id, status=status, limit=page.limit, offset=page.offset
    )
    total = crud.count_tenants(session, tier=tier_id, status=status)
    return page.of(total, map(TenantOut.of, rows))


@router.post("/tenants", status_code=201)
def create_tenant(body: TenantCreate, session: SessionDep, actor: ActorDep) -> TenantOut:
    with session.begin():
        values = body.model_dump()
        values["tier"] = resolve(crud.get_tier, session, body.tier).id
        return TenantOut.of(crud.create_tenant(session, actor=actor, **values))


@router.get("/tenants/{ref}")
def get_tenant(ref: str, session: SessionDep) -> TenantOut:
    return TenantOut.of(resolve(crud.get_tenant, session, ref))


@router.patch("/tenants/{ref}")
def update_tenant(
    ref: str, body: TenantUpdate, session: SessionDep, actor: ActorDep, state: StateDep
) -> TenantOut:
    def change(s: Session) -> Tenant:
        return helpers.update_tenant(s, ref, changes_of(body), actor)

    return change_and_invalidate(state, session, change, TenantOut.of, key_prefixes)


def _set_status(
    ref: str, session: Session, actor: str, state: GatewayState, *, active: bool
) -> TenantOut:
    def change(s: Session) -> Tenant:
        return helpers.set_tenant_status(s, ref, actor, active=active)

    return change_and_invalidate(state, session, change, TenantOut.of, key_prefixes)


@router.post("/tenants/{ref}/suspend")
def suspend_tenant(ref: str, session: SessionDep, actor: ActorDep, state: StateDep) -> TenantOut:
    """Suspend: the tenant's keys stop authenticating at once (they are kept)."""
    return _set_status(ref, session, actor, state, active=False)


@router.post("/tenants/{ref}/activate")
def activate_tenant(ref: str, session: SessionDep, actor: ActorDep, state: StateDep) -> TenantOut:
    return _set_status(ref, session, actor, state, active=True)


@router.delete("/tenants/{ref}")
def delete_tenant(ref: str, session: SessionDep, actor: ActorDep, state: StateDep) -> DeletedOut:
    """Delete a tenant and its keys; its usage records stay (tenant set to null)."""
    with session.begin():
        tenant = resolve(crud.get_tenant, session, ref)
        prefixes = key_prefixes(tenant)
        out = delete_row(session, actor, crud.delete_tenant, "tenant", tenant.id, tenant.name)
    invalidate(state, prefixes)
    return out
