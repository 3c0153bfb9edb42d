"""``/ui/keys``: tenants' API keys — list (by tenant, usable only), create, revoke, rotate.

A new key's plaintext is in the answer to the POST that made it (``<code id="new-secret">``)
and nowhere else: not in a redirect, a cookie, a log or a later page (``Cache-Control:
no-store`` on every dashboard page). Rotating issues the successor, shown the same way, and
gives the old key a grace period. Changes go through the same crud calls and side effects as
``/admin/v1/keys`` (the key's cached identity is dropped once committed).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.helpers import change_and_invalidate, invalidate, own_prefix, resolve
from gateway.app.admin.schemas import KeyCreate, KeyOut, KeyRotate
from gateway.app.state import GatewayState
from gateway.app.ui.deps import (
    DEFAULT_PAGE,
    CsrfDep,
    Operator,
    OperatorDep,
    Page,
    PageDep,
    SessionDep,
    StateDep,
    UiRoute,
)
from gateway.app.ui.forms import Kind, attempt, convert, field_errors, read_form, validate
from gateway.app.ui.render import pager, redirect, render
from gateway.db import crud
from gateway.db.crud.keys import DEFAULT_GRACE_S
from gateway.db.models import utcnow
from gateway.errors import ApiError

router = APIRouter(route_class=UiRoute)

CREATE_FIELDS: dict[str, Kind] = {"tenant": "ref", "name": "text", "expires_at": "datetime"}
ROTATE_FIELDS: dict[str, Kind] = {"grace_s": "number", "expires_at": "datetime"}
Filter = Annotated[str | None, Query(max_length=200)]


def _list_context(
    session: Session, request: Request, page: Any, tenant: str | None, active_only: bool
) -> dict[str, Any]:
    tenant_id = resolve(crud.get_tenant, session, tenant).id if tenant else None
    now = utcnow()
    rows = crud.list_keys(
        session,
        tenant=tenant_id,
        active_only=active_only,
        now=now,
        limit=page.limit,
        offset=page.offset,
    )
    total = crud.count_keys(session, tenant=tenant_id, active_only=active_only, now=now)
    return {
        "keys": [KeyOut.of(k, now) for k in rows],
        "filters": {"tenant": tenant or "", "active_only": active_only},
        "filtered": bool(tenant_id or active_only),
        "pager": pager(request, total=total, limit=page.limit, offset=page.offset, shown=len(rows)),
    }


@router.get("/keys")
def list_keys(
    request: Request,
    operator: OperatorDep,
    session: SessionDep,
    page: PageDep,
    tenant: Filter = None,
    active_only: bool = False,
) -> Response:
    context = _list_context(session, request, page, tenant, active_only)
    values = {"tenant": tenant or ""}
    return render(request, "keys.html", active="keys", title="Keys", values=values, **context)


def _create(session: Session, state: GatewayState, operator: Operator, body: KeyCreate) -> Any:
    with session.begin():
        created = crud.create_key(
            session,
            actor=operator.actor,
            tenant=resolve(crud.get_tenant, session, body.tenant).id,
            secret=state.secret,
            name=body.name,
            expires_at=body.expires_at,
        )
        return created.plaintext, KeyOut.of(created.api_key)


@router.post("/keys/new")
async def create_key(
    request: Request,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    values = await read_form(request)
    body = convert(values, CREATE_FIELDS, blank_is_null=False, required=("tenant",))

    def change() -> Any:
        return _create(session, state, operator, validate(KeyCreate, body))

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        error = result

        def again() -> Response:
            page = Page(DEFAULT_PAGE, 0)
            context = _list_context(session, request, page, None, False)
            return render(
                request,
                "keys.html",
                status_code=error.status,
                active="keys",
                title="Keys",
                values=values,
                errors=field_errors(error, CREATE_FIELDS),
                **context,
            )

        return await run_in_threadpool(again)
    plaintext, key = result
    return render(
        request,
        "key_created.html",
        status_code=201,
        active="keys",
        title="Key created",
        secret=plaintext,
        key=key,
        replaces=None,
    )


@router.get("/keys/{prefix}")
def key_detail(
    request: Request, prefix: str, operator: OperatorDep, session: SessionDep
) -> Response:
    key = KeyOut.of(crud.get_key(session, prefix))
    return _detail(request, key, values={"grace_s": str(int(DEFAULT_GRACE_S))})


def _detail(
    request: Request,
    key: KeyOut,
    *,
    values: dict[str, Any],
    errors: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    return render(
        request,
        "key_detail.html",
        status_code=status_code,
        active="keys",
        title=f"Key {key.prefix}",
        key=key,
        values=values,
        errors=errors or {},
    )


@router.post("/keys/{prefix}/revoke")
async def revoke_key(
    request: Request,
    prefix: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    def change() -> KeyOut:
        return change_and_invalidate(
            state,
            session,
            lambda s: crud.revoke_key(s, prefix, actor=operator.actor),
            KeyOut.of,
            own_prefix,
        )

    key = await run_in_threadpool(change)
    return redirect(
        request, f"/ui/keys/{key.prefix}", flash=f"Key {key.prefix} revoked: it stops working now."
    )


def _rotate(
    session: Session, state: GatewayState, operator: Operator, prefix: str, body: KeyRotate
) -> tuple[str, KeyOut, KeyOut]:
    with session.begin():
        created = crud.rotate_key(
            session,
            prefix,
            actor=operator.actor,
            secret=state.secret,
            grace_s=body.grace_s,
            expires_at=body.expires_at,
        )
        old = crud.get_key(session, prefix)
        out = created.plaintext, KeyOut.of(created.api_key), KeyOut.of(old)
    invalidate(state, [old.prefix])  # its cached identity outlived the new expiry
    return out


@router.post("/keys/{prefix}/rotate")
async def rotate_key(
    request: Request,
    prefix: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    values = await read_form(request)
    body = convert(values, ROTATE_FIELDS, blank_is_null=False)

    def change() -> tuple[str, KeyOut, KeyOut]:
        return _rotate(session, state, operator, prefix, validate(KeyRotate, body))

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        if result.status == 404:
            raise result
        error = result
        key = await run_in_threadpool(lambda: KeyOut.of(crud.get_key(session, prefix)))
        errors = field_errors(error, ROTATE_FIELDS)
        return _detail(request, key, values=values, errors=errors, status_code=error.status)
    plaintext, new, old = result
    return render(
        request,
        "key_created.html",
        status_code=201,
        active="keys",
        title="Key rotated",
        secret=plaintext,
        key=new,
        replaces=old,
    )
