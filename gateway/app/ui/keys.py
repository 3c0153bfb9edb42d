"""``/ui/keys``: tenants' API keys — list (by tenant, usable only), create, revoke, rotate.

A new key's plaintext is in the answer to the POST that made it (``<code id="new-secret">``)
and nowhere else: not in a redirect, a cookie, a log or a later page (``Cache-Control:
no-store`` on every dashboard page). Rotating issues the successor, shown the same way, and
gives the old key a grace period. Changes go through the same crud calls and side effects as
``/admin/v1/keys`` (the key's cached identity is dropped once committed).

The create and rotate forms act once: each carries a one-time token (``form_token``, made when
the form is rendered) whose keyed hash the issued key keeps (a unique column). Reloading the
page that showed the secret makes the browser post the same form again; that post issues
nothing and answers 409 naming the key the first one issued — never its secret, which exists
nowhere any more. Two posts racing each other are settled by the unique index the same way.

A tenant admin sees and changes its own tenant's keys only: another tenant's key, named by any
prefix, is a 403 page, as is one that does not exist (as on ``/admin/v1/keys``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.helpers import invalidate, own_prefix, scoped_key, tenant_resolver
from gateway.app.admin.keys import listed_keys
from gateway.app.admin.roles import Principal
from gateway.app.admin.schemas import KeyCreate, KeyOut, KeyRotate
from gateway.app.ui.deps import (
    DEFAULT_PAGE,
    Change,
    ChangeDep,
    OperatorDep,
    Page,
    PageDep,
    SessionDep,
    UiRoute,
)
from gateway.app.ui.forms import Kind, field_errors, form_token, new_form_token
from gateway.app.ui.render import pager, redirect, render
from gateway.app.ui.resource import commit_and_invalidate, submit
from gateway.db import crud
from gateway.db.crud.keys import DEFAULT_GRACE_S, find_key_by_form_token
from gateway.db.errors import Conflict
from gateway.db.models import ApiKey, utcnow
from gateway.errors import ApiError

router = APIRouter(route_class=UiRoute)

CREATE_FIELDS: dict[str, Kind] = {"tenant": "ref", "name": "text", "expires_at": "datetime"}
ROTATE_FIELDS: dict[str, Kind] = {"grace_s": "number", "expires_at": "datetime"}
Filter = Annotated[str | None, Query(max_length=200)]
IssuedT = TypeVar("IssuedT")


@dataclass(frozen=True, slots=True)
class Repeated:
    """A create or rotate form sent again: the key its first submission issued."""

    key: KeyOut


def _list_context(
    session: Session,
    request: Request,
    who: Principal,
    page: Any,
    tenant: str | None,
    active_only: bool,
) -> dict[str, Any]:
    """The list, filtered (a tenant admin's: always to its own tenant, named or not)."""
    tenant_id = who.tenant_filter(tenant or None, tenant_resolver(session))
    now = utcnow()
    rows, total = listed_keys(session, tenant_id, active_only, now, page.limit, page.offset)
    return {
        "keys": [KeyOut.of(k, now) for k in rows],
        "filters": {"tenant": tenant or "", "active_only": active_only},
        "filtered": bool(tenant or active_only),
        "pager": pager(request, total=total, limit=page.limit, offset=page.offset, shown=len(rows)),
        "form_token": new_form_token(),
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
    who = operator.principal
    context = _list_context(session, request, who, page, tenant, active_only)
    values = {"tenant": tenant or who.tenant_name or ""}
    return render(request, "keys.html", active="keys", title="Keys", values=values, **context)


def _once(change: Change, token: str | None, issue: Callable[[], IssuedT]) -> IssuedT | Repeated:
    """``issue``'s result or, when it was refused because this form's token already issued a
    key (crud's check, or the unique index when two posts raced past it), that key."""
    try:
        return issue()
    except (Conflict, SQLAlchemyError):
        if token is None:
            raise
        with change.session.begin():  # the refused transaction is rolled back: a fresh one
            earlier = find_key_by_form_token(change.session, change.state.secret, token)
            if earlier is None:
                raise
            return Repeated(KeyOut.of(earlier))


def _create(change: Change, token: str | None, body: KeyCreate) -> tuple[str, KeyOut]:
    session = change.session
    with session.begin():
        tenant = change.operator.principal.tenant_filter(body.tenant, tenant_resolver(session))
        assert tenant is not None
        created = crud.create_key(
            session,
            actor=change.operator.actor,
            tenant=tenant,
            secret=change.state.secret,
            name=body.name,
            expires_at=body.expires_at,
            form_token=token,
        )
        return created.plaintext, KeyOut.of(created.api_key)


def _created(
    request: Request, title: str, plaintext: str, key: KeyOut, replaces: KeyOut | None
) -> Response:
    """The only page that ever shows a key's plaintext: the answer to the POST that made it."""
    context: dict[str, Any] = {"secret": plaintext, "key": key, "replaces": replaces}
    return render(
        request, "key_created.html", status_code=201, active="keys", title=title, **context
    )


def _repeated(request: Request, repeated: Repeated) -> Response:
    """409: this form already issued ``repeated.key``; its secret is not shown again."""
    title = "Key already created"
    return render(
        request,
        "key_repeated.html",
        status_code=409,
        active="keys",
        title=title,
        key=repeated.key,
    )


@router.post("/keys/new")
async def create_key(change: ChangeDep) -> Response:
    token = await form_token(change.request)
    values, result = await submit(
        change,
        CREATE_FIELDS,
        KeyCreate,
        lambda body: _once(change, token, partial(_create, change, token, body)),
        blank_is_null=False,
        required=("tenant",),
    )
    if isinstance(result, ApiError):
        error = result

        def again() -> Response:
            page = Page(DEFAULT_PAGE, 0)
            who = change.operator.principal
            context = _list_context(change.session, change.request, who, page, None, False)
            errors = field_errors(error, CREATE_FIELDS)
            return render(
                change.request,
                "keys.html",
                status_code=error.status,
                active="keys",
                title="Keys",
                values=values,
                errors=errors,
                **context,
            )

        return await run_in_threadpool(again)
    if isinstance(result, Repeated):
        return _repeated(change.request, result)
    plaintext, key = result
    return _created(change.request, "Key created", plaintext, key, None)


@router.get("/keys/{prefix}")
def key_detail(
    request: Request, prefix: str, operator: OperatorDep, session: SessionDep
) -> Response:
    key = KeyOut.of(scoped_key(session, operator.principal, prefix))
    return _detail(request, key, values={"grace_s": str(int(DEFAULT_GRACE_S))})


def _detail(
    request: Request,
    key: KeyOut,
    *,
    values: dict[str, Any],
    errors: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    title = f"Key {key.prefix}"
    context: dict[str, Any] = {
        "key": key,
        "values": values,
        "errors": errors or {},
        "form_token": new_form_token(),
    }
    return render(
        request, "key_detail.html", status_code=status_code, active="keys", title=title, **context
    )


@router.post("/keys/{prefix}/revoke")
async def revoke_key(prefix: str, change: ChangeDep) -> Response:
    actor, who = change.operator.actor, change.operator.principal

    def revoke(s: Session) -> ApiKey:
        scoped_key(s, who, prefix)
        return crud.revoke_key(s, prefix, actor=actor)

    key = await commit_and_invalidate(change, revoke, KeyOut.of, own_prefix)
    flash = f"Key {key.prefix} revoked: it stops working now."
    return redirect(change.request, f"/ui/keys/{key.prefix}", flash=flash)


def _rotate(
    change: Change, prefix: str, token: str | None, body: KeyRotate
) -> tuple[str, KeyOut, KeyOut]:
    session = change.session
    with session.begin():
        scoped_key(session, change.operator.principal, prefix)
        created = crud.rotate_key(
            session,
            prefix,
            actor=change.operator.actor,
            secret=change.state.secret,
            grace_s=body.grace_s,
            expires_at=body.expires_at,
            form_token=token,
        )
        old = crud.get_key(session, prefix)
        out = created.plaintext, KeyOut.of(created.api_key), KeyOut.of(old)
    invalidate(change.state, [old.prefix])  # its cached identity outlived the new expiry
    return out


@router.post("/keys/{prefix}/rotate")
async def rotate_key(prefix: str, change: ChangeDep) -> Response:
    token = await form_token(change.request)

    def rotate(body: KeyRotate) -> tuple[str, KeyOut, KeyOut] | Repeated:
        return _once(change, token, partial(_rotate, change, prefix, token, body))

    values, result = await submit(change, ROTATE_FIELDS, KeyRotate, rotate, blank_is_null=False)
    if isinstance(result, ApiError):
        if result.status in (403, 404):  # no such key, or not this tenant admin's
            raise result
        error = result
        key = await run_in_threadpool(lambda: KeyOut.of(crud.get_key(change.session, prefix)))
        errors = field_errors(error, ROTATE_FIELDS)
        return _detail(change.request, key, values=values, errors=errors, status_code=error.status)
    if isinstance(result, Repeated):
        return _repeated(change.request, result)
    plaintext, new, old = result
    return _created(change.request, "Key rotated", plaintext, new, old)
