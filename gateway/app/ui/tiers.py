"""``/ui/tiers``: the service classes — list, create, edit, delete.

Every field the admin API takes (``TierCreate``/``TierUpdate``): weight, SLOs and their
minimums, limits, best effort, shed slack, default request kind. A form is validated by the
API's own model, then changed through the same crud calls and side effects as
``/admin/v1/tiers`` (an edit drops every cached identity: each tenant on the tier has a new
effective policy).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.helpers import delete_row, invalidate, patch_row, resolve
from gateway.app.admin.schemas import TierCreate, TierUpdate
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
from gateway.db import crud
from gateway.db.crud.tiers import TIER_KINDS
from gateway.db.models import Tier
from gateway.errors import ApiError

router = APIRouter(route_class=UiRoute)

FIELDS: dict[str, Kind] = {
    "name": "text",
    "description": "text",
    "weight": "number",
    "ttft_ms": "number",
    "tpot_ms": "number",
    "deadline_ms": "number",
    "min_ttft_ms": "number",
    "min_tpot_ms": "number",
    "min_deadline_ms": "number",
    "rpm_limit": "number",
    "tpm_limit": "number",
    "max_concurrency": "number",
    "best_effort_allowed": "bool",
    "shed_slack": "number",
    "default_kind": "ref",
}
REQUIRED = ("name", "weight", "ttft_ms", "tpot_ms", "shed_slack")
NEW_DEFAULTS = {"best_effort_allowed": False, "shed_slack": "0", "default_kind": "latency"}
KIND_OPTIONS = [(kind, kind) for kind in TIER_KINDS]
"""The default-kind select's options (the API's ``TierKind``)."""


def input_text(value: Any) -> Any:
    """A stored value as a form shows it: exact numbers without a trailing ``.0``."""
    if value is None:
        return ""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _values(tier: Tier) -> dict[str, Any]:
    return {name: input_text(getattr(tier, name)) for name in FIELDS}


def _form(
    request: Request,
    *,
    tier: Tier | None,
    values: dict[str, Any],
    errors: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    return render(
        request,
        "tier_form.html",
        status_code=status_code,
        active="tiers",
        title=f"Tier {tier.name}" if tier is not None else "New tier",
        tier=tier,
        values=values,
        errors=errors or {},
        kinds=KIND_OPTIONS,
    )


@router.get("/tiers")
def list_tiers(
    request: Request, operator: OperatorDep, session: SessionDep, page: PageDep
) -> Response:
    rows = crud.list_tiers(session, limit=page.limit, offset=page.offset)
    total = crud.count_tiers(session)
    return render(
        request,
        "tiers.html",
        active="tiers",
        title="Tiers",
        tiers=rows,
        pager=pager(request, total=total, limit=page.limit, offset=page.offset, shown=len(rows)),
    )


@router.get("/tiers/new")
def new_tier(request: Request, operator: OperatorDep) -> Response:
    return _form(request, tier=None, values=dict(NEW_DEFAULTS))


def _create(session: Session, operator: Operator, body: TierCreate) -> str:
    with session.begin():
        return crud.create_tier(session, actor=operator.actor, **body.model_dump()).name


@router.post("/tiers/new")
async def create_tier(
    request: Request, operator: OperatorDep, _: CsrfDep, session: SessionDep
) -> Response:
    values = await read_form(request)
    body = convert(values, FIELDS, blank_is_null=False, required=REQUIRED)

    def change() -> str:
        return _create(session, operator, validate(TierCreate, body))

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        errors = field_errors(result, FIELDS)
        return _form(request, tier=None, values=values, errors=errors, status_code=result.status)
    return redirect(request, "/ui/tiers", flash=f"Tier {result} created.")


@router.get("/tiers/{name}")
def edit_tier(request: Request, name: str, operator: OperatorDep, session: SessionDep) -> Response:
    tier = resolve(crud.get_tier, session, name)
    return _form(request, tier=tier, values=_values(tier))


def _update(
    session: Session, state: GatewayState, operator: Operator, name: str, body: TierUpdate
) -> tuple[str, bool]:
    with session.begin():
        tier, changed = patch_row(
            session, operator.actor, name, crud.get_tier, crud.update_tier, body
        )
        new_name = tier.name
    if changed:
        invalidate(state, None)  # every tenant on the tier has a new effective policy
    return new_name, changed


@router.post("/tiers/{name}")
async def update_tier(
    request: Request,
    name: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    values = await read_form(request)
    body = convert(values, FIELDS, blank_is_null=True, required=REQUIRED)

    def change() -> tuple[str, bool]:
        return _update(session, state, operator, name, validate(TierUpdate, body))

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        if result.status == 404 and result.param == "tier":
            raise result
        tier = await run_in_threadpool(resolve, crud.get_tier, session, name)
        errors = field_errors(result, FIELDS)
        return _form(request, tier=tier, values=values, errors=errors, status_code=result.status)
    new_name, changed = result
    flash = f"Tier {new_name} saved." if changed else f"Tier {new_name}: nothing changed."
    return redirect(request, "/ui/tiers", flash=flash)


@router.post("/tiers/{name}/delete")
async def delete_tier(
    request: Request, name: str, operator: OperatorDep, _: CsrfDep, session: SessionDep
) -> Response:
    def change() -> str:
        with session.begin():
            tier = resolve(crud.get_tier, session, name)
            return delete_row(
                session, operator.actor, crud.delete_tier, "tier", tier.id, tier.name
            ).name

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        if result.status == 404:
            raise result
        tier = await run_in_threadpool(resolve, crud.get_tier, session, name)
        errors = {"__form__": result.message}
        return _form(
            request, tier=tier, values=_values(tier), errors=errors, status_code=result.status
        )
    return redirect(request, "/ui/tiers", flash=f"Tier {result} deleted.")
