"""``/ui/tenants``: who sends requests — list (search by name, filter by tier and status),
create, edit (tier, overrides), suspend/activate, delete.

Validated by the admin API's models (``TenantCreate``/``TenantUpdate``) and changed through the
same helpers as ``/admin/v1/tenants``: every change drops the cached identities of the
tenant's keys once committed (overrides, tier and status are part of each identity).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from gateway.app.admin.helpers import (
    changes_of,
    invalidate,
    key_prefixes,
    resolve,
    set_tenant_status,
    update_tenant,
)
from gateway.app.admin.schemas import TenantCreate, TenantUpdate
from gateway.app.ui.deps import Change, ChangeDep, OperatorDep, PageDep, SessionDep, UiRoute
from gateway.app.ui.forms import POLICY_FIELDS, Kind, input_text
from gateway.app.ui.render import pager, redirect, render
from gateway.app.ui.resource import Resource, Saved, commit_and_invalidate
from gateway.db import crud
from gateway.db.models import TENANT_STATUSES, Tenant

router = APIRouter(route_class=UiRoute)

FIELDS: dict[str, Kind] = {"name": "text", "tier": "ref", "status": "text", **POLICY_FIELDS}
EDIT_FIELDS = {k: v for k, v in FIELDS.items() if k != "status"}  # status: its own actions
REQUIRED = ("name", "tier")
Filter = Annotated[str | None, Query(max_length=200)]


def _values(tenant: Tenant) -> dict[str, Any]:
    values = {name: input_text(getattr(tenant, name)) for name in EDIT_FIELDS if name != "tier"}
    values["tier"] = tenant.tier.name
    values["status"] = tenant.status
    return values


def _create(session: Session, *, actor: str, tier: int | str, **values: Any) -> Tenant:
    """The form's tier is a name (or an id); the row stores the id."""
    tier_id = resolve(crud.get_tier, session, tier).id
    return crud.create_tenant(session, actor=actor, tier=tier_id, **values)


def _choices(session: Session) -> dict[str, Any]:
    # active_keys: shown on the edit page only (None hides it on a form shown again)
    return {"tiers": crud.list_tiers(session), "statuses": TENANT_STATUSES, "active_keys": None}


TENANTS = Resource[Tenant](
    entity="tenant",
    fields=FIELDS,
    edit_fields=EDIT_FIELDS,
    required=REQUIRED,
    get=crud.get_tenant,
    create=_create,
    delete=crud.delete_tenant,
    shown=_values,
    choices=_choices,
    stale_keys=key_prefixes,
)


@router.get("/tenants")
def list_tenants(
    request: Request,
    operator: OperatorDep,
    session: SessionDep,
    page: PageDep,
    q: Filter = None,
    tier: Filter = None,
    status: Filter = None,
) -> Response:
    search = (q or "").strip() or None
    tier_id = resolve(crud.get_tier, session, tier).id if tier else None
    chosen = status or None
    rows = crud.list_tenants(
        session, tier=tier_id, status=chosen, search=search, limit=page.limit, offset=page.offset
    )
    total = crud.count_tenants(session, tier=tier_id, status=chosen, search=search)
    return render(
        request,
        "tenants.html",
        active="tenants",
        title="Tenants",
        tenants=rows,
        tiers=crud.list_tiers(session),
        statuses=TENANT_STATUSES,
        filters={"q": q or "", "tier": tier or "", "status": status or ""},
        filtered=bool(search or tier_id or chosen),
        pager=pager(request, total=total, limit=page.limit, offset=page.offset, shown=len(rows)),
    )


@router.get("/tenants/-/new")
def new_tenant(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    return TENANTS.form(request, session, None, {"status": "active"})


@router.post("/tenants/-/new")
async def create_tenant(change: ChangeDep) -> Response:
    return await TENANTS.post_new(change, TenantCreate)


@router.get("/tenants/{name}")
def edit_tenant(
    request: Request, name: str, operator: OperatorDep, session: SessionDep
) -> Response:
    tenant = resolve(crud.get_tenant, session, name)
    keys = crud.count_keys(session, tenant=tenant.id, active_only=True)
    return TENANTS.form(request, session, tenant, _values(tenant), active_keys=keys)


def _save(change: Change, name: str, body: TenantUpdate) -> Saved:
    """Through the API's own helper (``tier`` by name); every key's cached identity is dropped
    once committed, as overrides and tier are part of it."""
    session = change.session
    with session.begin():
        before = resolve(crud.get_tenant, session, name).updated_at
        tenant = update_tenant(session, name, changes_of(body), change.operator.actor)
        saved, prefixes = Saved(tenant.name, tenant.updated_at != before), key_prefixes(tenant)
    invalidate(change.state, prefixes)
    return saved


@router.post("/tenants/{name}")
async def update_tenant_page(name: str, change: ChangeDep) -> Response:
    return await TENANTS.post_edit(
        change, name, TenantUpdate, lambda body: _save(change, name, body)
    )


async def _status(change: Change, name: str, *, active: bool) -> Response:
    actor = change.operator.actor
    tenant = await commit_and_invalidate(
        change,
        lambda s: set_tenant_status(s, name, actor, active=active),
        lambda t: t.name,
        key_prefixes,
    )
    verb = "activated" if active else "suspended: its keys stop working at once"
    return redirect(change.request, f"/ui/tenants/{tenant}", flash=f"Tenant {tenant} {verb}.")


@router.post("/tenants/{name}/suspend")
async def suspend_tenant(name: str, change: ChangeDep) -> Response:
    return await _status(change, name, active=False)


@router.post("/tenants/{name}/activate")
async def activate_tenant(name: str, change: ChangeDep) -> Response:
    return await _status(change, name, active=True)


@router.post("/tenants/{name}/delete")
async def delete_tenant(name: str, change: ChangeDep) -> Response:
    return await TENANTS.post_delete(change, name, verb="deleted, with its keys")
