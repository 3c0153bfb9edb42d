"""Budgets: a tenant's, or one of its keys', spend limit per UTC day or month — each change
audited. The gateway enforces them at admission (:mod:`gateway.limits.budget`); what was spent
is read from the usage records' costs (:func:`spent_in`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session, selectinload

from gateway.db.crud._common import (
    add_audited,
    check_choice,
    check_fields,
    delete_audited,
    lock,
    record_change,
    snapshot,
)
from gateway.db.crud.backends import check_url
from gateway.db.crud.keys import get_key
from gateway.db.crud.pages import count_rows, page
from gateway.db.crud.tenants import get_tenant
from gateway.db.errors import AlreadyExists, InvalidInput, NotFound
from gateway.db.models import BUDGET_PERIODS, ApiKey, Budget, UsageRecord
from gateway.db.money import MONEY_PLACES, check_amount, plain

ENTITY = "budget"
UPDATABLE = ("amount", "soft_fraction", "webhook_url")


def audit_view(row: Budget) -> dict[str, Any]:
    view = snapshot(row)
    if isinstance(view.get("amount"), Decimal):
        view["amount"] = plain(view["amount"])
    return view


def check_fraction(value: Any) -> float | None:
    """A soft threshold: a fraction of the budget in (0, 1], or None (no warning)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise InvalidInput(
            f"soft_fraction must be a number in (0, 1], or null, got {value!r}",
            param="soft_fraction",
        )
    return float(value)


def check_webhook(value: Any) -> str | None:
    if value is None or value == "":
        return None
    try:
        return check_url(value)
    except InvalidInput as exc:
        raise InvalidInput(
            exc.message.replace("base_url", "webhook_url"), param="webhook_url"
        ) from None


def target_of(tenant_id: int, key_id: int | None) -> str:
    return f"key:{key_id}" if key_id is not None else f"tenant:{tenant_id}"


def get_budget(session: Session, budget_id: int) -> Budget:
    row = session.get(Budget, budget_id) if isinstance(budget_id, int) else None
    if row is None:
        raise NotFound(f"budget {budget_id!r} does not exist", param="budget")
    return row


def _query(tenant_id: int | None) -> Select[Any]:
    query = select(Budget)
    if tenant_id is not None:
        query = query.where(Budget.tenant_id == tenant_id)
    return query


def list_budgets(
    session: Session, *, tenant: int | None = None, limit: int | None = None, offset: int = 0
) -> list[Budget]:
    """Budgets by id (a tenant's, or every one), their tenant and key loaded."""
    query = _query(tenant).options(selectinload(Budget.tenant), selectinload(Budget.api_key))
    return list(session.scalars(page(query.order_by(Budget.id), limit, offset)))


def count_budgets(session: Session, *, tenant: int | None = None) -> int:
    return count_rows(session, _query(tenant))


def create_budget(
    session: Session,
    *,
    actor: str,
    tenant: int | str | None = None,
    key: int | str | None = None,
    period: str,
    amount: Any,
    soft_fraction: Any = None,
    webhook_url: Any = None,
) -> Budget:
    """A budget of ``key`` (an id or a prefix; ``tenant``, if given, must be its tenant) or
    of ``tenant``; :class:`AlreadyExists` if the target has one for the period."""
    api_key: ApiKey | None = None
    if key is not None:
        api_key = get_key(session, key)
        tenant_id = api_key.tenant_id
        if tenant is not None and get_tenant(session, tenant).id != tenant_id:
            raise InvalidInput("the key is not the tenant's", param="key")
    elif tenant is not None:
        tenant_id = get_tenant(session, tenant).id
    else:
        raise InvalidInput("a budget needs a tenant or a key", param="tenant")
    key_id = api_key.id if api_key is not None else None
    row = Budget(
        target=target_of(tenant_id, key_id),
        tenant_id=tenant_id,
        api_key_id=key_id,
        period=check_choice(period, "period", BUDGET_PERIODS),
        amount=check_amount(amount, "amount"),
        soft_fraction=check_fraction(soft_fraction),
        webhook_url=check_webhook(webhook_url),
    )
    called = "daily" if row.period == "day" else "monthly"
    taken = f"the {'key' if key_id else 'tenant'} has a {called} budget already"
    exists = select(Budget.id).where(Budget.target == row.target, Budget.period == row.period)
    if session.scalar(exists) is not None:
        raise AlreadyExists(taken, param="period")
    return add_audited(session, row, actor=actor, entity=ENTITY, conflict=taken, view=audit_view)


def update_budget(
    session: Session, budget_id: int, changes: Mapping[str, Any], *, actor: str
) -> Budget:
    """Change the amount, the soft threshold or the webhook; a no-op writes no audit row."""
    check_fields(changes, UPDATABLE, ENTITY)
    row = lock(session, get_budget(session, budget_id), ENTITY)
    before = audit_view(row)
    checks: dict[str, Callable[[Any], object]] = {
        "amount": lambda v: check_amount(v, "amount"),
        "soft_fraction": check_fraction,
        "webhook_url": check_webhook,
    }
    for name, value in changes.items():
        new = checks[name](value)
        if new != getattr(row, name):
            setattr(row, name, new)
    record_change(session, before, audit_view(row), actor=actor, action="update", entity=ENTITY)
    return row


def delete_budget(session: Session, budget_id: int, *, actor: str) -> None:
    row = lock(session, get_budget(session, budget_id), ENTITY)
    delete_audited(session, row, actor=actor, entity=ENTITY, view=audit_view)


def spent_in(
    session: Session, tenant_id: int, key_id: int | None, start: datetime, end: datetime
) -> Decimal:
    """What the usage records charge the tenant (or the key) in ``[start, end)``."""
    query = select(func.coalesce(func.sum(UsageRecord.cost), 0)).where(
        UsageRecord.created_at >= start, UsageRecord.created_at < end
    )
    if key_id is not None:
        query = query.where(UsageRecord.api_key_id == key_id)
    else:
        query = query.where(UsageRecord.tenant_id == tenant_id)
    return Decimal(str(session.scalar(query) or 0)).quantize(MONEY_PLACES)
