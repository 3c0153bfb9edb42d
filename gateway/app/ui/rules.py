"""Who may open each dashboard page or send each form: one
:class:`~gateway.app.admin.roles.Access` level per ``METHOD path`` (the path as the page module
declares it, without ``/ui``), the same levels as the admin API's (:mod:`gateway.app.admin.rules`).

:class:`~gateway.app.ui.deps.UiRoute` answers a 403 page to a role the level does not allow,
before the form is read. A form that only shows how to change something (``/tiers/-/new``) is
a write: a viewer never sees it. A page missing here is the owner's alone, and the
route-by-route test fails until it is given a level. The sign-in page is public and has no rule.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.app.admin.roles import Access

__all__ = ["UI_RULES"]

ANY, R, W, OWN = Access.ANY, Access.READ, Access.WRITE, Access.OWNER
TR, TW = Access.TENANT_READ, Access.TENANT_WRITE

UI_RULES: Mapping[str, Access] = {
    "POST /logout": ANY,
    "GET /": R,
    "GET /overview/live": R,
    "GET /usage": TR,
    "GET /usage/series.json": TR,
    "GET /usage.csv": TR,
    "GET /requests": TR,
    "GET /tiers": R,
    "GET /tiers/-/new": W,
    "POST /tiers/-/new": W,
    "GET /tiers/{name}": R,
    "POST /tiers/{name}": W,
    "POST /tiers/{name}/delete": W,
    "GET /tenants": R,
    "GET /tenants/-/new": W,
    "POST /tenants/-/new": W,
    "GET /tenants/{name}": R,
    "POST /tenants/{name}": W,
    "POST /tenants/{name}/suspend": W,
    "POST /tenants/{name}/activate": W,
    "POST /tenants/{name}/delete": W,
    "GET /keys": TR,
    "POST /keys/new": TW,
    "GET /keys/{prefix}": TR,
    "POST /keys/{prefix}/revoke": TW,
    "POST /keys/{prefix}/rotate": TW,
    "GET /backends": R,
    "GET /backends/-/live": R,
    "GET /backends/-/new": W,
    "POST /backends/-/new": W,
    "GET /backends/{name}": R,
    "POST /backends/{name}": W,
    "POST /backends/{name}/enabled": W,
    "POST /backends/{name}/delete": W,
    "GET /profiles": R,
    "GET /profiles/-/import": W,
    "POST /profiles/-/import": W,
    "GET /profiles/{name}": R,
    "POST /profiles/{name}/delete": W,
    "GET /prices": R,
    "POST /prices/-/new": W,
    "POST /prices/{ref}/delete": W,
    "GET /budgets": TR,
    "POST /budgets/-/new": W,
    "POST /budgets/{budget_id}/delete": W,
    "GET /audit": R,
    "GET /operators": R,
    "GET /operators/-/new": OWN,
    "POST /operators/-/new": OWN,
    "GET /operators/{name}": R,
    "POST /operators/{name}": OWN,
    "POST /operators/{name}/reset": OWN,
    "POST /operators/{name}/delete": OWN,
}
