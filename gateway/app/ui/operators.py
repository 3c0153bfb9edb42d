"""``/ui/operators``: named operators and their roles — list, add, change a role, reset a
credential, delete. Everyone on staff sees the list (who has access, never a credential); only
an owner changes it (:mod:`gateway.app.ui.rules`).

A new or reset credential is in the answer to the POST that made it (``<code
id="new-credential">``) and nowhere else, as a new key is. Changes go through the same crud
calls as ``/admin/v1/operators`` and are audited as ``admin-ui:<operator>``; a refusal (a name
taken, a tenant admin without a tenant, the last owner demoted) is shown beside its field. The
add and reset forms act once (a one-time ``form_token``, as the key forms): reloading the page
that showed a credential is 409 and issues no other, which would silently replace the one just
handed over.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.helpers import tenant_resolver
from gateway.app.admin.operator_schemas import OperatorOut
from gateway.app.ui.deps import Change, ChangeDep, OperatorDep, SessionDep, UiRoute
from gateway.app.ui.forms import attempt, field_errors, form_token, new_form_token, read_form
from gateway.app.ui.render import redirect, render
from gateway.db.crud import operators
from gateway.db.crud.operators import IssuedCredential
from gateway.db.models import OPERATOR_ROLES
from gateway.errors import ApiError

router = APIRouter(route_class=UiRoute)

ROLE_LABELS = {
    "owner": "owner — everything, including operators",
    "operator": "operator — tiers, tenants, keys, backends, profiles",
    "viewer": "viewer — reads everything, changes nothing",
    "tenant_admin": "tenant admin — one tenant's keys and usage",
}
ROLE_OPTIONS = [(r, ROLE_LABELS[r]) for r in OPERATOR_ROLES]
FIELDS = ("name", "role", "tenant")


def _tenant(session: Session, text: str) -> int | None:
    return tenant_resolver(session)(text) if text else None


@router.get("/operators")
def list_operators(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    rows = [OperatorOut.of(r) for r in operators.list_operators(session)]
    return render(request, "operators.html", active="operators", title="Operators", operators=rows)


def _form(
    request: Request,
    *,
    values: dict[str, str],
    errors: dict[str, str] | None = None,
    status_code: int = 200,
    entry: OperatorOut | None = None,
) -> Response:
    title = f"Operator {entry.name}" if entry is not None else "New operator"
    return render(
        request,
        "operator_form.html",
        status_code=status_code,
        active="operators",
        title=title,
        values=values,
        errors=errors or {},
        entry=entry,
        roles=ROLE_OPTIONS,
        form_token=new_form_token(),
    )


@router.get("/operators/-/new")
def new_operator(request: Request, operator: OperatorDep) -> Response:
    return _form(request, values={"role": "viewer"})


def _issued(request: Request, title: str, issued: IssuedCredential) -> Response:
    """The only page that ever shows an operator's credential: the answer to the POST."""
    entry = OperatorOut.of(issued.row)
    return render(
        request,
        "operator_created.html",
        status_code=201,
        active="operators",
        title=title,
        entry=entry,
        secret=issued.plaintext,
    )


@router.post("/operators/-/new")
async def create_operator(change: ChangeDep) -> Response:
    values = await read_form(change.request)
    token = await form_token(change.request)

    def create() -> IssuedCredential:
        with change.session.begin():
            return operators.create_credential(
                change.session,
                actor=change.operator.actor,
                secret=change.state.secret,
                name=values.get("name", "").strip(),
                role=values.get("role", ""),
                tenant=_tenant(change.session, values.get("tenant", "").strip()),
                form_token=token,
            )

    result = await run_in_threadpool(attempt, create)
    if isinstance(result, ApiError):
        if result.param == "form_token":  # a reload of the page that showed the credential
            raise result
        errors = field_errors(result, FIELDS)
        return _form(change.request, values=values, errors=errors, status_code=result.status)
    return _issued(change.request, "Operator created", result)


@router.get("/operators/{name}")
def view_operator(
    request: Request, name: str, operator: OperatorDep, session: SessionDep
) -> Response:
    entry = OperatorOut.of(operators.get_operator(session, name))
    values = {"role": entry.role, "tenant": entry.tenant or ""}
    return _form(request, values=values, entry=entry)


@router.post("/operators/{name}")
async def update_operator(name: str, change: ChangeDep) -> Response:
    values = await read_form(change.request)

    def update() -> OperatorOut:
        with change.session.begin():
            row = operators.set_role(
                change.session,
                name,
                actor=change.operator.actor,
                role=values.get("role", ""),
                tenant=_tenant(change.session, values.get("tenant", "").strip()),
            )
            return OperatorOut.of(row)

    result = await run_in_threadpool(attempt, update)
    if isinstance(result, ApiError):
        if result.status == 404 and result.param == "operator":
            raise result

        def again() -> Response:
            entry = OperatorOut.of(operators.get_operator(change.session, name))
            return _form(
                change.request,
                values=values,
                errors=field_errors(result, FIELDS),
                status_code=result.status,
                entry=entry,
            )

        return await run_in_threadpool(again)
    flash = f"Operator {result.name} is now a {result.role.replace('_', ' ')}."
    return redirect(change.request, f"/ui/operators/{result.name}", flash=flash)


def _reset(change: Change, name: str, token: str | None) -> IssuedCredential:
    with change.session.begin():
        operators.get_operator(change.session, name)  # 404, not a new operator
        return operators.reset_credential(
            change.session,
            actor=change.operator.actor,
            secret=change.state.secret,
            name=name,
            form_token=token,
        )


@router.post("/operators/{name}/reset")
async def reset_operator(name: str, change: ChangeDep) -> Response:
    """A reload of the page that showed the new credential sends the same form token: 409,
    and the credential shown stays the one that works."""
    token = await form_token(change.request)
    issued = await run_in_threadpool(_reset, change, name, token)
    return _issued(change.request, "Credential reset", issued)


@router.post("/operators/{name}/delete")
async def delete_operator(name: str, change: ChangeDep) -> Response:
    def delete() -> Any:
        with change.session.begin():
            return operators.delete_operator(change.session, name, actor=change.operator.actor)

    await run_in_threadpool(delete)
    flash = f"Operator {name} deleted: its credential and sessions no longer work."
    return redirect(change.request, "/ui/operators", flash=flash)
