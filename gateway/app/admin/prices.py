"""``/prices``: what a million prompt and completion tokens of each model cost.

A price is addressed by its id or its model's name (a name with a ``/`` by its id). A usage
record is charged at its model's price when it is written; a change applies to
records written from then on (this gateway at once, the others within seconds) and never
rewrites those already written. Every change is audited (``price``).
"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.app.admin.deps import ActorDep, AdminRoute, PageDep, SessionDep, StateDep
from gateway.app.admin.helpers import changes_of, delete_row, reread, resolve
from gateway.app.admin.schemas import DeletedOut, ListOut
from gateway.app.admin.spend_schemas import PriceCreate, PriceOut, PriceUpdate
from gateway.db.crud import prices

router = APIRouter(route_class=AdminRoute, tags=["prices"])


@router.get("/prices")
def list_prices(session: SessionDep, page: PageDep) -> ListOut[PriceOut]:
    """Prices by model; the total is in ``x-total-count``."""
    rows = prices.list_prices(session, limit=page.limit, offset=page.offset)
    return page.of(prices.count_prices(session), map(PriceOut.of, rows))


@router.post("/prices", status_code=201)
def create_price(
    body: PriceCreate, session: SessionDep, actor: ActorDep, state: StateDep
) -> PriceOut:
    """Price a model (409 if it has a price: change that one)."""
    with session.begin():
        out = PriceOut.of(prices.create_price(session, actor=actor, **body.model_dump()))
    reread(state, "prices")  # the next usage write re-reads the prices
    return out


@router.get("/prices/{ref}")
def get_price(ref: str, session: SessionDep) -> PriceOut:
    """A price by id or model name (a model whose name has a ``/`` by its id)."""
    return PriceOut.of(resolve(prices.get_price, session, ref))


@router.patch("/prices/{ref}")
def update_price(
    ref: str, body: PriceUpdate, session: SessionDep, actor: ActorDep, state: StateDep
) -> PriceOut:
    changes = {k: v for k, v in changes_of(body).items() if v is not None}
    with session.begin():
        row = resolve(prices.get_price, session, ref)
        out = PriceOut.of(prices.update_price(session, row.id, changes, actor=actor))
    reread(state, "prices")
    return out


@router.delete("/prices/{ref}")
def delete_price(ref: str, session: SessionDep, actor: ActorDep, state: StateDep) -> DeletedOut:
    """Remove a price: later records of the model carry no cost."""
    with session.begin():
        row = resolve(prices.get_price, session, ref)
        out = delete_row(session, actor, prices.delete_price, "price", row.id, row.model)
    reread(state, "prices")
    return out
