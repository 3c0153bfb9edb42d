"""``/budgets``: a tenant's, or one of its keys', spend budget per UTC day or month.

At the amount the gateway refuses the target's requests (429 ``budget_exceeded``) until the
period ends; past ``soft_fraction`` it warns once per period (``tiergate_budget_soft_crossings``
and the budget's ``webhook_url``). Each answer says what the usage records show spent in the
current period and the budget's state (``ok``, ``soft``, ``exhausted``). Staff set budgets; a
tenant admin reads its own tenant's. A change applies on this gateway at once, on the others
within seconds. Every change is audited (``budget``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlalchemy.orm import Session

from gateway.app.admin.deps import (
    ActorDep,
    AdminRoute,
    PageDep,
    PrincipalDep,
    SessionDep,
    StateDep,
)
from gateway.app.admin.helpers import changes_of, reread, resolve, scoped, tenant_resolver
from gateway.app.admin.schemas import INT32_MAX, DeletedOut, ListOut
from gateway.app.admin.spend_schemas import BudgetCreate, BudgetOut, BudgetUpdate
from gateway.db import crud
from gateway.db.crud import budgets
from gateway.db.models import Budget, utcnow
from gateway.limits.budget import period_bounds

router = APIRouter(route_class=AdminRoute, tags=["budgets"])

BudgetId = Annotated[int, Path(ge=1, le=INT32_MAX)]


def present(session: Session, row: Budget) -> BudgetOut:
    """The budget with what was spent in its current period."""
    start, end = period_bounds(row.period, utcnow())
    spent = budgets.spent_in(session, row.tenant_id, row.api_key_id, start, end)
    return BudgetOut.of(row, start=start, end=end, spent=spent)


def insert_budget(session: Session, actor: str, body: BudgetCreate) -> Budget:
    """The budget ``body`` asks for, written and audited (the caller owns the transaction):
    the admin API's POST and the dashboard's form."""
    tenant = resolve(crud.get_tenant, session, body.tenant).id if body.tenant else None
    return budgets.create_budget(
        session,
        actor=actor,
        tenant=tenant,
        key=body.key,
        period=body.period,
        amount=body.amount,
        soft_fraction=body.soft_fraction,
        webhook_url=body.webhook_url,
    )


@router.get("/budgets")
def list_budgets(
    session: SessionDep,
    who: PrincipalDep,
    page: PageDep,
    tenant: Annotated[str | None, Query(description="tenant name or id")] = None,
) -> ListOut[BudgetOut]:
    """Budgets by id (a tenant admin's: its tenant's), each with its current spend."""
    tenant_id = who.tenant_filter(tenant, tenant_resolver(session))
    rows = budgets.list_budgets(session, tenant=tenant_id, limit=page.limit, offset=page.offset)
    total = budgets.count_budgets(session, tenant=tenant_id)
    return page.of(total, (present(session, r) for r in rows))


@router.post("/budgets", status_code=201)
def create_budget(
    body: BudgetCreate, session: SessionDep, actor: ActorDep, state: StateDep
) -> BudgetOut:
    """A budget of a tenant, or of one of its keys (``key``: its prefix); one per target and
    period (409)."""
    with session.begin():
        out = present(session, insert_budget(session, actor, body))
    reread(state, "budgets")
    return out


@router.get("/budgets/{budget_id}")
def get_budget(budget_id: BudgetId, session: SessionDep, who: PrincipalDep) -> BudgetOut:
    return present(session, scoped(who, "budget", lambda: budgets.get_budget(session, budget_id)))


@router.patch("/budgets/{budget_id}")
def update_budget(
    budget_id: BudgetId, body: BudgetUpdate, session: SessionDep, actor: ActorDep, state: StateDep
) -> BudgetOut:
    """Change the amount, the soft threshold or the webhook (``null``: none)."""
    changes = changes_of(body)
    if changes.get("amount", 0) is None:
        changes.pop("amount")  # an amount cannot be null: leave it
    with session.begin():
        out = present(session, budgets.update_budget(session, budget_id, changes, actor=actor))
    reread(state, "budgets")
    return out


@router.delete("/budgets/{budget_id}")
def delete_budget(
    budget_id: BudgetId, session: SessionDep, actor: ActorDep, state: StateDep
) -> DeletedOut:
    with session.begin():
        row = budgets.get_budget(session, budget_id)
        out = DeletedOut(object="budget", id=row.id, name=f"{row.target}/{row.period}")
        budgets.delete_budget(session, budget_id, actor=actor)
    reread(state, "budgets")
    return out
