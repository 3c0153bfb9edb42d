"""``/ui/prices`` and ``/ui/budgets``: what each model's tokens cost, and the tenants' and
keys' spend budgets with what each period has spent so far.

The same crud calls, checks and side effects as ``/admin/v1/prices`` and ``/admin/v1/budgets``
(a form is validated by the API's own model; the gateway's price book and budget guard re-read
after a change). Staff change them; a tenant admin sees its own tenant's budgets only. A
refusal shows the page again with the API's words above the form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.budgets import insert_budget, present
from gateway.app.admin.helpers import reread, resolve
from gateway.app.admin.spend_schemas import BudgetCreate, PriceCreate
from gateway.app.ui.deps import Change, ChangeDep, OperatorDep, SessionDep, UiRoute
from gateway.app.ui.forms import FORM_ERROR, attempt, read_form, validate
from gateway.app.ui.render import redirect, render
from gateway.db.crud import budgets, prices
from gateway.errors import ApiError

router = APIRouter(route_class=UiRoute)


PRICE_FIELDS = ("model", "prompt_per_mtok", "completion_per_mtok")
BUDGET_FIELDS = ("tenant", "key", "period", "amount", "soft_fraction", "webhook_url")


@dataclass(frozen=True)
class _Table:
    """One of the two pages, ``/ui/<name>``: what its template lists, the form's text as the
    API's JSON body, the API's model and the writer of a new row (one transaction; it returns
    what the flash names). The page and its create and delete flows are the methods."""

    name: str
    rows: Callable[[Any, Session], dict[str, Any]]
    """The template's context besides the form: the rows the operator may see, choices."""
    body: Callable[[dict[str, str]], Mapping[str, Any]]
    model: type[BaseModel]
    write: Callable[[Change, Any], object]
    blank: Mapping[str, str] = field(default_factory=dict)
    """What the empty form shows."""

    def page(
        self,
        request: Request,
        operator: Any,
        session: Session,
        *,
        values: Mapping[str, str] | None = None,
        error: str | None = None,
        status_code: int = 200,
    ) -> Response:
        """The list and the form: empty, or as typed with the API's refusal above it."""
        return render(
            request,
            f"{self.name}.html",
            status_code=status_code,
            active=self.name,
            title=self.name.capitalize(),
            values=values or dict(self.blank),
            errors={FORM_ERROR: error} if error else {},
            **self.rows(operator, session),
        )

    async def create(self, change: Change, flash: str) -> Response:
        """Validate the form with the API's model and write it, then back to the list; or the
        page again with what was typed and the refusal above the form (the API's status)."""
        values = await read_form(change.request)
        body = self.body(values)
        result = await run_in_threadpool(
            attempt, lambda: self.write(change, validate(self.model, body))
        )
        if not isinstance(result, ApiError):
            return self._done(change, flash.format(result))
        error = result
        return await run_in_threadpool(
            lambda: self.page(
                change.request,
                change.operator,
                change.session,
                values=values,
                error=error.message,
                status_code=error.status,
            )
        )

    async def delete(self, change: Change, remove: Callable[[], object], flash: str) -> Response:
        """Run a deletion, then back to the list; a refusal is the API's error page."""
        result = await run_in_threadpool(attempt, remove)
        if isinstance(result, ApiError):
            raise result
        return self._done(change, flash.format(result))

    def _done(self, change: Change, flash: str) -> Response:
        """The price book and the budget guard re-read after the committed change."""
        reread(change.state, "prices", "budgets")
        return redirect(change.request, f"/ui/{self.name}", flash=flash)


def _prices(operator: Any, session: Session) -> dict[str, Any]:
    return {"prices": prices.list_prices(session)}


@router.get("/prices")
def list_prices(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    return _PRICES.page(request, operator, session)


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


def _price_body(values: dict[str, str]) -> dict[str, str]:
    return {k: values.get(k, "").strip() for k in PRICE_FIELDS}


_PRICES = _Table("prices", _prices, _price_body, PriceCreate, _set_price)


@router.post("/prices/-/new")
async def set_price(change: ChangeDep) -> Response:
    return await _PRICES.create(change, "Price of {} set.")


@router.post("/prices/{ref}/delete")
async def delete_price(ref: str, change: ChangeDep) -> Response:
    def remove() -> str:
        with change.session.begin():
            row = resolve(prices.get_price, change.session, ref)
            model = row.model
            prices.delete_price(change.session, row.id, actor=change.operator.actor)
            return model

    return await _PRICES.delete(change, remove, "Price of {} deleted.")


def _budgets(operator: Any, session: Session) -> dict[str, Any]:
    """The budgets the operator may see (a tenant admin: its tenant's), with their spend."""
    who = operator.principal
    tenant_id = who.tenant_id if who.tenant_bound else None
    rows = [present(session, r) for r in budgets.list_budgets(session, tenant=tenant_id)]
    return {"budgets": rows, "periods": [("day", "Day (UTC)"), ("month", "Month (UTC)")]}


@router.get("/budgets")
def list_budgets(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    return _BUDGETS.page(request, operator, session)


def _create_budget(change: Change, body: BudgetCreate) -> int:
    with change.session.begin():
        return insert_budget(change.session, change.operator.actor, body).id


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


_BUDGETS = _Table(
    "budgets", _budgets, _budget_body, BudgetCreate, _create_budget, blank={"period": "month"}
)


@router.post("/budgets/-/new")
async def create_budget(change: ChangeDep) -> Response:
    return await _BUDGETS.create(change, "Budget {} created.")


@router.post("/budgets/{budget_id}/delete")
async def delete_budget(budget_id: str, change: ChangeDep) -> Response:
    def remove() -> int:
        if not budget_id.isascii() or not budget_id.isdigit() or int(budget_id) > 2**31 - 1:
            raise ApiError(404, f"budget {budget_id!r} does not exist", code="not_found")
        with change.session.begin():
            budgets.delete_budget(change.session, int(budget_id), actor=change.operator.actor)
        return int(budget_id)

    return await _BUDGETS.delete(change, remove, "Budget {} deleted.")
