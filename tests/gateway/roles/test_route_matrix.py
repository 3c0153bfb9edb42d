"""Every admin API route and every dashboard page, taken from the app's route table, answered
for each role as this file says it must be.

The expectations below are written here, route by route, not read from the gateway's rule
tables: a route the app serves that is missing here fails the test (decide who may call it,
then add it), and so does a rule that lets in a role this table does not.

Allowed or refused is told apart by the role refusal itself: 403 ``permission_denied`` (the
API) or the "Not allowed for your role" page (the dashboard). Allowed requests name things that
do not exist and send bodies that fail validation, so the matrix changes nothing: every answer
past the role check is a 404, a 400, a list, or a tenant admin's 403 ``other_tenant`` for a
key that is not its tenant's (the role let it in; the scope then refused).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import select

from gateway.db.models import AuditLog

from .conftest import ROLES, Team, routes_of

OWNER, OPERATOR, VIEWER, TENANT_ADMIN = ROLES
ALL = frozenset(ROLES)
STAFF = frozenset({OWNER, OPERATOR, VIEWER})
WRITERS = frozenset({OWNER, OPERATOR})
OWNERS = frozenset({OWNER})
KEY_READERS = STAFF | {TENANT_ADMIN}
KEY_WRITERS = WRITERS | {TENANT_ADMIN}

API: dict[str, frozenset[str]] = {
    "GET /admin/v1/me": ALL,
    "GET /admin/v1/operators": STAFF,
    "POST /admin/v1/operators": OWNERS,
    "GET /admin/v1/operators/{name}": STAFF,
    "PATCH /admin/v1/operators/{name}": OWNERS,
    "POST /admin/v1/operators/{name}/reset": OWNERS,
    "DELETE /admin/v1/operators/{name}": OWNERS,
    "GET /admin/v1/tiers": STAFF,
    "POST /admin/v1/tiers": WRITERS,
    "GET /admin/v1/tiers/{ref}": STAFF,
    "PATCH /admin/v1/tiers/{ref}": WRITERS,
    "DELETE /admin/v1/tiers/{ref}": WRITERS,
    "GET /admin/v1/tenants": STAFF,
    "POST /admin/v1/tenants": WRITERS,
    "GET /admin/v1/tenants/{ref}": STAFF,
    "PATCH /admin/v1/tenants/{ref}": WRITERS,
    "POST /admin/v1/tenants/{ref}/suspend": WRITERS,
    "POST /admin/v1/tenants/{ref}/activate": WRITERS,
    "DELETE /admin/v1/tenants/{ref}": WRITERS,
    "GET /admin/v1/keys": KEY_READERS,
    "POST /admin/v1/keys": KEY_WRITERS,
    "GET /admin/v1/keys/secret-status": STAFF,
    "GET /admin/v1/keys/{prefix}": KEY_READERS,
    "PATCH /admin/v1/keys/{prefix}": KEY_WRITERS,
    "POST /admin/v1/keys/{prefix}/revoke": KEY_WRITERS,
    "POST /admin/v1/keys/{prefix}/rotate": KEY_WRITERS,
    "DELETE /admin/v1/keys/{prefix}": KEY_WRITERS,
    "GET /admin/v1/backends": STAFF,
    "POST /admin/v1/backends": WRITERS,
    "GET /admin/v1/backends/{ref}": STAFF,
    "PATCH /admin/v1/backends/{ref}": WRITERS,
    "DELETE /admin/v1/backends/{ref}": WRITERS,
    "GET /admin/v1/profiles": STAFF,
    "POST /admin/v1/profiles": WRITERS,
    "GET /admin/v1/profiles/{ref}": STAFF,
    "DELETE /admin/v1/profiles/{ref}": WRITERS,
    "GET /admin/v1/prices": STAFF,
    "POST /admin/v1/prices": WRITERS,
    "GET /admin/v1/prices/{ref}": STAFF,
    "PATCH /admin/v1/prices/{ref}": WRITERS,
    "DELETE /admin/v1/prices/{ref}": WRITERS,
    "GET /admin/v1/budgets": KEY_READERS,
    "POST /admin/v1/budgets": WRITERS,
    "GET /admin/v1/budgets/{budget_id}": KEY_READERS,
    "PATCH /admin/v1/budgets/{budget_id}": WRITERS,
    "DELETE /admin/v1/budgets/{budget_id}": WRITERS,
    "GET /admin/v1/usage/tenants": KEY_READERS,
    "GET /admin/v1/usage/tiers": STAFF,
    "GET /admin/v1/usage/series": KEY_READERS,
    "GET /admin/v1/requests": KEY_READERS,
    "GET /admin/v1/requests/{ref}": KEY_READERS,
    "GET /admin/v1/audit": STAFF,
}

UI: dict[str, frozenset[str]] = {
    "GET /ui/": STAFF,
    "GET /ui/overview/live": STAFF,
    "GET /ui/usage": KEY_READERS,
    "GET /ui/usage/series.json": KEY_READERS,
    "GET /ui/usage.csv": KEY_READERS,
    "GET /ui/requests": KEY_READERS,
    "GET /ui/tiers": STAFF,
    "GET /ui/tiers/-/new": WRITERS,
    "POST /ui/tiers/-/new": WRITERS,
    "GET /ui/tiers/{name}": STAFF,
    "POST /ui/tiers/{name}": WRITERS,
    "POST /ui/tiers/{name}/delete": WRITERS,
    "GET /ui/tenants": STAFF,
    "GET /ui/tenants/-/new": WRITERS,
    "POST /ui/tenants/-/new": WRITERS,
    "GET /ui/tenants/{name}": STAFF,
    "POST /ui/tenants/{name}": WRITERS,
    "POST /ui/tenants/{name}/suspend": WRITERS,
    "POST /ui/tenants/{name}/activate": WRITERS,
    "POST /ui/tenants/{name}/delete": WRITERS,
    "GET /ui/keys": KEY_READERS,
    "POST /ui/keys/new": KEY_WRITERS,
    "GET /ui/keys/{prefix}": KEY_READERS,
    "POST /ui/keys/{prefix}/revoke": KEY_WRITERS,
    "POST /ui/keys/{prefix}/rotate": KEY_WRITERS,
    "GET /ui/backends": STAFF,
    "GET /ui/backends/-/live": STAFF,
    "GET /ui/backends/-/new": WRITERS,
    "POST /ui/backends/-/new": WRITERS,
    "GET /ui/backends/{name}": STAFF,
    "POST /ui/backends/{name}": WRITERS,
    "POST /ui/backends/{name}/enabled": WRITERS,
    "POST /ui/backends/{name}/delete": WRITERS,
    "GET /ui/profiles": STAFF,
    "GET /ui/profiles/-/import": WRITERS,
    "POST /ui/profiles/-/import": WRITERS,
    "GET /ui/profiles/{name}": STAFF,
    "POST /ui/profiles/{name}/delete": WRITERS,
    "GET /ui/prices": STAFF,
    "POST /ui/prices/-/new": WRITERS,
    "POST /ui/prices/{ref}/delete": WRITERS,
    "GET /ui/budgets": KEY_READERS,
    "POST /ui/budgets/-/new": WRITERS,
    "POST /ui/budgets/{budget_id}/delete": WRITERS,
    "GET /ui/audit": STAFF,
    "GET /ui/operators": STAFF,
    "GET /ui/operators/-/new": OWNERS,
    "POST /ui/operators/-/new": OWNERS,
    "GET /ui/operators/{name}": STAFF,
    "POST /ui/operators/{name}": OWNERS,
    "POST /ui/operators/{name}/reset": OWNERS,
    "POST /ui/operators/{name}/delete": OWNERS,
    "POST /ui/logout": ALL,
}
PUBLIC_UI = {"GET /ui/login", "POST /ui/login"}
"""The sign-in page: served without a session, so no role applies."""

REFUSED_PAGE = "Not allowed for your role"


def _nothing(path: str) -> str:
    """The route's path naming things that do not exist."""
    return re.sub(
        r"\{(\w+)(:\w+)?\}", lambda m: "tg-nosuch00" if m[1] == "prefix" else "no-such", path
    )


def _audit_rows(team: Team) -> int:
    with team.factory() as session:
        return len(session.scalars(select(AuditLog.id)).all())


def _api_refused(response: Any) -> bool:
    if response.status_code != 403:
        return False
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return bool(body["error"]["code"] == "permission_denied")


def test_every_admin_route_answers_each_role_as_its_rule_says(sqlite_team: Team) -> None:
    team = sqlite_team
    served = {f"{m} {p}" for m, p in routes_of(team.app, "/admin/v1/")}
    assert served == set(API), (
        f"routes without an expectation: {sorted(served - set(API))}; "
        f"expected but not served: {sorted(set(API) - served)}"
    )
    before = _audit_rows(team)
    for route, allowed in API.items():
        method, path = route.split(" ", 1)
        url = _nothing(path).removeprefix("/admin/v1")
        body = {"no_such_field": 1} if method in ("POST", "PATCH") else None
        for role in ROLES:
            response = team.api(role, method, url, json=body)
            assert response.status_code not in (401, 500), (route, role, response.text)
            refused = _api_refused(response)
            assert refused == (role not in allowed), (route, role, response.status_code)
            if refused:
                assert response.json()["error"]["type"] == "invalid_request_error"
                assert NAMES_IN_MESSAGE[role] in response.json()["error"]["message"]
    assert _audit_rows(team) == before  # the matrix changed nothing


NAMES_IN_MESSAGE = {
    "owner": "olivia",
    "operator": "oscar",
    "viewer": "vera",
    "tenant_admin": "tina",
}


def test_the_admin_key_and_the_shared_credential_are_owners(sqlite_team: Team) -> None:
    team = sqlite_team
    me = team.api(None, "GET", "/me").json()
    assert (me["name"], me["role"]) == ("admin-key", "owner")
    for route in ("GET /admin/v1/operators", "GET /admin/v1/audit"):
        method, path = route.split(" ", 1)
        assert team.api(None, method, path.removeprefix("/admin/v1")).status_code == 200
    created = team.api(None, "POST", "/operators", json={"name": "x1", "role": "viewer"})
    assert created.status_code == 201, created.text


def test_every_dashboard_page_answers_each_role_as_its_rule_says(sqlite_team: Team) -> None:
    team = sqlite_team
    served = {f"{m} {p}" for m, p in routes_of(team.app, "/ui/")}
    assert served - PUBLIC_UI == set(UI), (
        f"pages without an expectation: {sorted(served - PUBLIC_UI - set(UI))}; "
        f"expected but not served: {sorted(set(UI) - served)}"
    )
    before = _audit_rows(team)
    ordered = sorted(UI, key=lambda r: r == "POST /ui/logout")  # signing out last
    for role in ROLES:
        team.sign_in(role)
        for route in ordered:
            allowed = UI[route]
            method, path = route.split(" ", 1)
            url = _nothing(path)
            response = team.get(url) if method == "GET" else team.post(url)
            assert response.status_code not in (401, 500), (route, role, response.status_code)
            if response.status_code == 303:  # never sent to sign in again
                assert not response.headers["location"].startswith("/ui/login?"), (route, role)
            refused = response.status_code == 403 and REFUSED_PAGE in response.text
            assert refused == (role not in allowed), (route, role, response.status_code)
            if refused:  # a page, in the dashboard's frame, saying who and why
                assert response.headers["content-type"].startswith("text/html")
                assert (
                    'id="error-message"' in response.text
                    and NAMES_IN_MESSAGE[role] in response.text
                )
                assert response.headers["x-frame-options"] == "DENY"
    signouts = 4
    assert _audit_rows(team) == before + 2 * signouts  # sign-ins and sign-outs only
