"""``/ui/tiers``: the service classes — list, create, edit, delete.

Every field the admin API takes (``TierCreate``/``TierUpdate``): weight, SLOs and their
minimums, limits, best effort, shed slack, default request kind. A form is validated by the
API's own model, then changed through the same crud calls and side effects as
``/admin/v1/tiers`` (an edit drops every cached identity: each tenant on the tier has a new
effective policy).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.app.admin.helpers import invalidate
from gateway.app.admin.schemas import TierCreate, TierUpdate
from gateway.app.ui.deps import Change, ChangeDep, OperatorDep, PageDep, SessionDep, UiRoute
from gateway.app.ui.forms import POLICY_FIELDS, Kind
from gateway.app.ui.render import pager, render
from gateway.app.ui.resource import Resource, Saved
from gateway.db import crud
from gateway.db.crud.tiers import TIER_KINDS
from gateway.db.models import Tier

router = APIRouter(route_class=UiRoute)

FIELDS: dict[str, Kind] = {
    "name": "text",
    "description": "text",
    "weight": "number",
    **POLICY_FIELDS,
    **dict.fromkeys(("min_ttft_ms", "min_tpot_ms", "min_deadline_ms", "shed_slack"), "number"),
    "best_effort_allowed": "bool",
    "default_kind": "ref",
}
REQUIRED = ("name", "weight", "ttft_ms", "tpot_ms", "shed_slack")
NEW_DEFAULTS = {"best_effort_allowed": False, "shed_slack": "0", "default_kind": "latency"}
KIND_OPTIONS = [(kind, kind) for kind in TIER_KINDS]
"""The default-kind select's options (the API's ``TierKind``)."""


TIERS = Resource[Tier](
    entity="tier",
    fields=FIELDS,
    required=REQUIRED,
    get=crud.get_tier,
    create=crud.create_tier,
    update=crud.update_tier,
    delete=crud.delete_tier,
    choices=lambda _: {"kinds": KIND_OPTIONS},
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


@router.get("/tiers/-/new")
def new_tier(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    return TIERS.form(request, session, None, dict(NEW_DEFAULTS))


@router.post("/tiers/-/new")
async def create_tier(change: ChangeDep) -> Response:
    return await TIERS.post_new(change, TierCreate)


@router.get("/tiers/{name}")
def edit_tier(request: Request, name: str, operator: OperatorDep, session: SessionDep) -> Response:
    return TIERS.edit_form(request, session, name)


def _save(change: Change, name: str, body: TierUpdate) -> Saved:
    saved = TIERS.patch(change, name, body)
    if saved.changed:
        invalidate(change.state, None)  # every tenant on the tier has a new effective policy
    return saved


@router.post("/tiers/{name}")
async def update_tier(name: str, change: ChangeDep) -> Response:
    return await TIERS.post_edit(change, name, TierUpdate, lambda body: _save(change, name, body))


@router.post("/tiers/{name}/delete")
async def delete_tier(name: str, change: ChangeDep) -> Response:
    """A tier still in use is refused on its form, the reason above it."""
    return await TIERS.post_delete(change, name, refusal_on_form=True)
