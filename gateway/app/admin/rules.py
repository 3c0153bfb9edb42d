"""Who may call each admin API route: one :class:`~gateway.app.admin.roles.Access` level per
``METHOD path`` (the path as the resource router declares it, without ``/admin/v1``).

:class:`~gateway.app.admin.deps.AdminRoute` refuses a role the level does not allow (403
``permission_denied``) before the body is read. A route missing here is the owner's alone
(:func:`~gateway.app.admin.roles.access_for`), and the route-by-route test fails until it is
given a level: deciding who may call a new route is part of adding it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.app.admin.roles import Access

__all__ = ["API_RULES"]

R, W, OWN = Access.READ, Access.WRITE, Access.OWNER
TR, TW = Access.TENANT_READ, Access.TENANT_WRITE

API_RULES: Mapping[str, Access] = {
    "GET /me": Access.ANY,
    # operators: the owner's; anyone on staff may see who has access
    "GET /operators": R,
    "POST /operators": OWN,
    "GET /operators/{name}": R,
    "PATCH /operators/{name}": OWN,
    "POST /operators/{name}/reset": OWN,
    "DELETE /operators/{name}": OWN,
    "GET /tiers": R,
    "POST /tiers": W,
    "GET /tiers/{ref}": R,
    "PATCH /tiers/{ref}": W,
    "DELETE /tiers/{ref}": W,
    "GET /tenants": R,
    "POST /tenants": W,
    "GET /tenants/{ref}": R,
    "PATCH /tenants/{ref}": W,
    "POST /tenants/{ref}/suspend": W,
    "POST /tenants/{ref}/activate": W,
    "DELETE /tenants/{ref}": W,
    # keys: a tenant admin manages its own tenant's
    "GET /keys": TR,
    "POST /keys": TW,
    "GET /keys/secret-status": R,
    "GET /keys/{prefix}": TR,
    "PATCH /keys/{prefix}": TW,
    "POST /keys/{prefix}/revoke": TW,
    "POST /keys/{prefix}/rotate": TW,
    "DELETE /keys/{prefix}": TW,
    "GET /backends": R,
    "POST /backends": W,
    "GET /backends/{ref}": R,
    "PATCH /backends/{ref}": W,
    "DELETE /backends/{ref}": W,
    "GET /profiles": R,
    "POST /profiles": W,
    "GET /profiles/{ref}": R,
    "DELETE /profiles/{ref}": W,
    # prices: configuration, like backends
    "GET /prices": R,
    "POST /prices": W,
    "GET /prices/{ref}": R,
    "PATCH /prices/{ref}": W,
    "DELETE /prices/{ref}": W,
    # budgets: staff set them; a tenant admin reads its own tenant's
    "GET /budgets": TR,
    "POST /budgets": W,
    "GET /budgets/{budget_id}": TR,
    "PATCH /budgets/{budget_id}": W,
    "DELETE /budgets/{budget_id}": W,
    # usage: per tenant and over time, a tenant admin its own; per tier sums every tenant
    "GET /usage/tenants": TR,
    "GET /usage/tiers": R,
    "GET /usage/series": TR,
    # the request log: a tenant admin reads its own tenant's requests
    "GET /requests": TR,
    "GET /requests/{ref}": TR,
    "GET /audit": R,
}
