"""``/ui/backends``: the fleet live, and the backends table's rows — add, edit, enable, delete.

The table is :func:`gateway.app.fleet.fleet_view`, the same view ``GET /admin/v1/backends``
answers: every backend this gateway routes to (the emulated engines ``tiergate serve`` starts
included) with health, breaker state and live load, and every database row. htmx re-fetches
it every few seconds (``/ui/backends/live``).

Only database rows can be changed here. A form is validated by the admin API's own models
(``BackendCreate``/``BackendUpdate``), changed through the same crud calls, and followed by the
same side effect as ``/admin/v1/backends``: the pool is reloaded once a change is committed.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.helpers import delete_row, patch_row, resolve
from gateway.app.admin.schemas import BackendCreate, BackendUpdate
from gateway.app.fleet import LiveBackend, fleet_view
from gateway.app.state import GatewayState
from gateway.app.ui.deps import (
    CsrfDep,
    Operator,
    OperatorDep,
    Page,
    PageDep,
    SessionDep,
    StateDep,
    UiRoute,
)
from gateway.app.ui.forms import Kind, attempt, convert, field_errors, read_form, validate
from gateway.app.ui.render import Pager, pager, redirect, render
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


async def _page_of_fleet(
    request: Request, state: GatewayState, page: Page
) -> tuple[list[LiveBackend], Pager]:
    shown = await fleet_view(state.pool, state.session_factory)
    rows = shown[page.offset : page.offset + page.limit]
    where = pager(request, total=len(shown), limit=page.limit, offset=page.offset, shown=len(rows))
    return rows, where


def _live_query(request: Request) -> str:
    """The poll's query: this page's place in the list, nothing else."""
    keep = {k: v for k, v in request.query_params.items() if k in ("limit", "offset")}
    return "&".join(f"{k}={v}" for k, v in keep.items())


@router.get("/backends")
async def list_backends(
    request: Request, operator: OperatorDep, state: StateDep, page: PageDep
) -> Response:
    backends, where = await _page_of_fleet(request, state, page)
    return render(
        request,
        "backends.html",
        active="backends",
        title="Backends",
        backends=backends,
        pager=where,
        fixed=not state.pool.reads_database,
        poll_s=POLL_S,
        live_query=_live_query(request),
    )


@router.get("/backends/live")
async def backends_live(
    request: Request, operator: OperatorDep, state: StateDep, page: PageDep
) -> Response:
    """The table alone, for htmx's poll."""
    backends, where = await _page_of_fleet(request, state, page)
    return render(
        request,
        "partials/backends_live.html",
        backends=backends,
        pager=where,
        fixed=not state.pool.reads_database,
    )


# ---- forms --------------------------------------------------------------------------------


def _choices(session: Session) -> dict[str, Any]:
    profiles = [(e.name, f"{e.name} ({e.source})") for e in crud.profile_catalog(session)]
    return {"profiles": profiles, "kinds": [(k, k) for k in BACKEND_KINDS]}


def _values(row: BackendRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in FIELDS}


def _form(
    request: Request,
    session: Session,
    *,
    backend: BackendRow | None,
    values: dict[str, Any],
    errors: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    return render(
        request,
        "backend_form.html",
        status_code=status_code,
        active="backends",
        title=f"Backend {backend.name}" if backend is not None else "New backend",
        backend=backend,
        values=values,
        errors=errors or {},
        **_choices(session),
    )


async def _form_async(request: Request, session: Session, **kwargs: Any) -> Response:
    return await run_in_threadpool(lambda: _form(request, session, **kwargs))


@router.get("/backends/new")
def new_backend(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    return _form(request, session, backend=None, values=dict(NEW_DEFAULTS))


@router.post("/backends/new")
async def create_backend(
    request: Request, operator: OperatorDep, _: CsrfDep, session: SessionDep, state: StateDep
) -> Response:
    values = await read_form(request)
    body = convert(values, FIELDS, blank_is_null=False, required=REQUIRED)

    def change() -> str:
        checked = validate(BackendCreate, body)
        with session.begin():
            return crud.create_backend(session, actor=operator.actor, **checked.model_dump()).name

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        errors = field_errors(result, FIELDS)
        return await _form_async(
            request, session, backend=None, values=values, errors=errors, status_code=result.status
        )
    await state.pool.reload()
    return redirect(request, "/ui/backends", flash=f"Backend {result} added.")


@router.get("/backends/{name}")
def edit_backend(
    request: Request, name: str, operator: OperatorDep, session: SessionDep
) -> Response:
    backend = resolve(crud.get_backend, session, name)
    return _form(request, session, backend=backend, values=_values(backend))


def _update(
    session: Session, operator: Operator, name: str, body: BackendUpdate
) -> tuple[str, bool]:
    with session.begin():
        row, changed = patch_row(
            session, operator.actor, name, crud.get_backend, crud.update_backend, body
        )
        return row.name, changed


@router.post("/backends/{name}")
async def update_backend(
    request: Request,
    name: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    values = await read_form(request)
    body = convert(values, FIELDS, blank_is_null=True, required=REQUIRED)

    def change() -> tuple[str, bool]:
        return _update(session, operator, name, validate(BackendUpdate, body))

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        if result.status == 404 and result.param == "backend":
            raise result
        backend = await run_in_threadpool(resolve, crud.get_backend, session, name)
        errors = field_errors(result, FIELDS)
        return await _form_async(
            request,
            session,
            backend=backend,
            values=values,
            errors=errors,
            status_code=result.status,
        )
    new_name, changed = result
    if changed:
        await state.pool.reload()
    flash = f"Backend {new_name} saved." if changed else f"Backend {new_name}: nothing changed."
    return redirect(request, "/ui/backends", flash=flash)


@router.post("/backends/{name}/enabled")
async def set_enabled(
    request: Request,
    name: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    """The table's Enable / Disable button: ``enabled=true|false``, as a PATCH of that field."""
    values = await read_form(request)
    body = convert(values, {"enabled": "bool"}, blank_is_null=False)

    def change() -> tuple[str, bool]:
        return _update(session, operator, name, validate(BackendUpdate, body))

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        raise result  # a backend gone meanwhile: 404 page, in the API's words
    new_name, changed = result
    if changed:
        await state.pool.reload()
    verb = "enabled" if body["enabled"] else "disabled"
    flash = f"Backend {new_name} {verb}." if changed else f"Backend {new_name} was {verb} already."
    return redirect(request, "/ui/backends", flash=flash)


@router.post("/backends/{name}/delete")
async def delete_backend(
    request: Request,
    name: str,
    operator: OperatorDep,
    _: CsrfDep,
    session: SessionDep,
    state: StateDep,
) -> Response:
    def change() -> str:
        with session.begin():
            row = resolve(crud.get_backend, session, name)
            return delete_row(
                session, operator.actor, crud.delete_backend, "backend", row.id, row.name
            ).name

    result = await run_in_threadpool(attempt, change)
    if isinstance(result, ApiError):
        raise result
    await state.pool.reload()
    return redirect(request, "/ui/backends", flash=f"Backend {result} deleted.")
