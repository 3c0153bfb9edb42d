"""``/ui/prices`` and ``/ui/budgets``: what each model's tokens cost, and the tenants' and
keys' spend budgets with what each period has spent so far.

The same crud calls, checks and side effects as ``/admin/v1/prices`` and ``/admin/v1/budgets``
(a form is validated by the API's own model; the gateway's price book and budget guard re-read
after a change). Staff change them; a tenant admin sees its own tenant's budgets only. A
refusal shows the page again with the API's words above the form.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.budgets import present
from gateway.app.admin.helpers import resolve
from gateway.app.admin.spend_schemas import BudgetCreate, PriceCreate
from gateway.app.ui.deps import Change, ChangeDep, OperatorDep, SessionDep, UiRoute
from gateway.app.ui.forms import FORM_ERROR, attempt, read_form, validate
from gateway.app.ui.render import redirect, render
from gateway.db import crud
from gateway.db.crud import budgets, prices
from gateway.errors import ApiError

router = APIRouter(route_class=UiRoute)

PRICE_FIELDS = ("model", "prompt_per_mtok", "completion_per_mtok")
BUDGET_FIELDS = ("tenant", "key", "period", "amount", "soft_fraction", "webhook_url")


def _prices_page(
    request: Request,
    session: Any,
    *,
    values: dict[str, str] | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    return render(
        request,
        "prices.html",
        status_code=status_code,
        active="prices",
        title="Prices",
        prices=prices.list_prices(session),
        values=values or {},
        errors={FORM_ERROR: error} if error else {},
    )


@router.get("/prices")
def list_prices(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    return _prices_page(request, session)


def _set_price(change: Change, body: PriceCreate) -> str:
    """Create the model's price, or change it if it has one (one form for both)."""
    with change.session.begin():
        found = prices.find_price(change.session, body.model)
        actor = change.operator.actor
        if found is None:
            prices.create_price(change.session, actor=actor, **body.model_dump())
        else:
            changes = {"prompt_per_mtok": body.prompt_per_mtok}
            changes["completion_per_mtok"] = body.completion_per_mtok
            prices.update_price(change.session, found.id, changes, actor=actor)
    return body.model


def _stale(change: Change) -> None:
    for name in ("prices", "budgets"):
        target = getattr(change.state, name, None)
        if target is not None:
            target.invalidate()


@router.post("/prices/-/new")
async def set_price(change: ChangeDep) -> Response:
    values = await read_form(change.request)
    body = {k: values.get(k, "").strip() for k in PRICE_FIELDS}
    result = await run_in_threadpool(
        attempt, lambda: _set_price(change, validate(PriceCreate, body))
    )
    if isinstance(result, ApiError):
        return await run_in_threadpool(
            lambda: _prices_page(
                change.request,
                change.session,
                values=values,
                error=result.message,
                status_code=result.status,
            )
        )
    _stale(change)
    return redirect(change.request, "/ui/prices", flash=f"Price of {result} set.")


@router.post("/prices/{ref}/delete")
async def delete_price(ref: str, change: ChangeDep) -> Response:
    def remove() -> str:
        with change.session.begin():
            row = resolve(prices.get_price, change.session, ref)
            model = row.model
            prices.delete_price(change.session, row.id, actor=change.operator.actor)
            return model

    result = await run_in_threadpool(attempt, remove)
    if isinstance(result, ApiError):
        raise result
    _stale(change)
    return redirect(change.request, "/ui/prices", flash=f"Price of {result} deleted.")


def _budgets_page(
    request: Request,
    operator: Any,
    session: Any,
    *,
    values: dict[str, str] | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    who = operator.principal
    tenant_id = who.tenant_id if who.tenant_bound else None
    rows = [present(session, r) for r in budgets.list_budgets(session, tenant=tenant_id)]
    return render(
        request,
        "budgets.html",
        status_code=status_code,
        active="budgets",
        title="Budgets",
        budgets=rows,
        values=values or {"period": "month"},
        errors={FORM_ERROR: error} if error else {},
        periods=[("day", "Day (UTC)"), ("month", "Month (UTC)")],
    )


@router.get("/budgets")
def list_budgets(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    return _budgets_page(request, operator, session)


def _create_budget(change: Change, body: BudgetCreate) -> int:
    with change.session.begin():
        session = change.session
        tenant = resolve(crud.get_tenant, session, body.tenant).id if body.tenant else None
        row = budgets.create_budget(
            session,
            actor=change.operator.actor,
            tenant=tenant,
            key=body.key,
            period=body.period,
            amount=body.amount,
            soft_fraction=body.soft_fraction,
            webhook_url=body.webhook_url,
        )
        return row.id


def _budget_body(values: dict[str, str]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for name in BUDGET_FIELDS:
        text = values.get(name, "").strip()
        if not text:
            continue
        if name == "soft_fraction":
            try:
                body[name] = float(text)
            except ValueError:
                body[name] = text  # the model refuses it, naming the field
        else:
            body[name] = text
    return body


@router.post("/budgets/-/new")
async def create_budget(change: ChangeDep) -> Response:
    values = await read_form(change.request)
    result = await run_in_threadpool(
        attempt, lambda: _create_budget(change, validate(BudgetCreate, _budget_body(values)))
    )
    if isinstance(result, ApiError):
        return await run_in_threadpool(
            lambda: _budgets_page(
                change.request,
                change.operator,
                change.session,
                values=values,
                error=result.message,
                status_code=result.status,
            )
        )
    _stale(change)
    return redirect(change.request, "/ui/budgets", flash=f"Budget {result} created.")


@router.post("/budgets/{budget_id}/delete")
async def delete_budget(budget_id: str, change: ChangeDep) -> Response:
    def remove() -> int:
        if not budget_id.isascii() or not budget_id.isdigit() or int(budget_id) > 2**31 - 1:
            raise ApiError(404, f"budget {budget_id!r} does not exist", code="not_found")
        with change.session.begin():
            budgets.delete_budget(change.session, int(budget_id), actor=change.operator.actor)
        return int(budget_id)

    result = await run_in_threadpool(attempt, remove)
    if isinstance(result, ApiError):
        raise result
    _stale(change)
    return redirect(change.request, "/ui/budgets", flash=f"Budget {result} deleted.")
