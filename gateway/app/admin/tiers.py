"""``/tiers``: service classes (weight, SLOs, limits) that tenants are on."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.app.admin.deps import ActorDep, AdminRoute, PageDep, SessionDep, StateDep
from gateway.app.admin.helpers import delete_row, invalidate, patch_row, resolve
from gateway.app.admin.schemas import (
    DeletedOut,
    ListOut,
    TierCreate,
    TierOut,
    TierUpdate,
)
from gateway.db import crud

router = APIRouter(route_class=AdminRoute, tags=["tiers"])


@router.get("/tiers")
def list_tiers(session: SessionDep, page: PageDep) -> ListOut[TierOut]:
    """Tiers, most important first; the total is in ``x-total-count``."""
    rows = crud.list_tiers(session, limit=page.limit, offset=page.offset)
    return page.of(crud.count_tiers(session), map(TierOut.model_validate, rows))


@router.post("/tiers", status_code=201)
def create_tier(body: TierCreate, session: SessionDep, actor: ActorDep) -> TierOut:
    with session.begin():
        return TierOut.model_validate(crud.create_tier(session, actor=actor, **body.model_dump()))


@router.get("/tiers/{ref}")
def get_tier(ref: str, session: SessionDep) -> TierOut:
    return TierOut.model_validate(resolve(crud.get_tier, session, ref))


@router.patch("/tiers/{ref}")
def update_tier(
    ref: str, body: TierUpdate, session: SessionDep, actor: ActorDep, state: StateDep
) -> TierOut:
    with session.begin():
        tier, changed = patch_row(session, actor, ref, crud.get_tier, crud.update_tier, body)
        out = TierOut.model_validate(tier)
    if changed:
        invalidate(state, None)  # every tenant on the tier has a new effective policy
    return out


@router.delete("/tiers/{ref}")
def delete_tier(ref: str, session: SessionDep, actor: ActorDep) -> DeletedOut:
    with session.begin():
        tier = resolve(crud.get_tier, session, ref)
        return delete_row(session, actor, crud.delete_tier, "tier", tier.id, tier.name)
