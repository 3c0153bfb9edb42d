"""Request and response models of ``/prices`` and ``/budgets``: money as exact
decimal text in every answer (``"0.150000"``), a decimal string or a JSON number in a request
(a number is read as written: ``0.1`` is one tenth, never a binary float)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictFloat, StrictInt, StrictStr

from gateway.app.admin.schemas import Input, ModelName, Ref
from gateway.db.models import Budget, ModelPrice
from gateway.db.money import plain
from gateway.db.security import display_prefix
from gateway.limits.budget import budget_state

MoneyIn = Annotated[
    StrictStr | StrictInt | StrictFloat,
    Field(description="a decimal number (a string keeps every digit): at most 6 decimals"),
]


class PriceCreate(Input):
    model: ModelName
    prompt_per_mtok: MoneyIn
    completion_per_mtok: MoneyIn


class PriceUpdate(Input):
    prompt_per_mtok: MoneyIn | None = None
    completion_per_mtok: MoneyIn | None = None


class PriceOut(BaseModel):
    """What a million tokens of ``model`` cost (decimal text)."""

    object: Literal["model_price"] = "model_price"
    id: int
    model: str
    prompt_per_mtok: str
    completion_per_mtok: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: ModelPrice) -> PriceOut:
        return cls(
            id=row.id,
            model=row.model,
            prompt_per_mtok=plain(row.prompt_per_mtok) or "0",
            completion_per_mtok=plain(row.completion_per_mtok) or "0",
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


Fraction = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
WebhookUrl = Annotated[StrictStr, Field(max_length=512)]


class BudgetCreate(Input):
    tenant: Ref | None = None
    """The tenant (id or name); with ``key``, the key's tenant (may be left out)."""
    key: StrictStr | None = None
    """A key prefix: the budget is that key's, else the tenant's."""
    period: Literal["day", "month"]
    amount: MoneyIn
    soft_fraction: Fraction | None = None
    webhook_url: WebhookUrl | None = None


class BudgetUpdate(Input):
    amount: MoneyIn | None = None
    soft_fraction: Fraction | None = None
    webhook_url: WebhookUrl | None = None


class BudgetOut(BaseModel):
    """A budget, and what was spent in its current period (``spent``, decimal text)."""

    object: Literal["budget"] = "budget"
    id: int
    tenant: str
    tenant_id: int
    key: str | None
    period: Literal["day", "month"]
    amount: str
    soft_fraction: float | None
    webhook_url: str | None
    period_start: datetime
    resets_at: datetime
    spent: str
    state: Literal["ok", "soft", "exhausted"]

    @classmethod
    def of(cls, row: Budget, *, start: datetime, end: datetime, spent: Decimal) -> BudgetOut:
        return cls(
            id=row.id,
            tenant=row.tenant.name,
            tenant_id=row.tenant_id,
            key=display_prefix(row.api_key.prefix) if row.api_key is not None else None,
            period=row.period,  # type: ignore[arg-type]
            amount=plain(row.amount) or "0",
            soft_fraction=row.soft_fraction,
            webhook_url=row.webhook_url,
            period_start=start,
            resets_at=end,
            spent=plain(spent) or "0",
            state=budget_state(spent, row.amount, row.soft_fraction),
        )
