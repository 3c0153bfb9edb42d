"""The admin dashboard (``/ui``): server-rendered pages over the same CRUD layer as the admin
API, one router module per page, assembled here.

Every page is a :class:`~gateway.app.ui.deps.UiRoute`: signed in (a database session, so
every worker process sees it), CSRF-checked on every POST, errors shown as pages. Changes go
through :mod:`gateway.db.crud` (audited, actor ``admin-ui:<operator>``) and then through the
admin API's side effects (:mod:`gateway.app.admin.helpers`), so the dashboard and the API
cannot disagree. Templates and static files (vendored htmx with its licence, no build step)
are in the data package :mod:`admin_ui`.

A page module exposes ``router`` (an ``APIRouter(route_class=UiRoute)``); adding a page is one
line in :data:`PAGES` (its link is already in ``base.html``'s navigation). A table's
create / edit / delete flow is a declared :class:`~gateway.app.ui.resource.Resource`, not
written again per page.
"""

from __future__ import annotations

import importlib

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from admin_ui import STATIC_DIR
from gateway.app import shared_state
from gateway.app.ui.sessions import SignInLimiter

__all__ = ["PAGES", "build_ui_router", "mount_ui"]

PAGES: tuple[str, ...] = (
    "gateway.app.ui.auth",
    "gateway.app.ui.overview",
    "gateway.app.ui.usage",
    "gateway.app.ui.requests",
    "gateway.app.ui.tiers",
    "gateway.app.ui.tenants",
    "gateway.app.ui.keys",
    "gateway.app.ui.backends",
    "gateway.app.ui.profiles",
    "gateway.app.ui.spend",
    "gateway.app.ui.audit",
    "gateway.app.ui.operators",
)
"""The page modules (each has a ``router``), in navigation order after sign-in."""

UI_PREFIX = "/ui"
STATIC_PREFIX = "/ui/static"


def build_ui_router() -> APIRouter:
    """Every page's routes; the app mounts them at ``/ui``."""
    router = APIRouter()
    for name in PAGES:
        router.include_router(importlib.import_module(name).router)
    return router


def mount_ui(app: FastAPI) -> None:
    """Serve the dashboard in ``app``: the pages at ``/ui``, the static files at
    ``/ui/static``, ``/`` sends a browser to the dashboard. Kept out of the OpenAPI document:
    the pages are HTML for people, not an API."""
    shared = shared_state.joined()  # several workers: one table of failures for all of them
    app.state.ui_signin_limiter = SignInLimiter(table=shared.signin if shared else None)
    app.mount(STATIC_PREFIX, StaticFiles(directory=str(STATIC_DIR)), name="ui-static")
    app.include_router(build_ui_router(), prefix=UI_PREFIX, include_in_schema=False)

    @app.get("/", include_in_schema=False)
    async def _root() -> RedirectResponse:
        return RedirectResponse(f"{UI_PREFIX}/", status_code=307)
