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
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.helpers import (
    change_and_invalidate,
    delete_row,
    invalidate,
    key_prefixes,
    resolve,
    set_tenant_status,
    update_tenant,
)
from gateway.app.admin.schemas import TenantCreate, TenantUpdate
from gateway.app.state import GatewayState
from gateway.app.ui.deps import (
    CsrfDep,
    Operator,
    OperatorDep,
    PageDep,
    SessionDep,
    StateDep,
    UiRoute,
)
from gateway.app.ui.forms import Kind, attempt, convert, field_errors, read_form, validate
from gateway.app.ui.render import pager, redirect, render
from gateway.app.ui.tiers import input_text
from gateway.db import crud
from gateway.db.models import TENANT_STATUSES, Tenant
from gateway.errors import ApiError

router = APIRouter(route_class=UiRoute)

FIELDS: dict[str, Kind] = {
    "name": "text",
    "tier": "ref",
    "status": "text",
    "ttft_ms": "number",
    "tpot_ms": "number",
    "deadline_ms": "number",
    "rpm_limit": "number",
    "tpm_limit": "number",
    "max_concurrency": "number",
}
EDIT_FIELDS = {k: v for k, v in FIELDS.items() if k != "status"}  # status: its own actions
REQUIRED = ("name", "tier")
Filter = Annotated[str | None, Query(max_length=200)]


def _values(tenant: Tenant) -> dict[str, Any]:
    values = {name: input_text(getattr(tenant, name)) for name in EDIT_FIELDS if name != "tier"}
    values["tier"] = tenant.tier.name
    values["status"] = tenant.status
    return values


def _form(
    request: Request,
    session: Session,
    *,
    tenant: Tenant | None,
    values: dict[str, Any],
    errors: dict[str, str] | None = None,
    status_code: int = 200,
    active_keys: int | None = None,
) -> Response:
    return render(
        request,
        "tenant_form.html",
        active_keys=active_keys,
        status_code=status_code,
        active="tenants",
        title=f"Tenant {tenant.name}" if tenant is not None else "New tenant",
        tenant=tenant,
        tiers=crud.list_tiers(session),
        statuses=TENANT_STATUSES,
        values=values,
        errors=errors or {},
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


@router.get("/tenants/new")
def new_tenant(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    return _form(request, session, tenant=None, values={"status": "active"})


def _create(session: Session, operator: Operator, body: TenantCreate) -> str:
    with session.begin():
        values = body.model_dump()
        values["tier"] = resolve(crud.get_tier, session, body.tier).id
        return crud.create_tenant(session, actor=operator.actor, **values).name


@router.post("/tenants/new")
async def create_tenant(
    request: Request, operator: OperatorDep, _: CsrfDep, session: SessionDep
) -> Response:
    values = await read_form(request)
    body = convert(values, FIELDS, blank_is_null=False, required=REQUIRED)

    def change() -> str:
        return _create(session, operator, validate(TenantCreate, body))

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        errors = field_errors(result, FIELDS)
        return await run_in_threadpool(
            lambda: _form(
                request,
                session,
                tenant=None,
                values=values,
                errors=errors,
                status_code=result.status,
            )
        )
    return redirect(request, "/ui/tenants", flash=f"Tenant {result} created.")


@router.get("/tenants/{name}")
def edit_tenant(
    request: Request, name: str, operator: OperatorDep, session: SessionDep
) -> Response:
    tenant = resolve(crud.get_tenant, session, name)
    keys = crud.count_keys(session, tenant=tenant.id, active_only=True)
    return _form(request, session, tenant=tenant, values=_values(tenant), active_keys=keys)


@router.post("/tenants/{name}")
async def update_tenant_page(
    request: Request,
    name: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    values = await read_form(request)
    body = convert(values, EDIT_FIELDS, blank_is_null=True, required=REQUIRED)

    def change() -> tuple[str, bool]:
        patch = validate(TenantUpdate, body).model_dump(exclude_unset=True)
        with session.begin():
            tenant = resolve(crud.get_tenant, session, name)
            before = tenant.updated_at
            tenant = update_tenant(session, name, patch, operator.actor)
            out = tenant.name, tenant.updated_at != before
            prefixes = key_prefixes(tenant)
        invalidate(state, prefixes)
        return out

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        if result.status == 404 and result.param == "tenant":
            raise result

        def again(error: ApiError = result) -> Response:
            tenant = resolve(crud.get_tenant, session, name)
            values["status"] = tenant.status
            errors = field_errors(error, EDIT_FIELDS)
            return _form(
                request,
                session,
                tenant=tenant,
                values=values,
                errors=errors,
                status_code=error.status,
            )

        return await run_in_threadpool(again)
    new_name, changed = result
    flash = f"Tenant {new_name} saved." if changed else f"Tenant {new_name}: nothing changed."
    return redirect(request, "/ui/tenants", flash=flash)


async def _status(
    request: Request,
    name: str,
    operator: Operator,
    session: Session,
    state: GatewayState,
    *,
    active: bool,
) -> Response:
    def change() -> Tenant:
        return change_and_invalidate(
            state,
            session,
            lambda s: set_tenant_status(s, name, operator.actor, active=active),
            lambda t: t,
            key_prefixes,
        )

    tenant = await run_in_threadpool(change)
    verb = "activated" if active else "suspended: its keys stop working at once"
    return redirect(request, f"/ui/tenants/{tenant.name}", flash=f"Tenant {tenant.name} {verb}.")


@router.post("/tenants/{name}/suspend")
async def suspend_tenant(
    request: Request,
    name: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    return await _status(request, name, operator, session, state, active=False)


@router.post("/tenants/{name}/activate")
async def activate_tenant(
    request: Request,
    name: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    return await _status(request, name, operator, session, state, active=True)


@router.post("/tenants/{name}/delete")
async def delete_tenant(
    request: Request,
    name: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    def change() -> str:
        with session.begin():
            tenant = resolve(crud.get_tenant, session, name)
            prefixes = key_prefixes(tenant)
            out = delete_row(
                session, operator.actor, crud.delete_tenant, "tenant", tenant.id, tenant.name
            )
        invalidate(state, prefixes)
        return out.name

    deleted = await run_in_threadpool(change)
    return redirect(request, "/ui/tenants", flash=f"Tenant {deleted} deleted, with its keys.")
