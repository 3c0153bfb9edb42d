"""Model prices: what a million prompt and completion tokens of a model cost — each change
audited. A usage record is charged at the price in force when it is written
(:class:`gateway.db.prices.PriceBook`), so changing a price never rewrites history."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db.crud._common import (
    add_audited,
    check_fields,
    delete_audited,
    lock,
    record_change,
    snapshot,
)
from gateway.db.crud.backends import check_model
from gateway.db.crud.pages import count_rows, page
from gateway.db.errors import AlreadyExists, NotFound
from gateway.db.models import ModelPrice
from gateway.db.money import check_price, plain

ENTITY = "price"
UPDATABLE = ("prompt_per_mtok", "completion_per_mtok")


def audit_view(row: ModelPrice) -> dict[str, Any]:
    """The row as the audit log keeps it: prices as exact decimal text."""
    view = snapshot(row)
    for name in UPDATABLE:
        value = view[name]
        view[name] = plain(value) if isinstance(value, Decimal) else value
    return view


def find_price(session: Session, model: str) -> ModelPrice | None:
    return session.scalar(select(ModelPrice).where(ModelPrice.model == model))


def get_price(session: Session, ref: int | str) -> ModelPrice:
    """A price by id (int) or by its model's exact name (str); :class:`NotFound` if none."""
    row = session.get(ModelPrice, ref) if isinstance(ref, int) else find_price(session, ref)
    if row is None:
        raise NotFound(f"model {ref!r} has no price", param="model")
    return row


def list_prices(session: Session, *, limit: int | None = None, offset: int = 0) -> list[ModelPrice]:
    """Prices by model name (unique: stable pages)."""
    return list(session.scalars(page(select(ModelPrice).order_by(ModelPrice.model), limit, offset)))


def count_prices(session: Session) -> int:
    return count_rows(session, select(ModelPrice))


def create_price(
    session: Session,
    *,
    actor: str,
    model: str,
    prompt_per_mtok: Any,
    completion_per_mtok: Any,
) -> ModelPrice:
    """Price ``model``; :class:`AlreadyExists` if it has a price (change it instead)."""
    name = check_model(model)
    row = ModelPrice(
        model=name,
        prompt_per_mtok=check_price(prompt_per_mtok, "prompt_per_mtok"),
        completion_per_mtok=check_price(completion_per_mtok, "completion_per_mtok"),
    )
    if find_price(session, name) is not None:
        raise AlreadyExists(f"model {name!r} has a price already", param="model")
    return add_audited(
        session,
        row,
        actor=actor,
        entity=ENTITY,
        conflict=f"model {name!r} has a price already",
        view=audit_view,
    )


def update_price(
    session: Session, model: int | str, changes: Mapping[str, Any], *, actor: str
) -> ModelPrice:
    """Change a model's prices (partial); a no-op writes no audit row."""
    check_fields(changes, UPDATABLE, ENTITY)
    row = lock(session, get_price(session, model), ENTITY)
    before = audit_view(row)
    for name in UPDATABLE:
        if name in changes:
            value = check_price(changes[name], name)
            if value != getattr(row, name):
                setattr(row, name, value)
    record_change(session, before, audit_view(row), actor=actor, action="update", entity=ENTITY)
    return row


def delete_price(session: Session, model: int | str, *, actor: str) -> None:
    """Remove a model's price: its later records carry no cost (those written keep theirs)."""
    row = lock(session, get_price(session, model), ENTITY)
    delete_audited(session, row, actor=actor, entity=ENTITY, view=audit_view)
