"""The admin REST API (mounted at ``/admin/v1``): tiers, tenants, keys, backends, profiles,
prices, budgets, usage, the request log, audit, operators — one router module each, assembled
here. Who may call each route is :mod:`.rules` (roles: :mod:`.roles`).

Every route is a thin shell over :mod:`gateway.db.crud`, so the API, the CLI and the data layer
share one set of rules and every change is audited there (actor
``admin-api:<operator>@<client host>``).
What the package adds is HTTP: the admin-key check and error mapping (:mod:`.deps`), request
and response models (:mod:`.schemas`), and the side effects a committed change needs in the
running gateway (:mod:`.helpers`) — dropping cached key identities (so a revocation or
suspension takes effect on the next request) and reloading the backend pool. Errors are the
gateway's one dialect (:mod:`gateway.errors`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from gateway.app.admin import (
    audit,
    backends,
    budgets,
    keys,
    operators,
    prices,
    profiles,
    requests,
    tenants,
    tiers,
    usage,
)
from gateway.app.admin.deps import AdminRoute, admin_bearer
from gateway.errors import error_responses

__all__ = ["build_admin_router"]

RESOURCES = (
    tiers,
    tenants,
    keys,
    backends,
    profiles,
    prices,
    budgets,
    usage,
    requests,
    audit,
    operators,
)
"""In the order OpenAPI lists them."""

ERRORS = error_responses(
    {
        400: "invalid request: not JSON, a wrong type, a missing or unknown field, a value out "
        "of range; `param` names the field",
        401: "missing or invalid admin key",
        403: "no admin key configured (`admin_api_disabled`), or the operator's role does not "
        "allow the route or the tenant it names (`permission_denied`)",
        404: "no such tier, tenant, key, backend or profile",
        409: "name taken, or still in use",
        # also keeps FastAPI from documenting its own 422, which this API never answers
        "4XX": "any other client error (e.g. 413: body too large)",
        503: "the database is busy (`database_busy`) or unreachable (`database_unavailable`); "
        "retry after `Retry-After` seconds",
        500: "an unexpected database error (`database_error`), logged without its values",
    }
)


def build_admin_router() -> APIRouter:
    """The admin API's routes; the app mounts them at ``/admin/v1``."""
    router = APIRouter(
        route_class=AdminRoute,
        # Documents the scheme in OpenAPI; AdminRoute enforces it before the body is read.
        dependencies=[Depends(admin_bearer)],
        responses=ERRORS,
    )
    for resource in RESOURCES:
        router.include_router(resource.router)
    return router
