"""``/ui/backends``: the fleet live, and the backends table's rows — add, edit, enable, delete.

The table is :func:`gateway.app.fleet.fleet_view`, the same view ``GET /admin/v1/backends``
answers: every backend this gateway routes to (the emulated engines ``tiergate serve`` starts
included) with health, breaker state and live load, and every database row. htmx re-fetches
it every few seconds (``/ui/backends/-/live``).

Only database rows can be changed here. A form is validated by the admin API's own models
(``BackendCreate``/``BackendUpdate``), changed through the same crud calls, and followed by the
same side effect as ``/admin/v1/backends``: the pool is reloaded once a change is committed.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from gateway.app.admin.schemas import BackendCreate, BackendUpdate
from gateway.app.fleet import fleet_view
from gateway.app.state import GatewayState
from gateway.app.ui.deps import ChangeDep, OperatorDep, Page, PageDep, SessionDep, StateDep, UiRoute
from gateway.app.ui.forms import Kind, convert
from gateway.app.ui.render import pager, redirect, render
from gateway.app.ui.resource import Resource, submit
from gateway.db import crud
from gateway.db.models import BACKEND_KINDS
from gateway.db.models import Backend as BackendRow
from gateway.errors import ApiError

router = APIRouter(route_class=UiRoute)

POLL_S = 5
FIELDS: dict[str, Kind] = {
    "name": "text",
    "base_url": "text",
    "model": "text",
    "profile": "ref",
    "kind": "ref",
    "enabled": "bool",
}
REQUIRED = ("name", "base_url", "model", "profile", "kind")
NEW_DEFAULTS = {"kind": "vllm", "enabled": True}
ENABLED: dict[str, Kind] = {"enabled": "bool"}


async def _fleet_table(request: Request, state: GatewayState, page: Page) -> dict[str, Any]:
    """The table's context, on the page and in its live partial: this page of the fleet, the
    pager, and whether the list is fixed (no database backends to edit)."""
    shown = await fleet_view(state.pool, state.session_factory)
    rows = shown[page.offset : page.offset + page.limit]
    where = pager(request, total=len(shown), limit=page.limit, offset=page.offset, shown=len(rows))
    return {"backends": rows, "pager": where, "fixed": not state.pool.reads_database}


def _live_query(request: Request) -> str:
    """The poll's query: this page's place in the list, nothing else."""
    keep = {k: v for k, v in request.query_params.items() if k in ("limit", "offset")}
    return "&".join(f"{k}={v}" for k, v in keep.items())


@router.get("/backends")
async def list_backends(
    request: Request, operator: OperatorDep, state: StateDep, page: PageDep
) -> Response:
    return render(
        request,
        "backends.html",
        active="backends",
        title="Backends",
        poll_s=POLL_S,
        live_query=_live_query(request),
        **await _fleet_table(request, state, page),
    )


@router.get("/backends/-/live")
async def backends_live(
    request: Request, operator: OperatorDep, state: StateDep, page: PageDep
) -> Response:
    """The table alone, for htmx's poll."""
    table = await _fleet_table(request, state, page)
    return render(request, "partials/backends_live.html", **table)


# ---- forms: every committed change reloads the pool ---------------------------------------


def _choices(session: Session) -> dict[str, Any]:
    profiles = [(e.name, f"{e.name} ({e.source})") for e in crud.profile_catalog(session)]
    return {"profiles": profiles, "kinds": [(k, k) for k in BACKEND_KINDS]}


BACKENDS = Resource[BackendRow](
    entity="backend",
    fields=FIELDS,
    required=REQUIRED,
    get=crud.get_backend,
    create=crud.create_backend,
    update=crud.update_backend,
    delete=crud.delete_backend,
    choices=_choices,
)


@router.get("/backends/-/new")
def new_backend(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    return BACKENDS.form(request, session, None, dict(NEW_DEFAULTS))


@router.post("/backends/-/new")
async def create_backend(change: ChangeDep) -> Response:
    return await BACKENDS.post_new(
        change, BackendCreate, verb="added", after=change.state.pool.reload
    )


@router.get("/backends/{name}")
def edit_backend(
    request: Request, name: str, operator: OperatorDep, session: SessionDep
) -> Response:
    return BACKENDS.edit_form(request, session, name)


@router.post("/backends/{name}")
async def update_backend(name: str, change: ChangeDep) -> Response:
    return await BACKENDS.post_edit(change, name, BackendUpdate, after=change.state.pool.reload)


@router.post("/backends/{name}/enabled")
async def set_enabled(name: str, change: ChangeDep) -> Response:
    """The table's Enable / Disable button: ``enabled=true|false``, as a PATCH of that field."""
    patch = partial(BACKENDS.patch, change, name)
    values, result = await submit(change, ENABLED, BackendUpdate, patch, blank_is_null=False)
    if isinstance(result, ApiError):
        raise result  # a backend gone meanwhile: 404 page, in the API's words
    new_name, changed = result
    if changed:
        await change.state.pool.reload()
    verb = "enabled" if convert(values, ENABLED, blank_is_null=False)["enabled"] else "disabled"
    flash = f"Backend {new_name} {verb}." if changed else f"Backend {new_name} was {verb} already."
    return redirect(change.request, "/ui/backends", flash=flash)


@router.post("/backends/{name}/delete")
async def delete_backend(name: str, change: ChangeDep) -> Response:
    return await BACKENDS.post_delete(change, name, after=change.state.pool.reload)
