"""``/backends``: the engines the gateway routes to; every committed change reloads the pool.

Mutations are async: the pool reload is a coroutine. Their database work still runs in the
thread pool, like the sync routes', so it never blocks the event loop.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from gateway.app.admin.deps import ActorDep, AdminRoute, PageDep, SessionDep, StateDep
from gateway.app.admin.helpers import delete_row, patch_row, resolve
from gateway.app.admin.schemas import (
    BackendCreate,
    BackendOut,
    BackendUpdate,
    DeletedOut,
    ListOut,
    LiveBackendOut,
)
from gateway.app.fleet import fleet_view
from gateway.db import crud

router = APIRouter(route_class=AdminRoute, tags=["backends"])


@router.get("/backends")
async def list_backends(
    state: StateDep,
    enabled: Annotated[bool | None, Query()] = None,
    model: Annotated[str | None, Query()] = None,
    source: Annotated[
        Literal["database", "embedded", "config"] | None,
        Query(description="only backends from this source (`database`: the table's rows)"),
    ] = None,
    *,
    page: PageDep,
) -> ListOut[LiveBackendOut]:
    """Every backend this gateway routes to (the emulated engines `tiergate serve` starts
    included) and every row of the backends table, by name, with health, breaker state and
    live load (:mod:`gateway.app.fleet`); the total is in ``x-total-count``."""
    shown = [
        b
        for b in await fleet_view(state.pool, state.session_factory)
        if (enabled is None or b.enabled is enabled)
        and (model is None or b.model == model)
        and (source is None or b.source == source)
    ]
    end = None if page.limit is None else page.offset + page.limit
    return page.of(len(shown), map(LiveBackendOut.model_validate, shown[page.offset : end]))


@router.post("/backends", status_code=201)
async def create_backend(
    body: BackendCreate, session: SessionDep, actor: ActorDep, state: StateDep
) -> BackendOut:
    def work() -> BackendOut:
        with session.begin():
            row = crud.create_backend(session, actor=actor, **body.model_dump())
            return BackendOut.model_validate(row)

    out = await run_in_threadpool(work)
    await state.pool.reload()
    return out


@router.get("/backends/{ref}")
def get_backend(ref: str, session: SessionDep) -> BackendOut:
    return BackendOut.model_validate(resolve(crud.get_backend, session, ref))


@router.patch("/backends/{ref}")
async def update_backend(
    ref: str, body: BackendUpdate, session: SessionDep, actor: ActorDep, state: StateDep
) -> BackendOut:
    def work() -> tuple[BackendOut, bool]:
        with session.begin():
            row, changed = patch_row(
                session, actor, ref, crud.get_backend, crud.update_backend, body
            )
            return BackendOut.model_validate(row), changed

    out, changed = await run_in_threadpool(work)
    if changed:
        await state.pool.reload()
    return out


@router.delete("/backends/{ref}")
async def delete_backend(
    ref: str, session: SessionDep, actor: ActorDep, state: StateDep
) -> DeletedOut:
    def work() -> DeletedOut:
        with session.begin():
            row = resolve(crud.get_backend, session, ref)
            return delete_row(session, actor, crud.delete_backend, "backend", row.id, row.name)

    out = await run_in_threadpool(work)
    await state.pool.reload()
    return out
