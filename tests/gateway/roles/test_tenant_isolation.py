"""A tenant admin of acme reaches acme's keys and usage, and nothing of globex by any id or
name: not its keys (by prefix, with or without ``tg-``), not its usage (JSON, CSV, grouped),
not the tenant itself; neither on the admin API nor on the dashboard. Refusals are 403 and say
nothing of globex, and nothing it asked for changed."""

from __future__ import annotations

import csv
import io

from gateway.db import crud

from .conftest import Team

TA = "tenant_admin"


def _foreign_refs(team: Team) -> list[str]:
    return ["globex", str(team.tenant_ids["globex"]), " globex"]


def _foreign_prefixes(team: Team) -> list[str]:
    bare = team.prefix("globex")
    return [bare, f"tg-{bare}", team.keys["globex"]]


def _refused(response: object, code: str = "other_tenant") -> None:
    assert response.status_code == 403, response.text  # type: ignore[attr-defined]
    error = response.json()["error"]  # type: ignore[attr-defined]
    assert error["code"] == code
    assert "globex" not in response.text  # type: ignore[attr-defined]


def test_a_tenant_admin_reads_and_manages_its_own_keys_only(team: Team) -> None:
    mine = team.api(TA, "GET", "/keys").json()["data"]
    assert {k["tenant"] for k in mine} == {"acme"} and len(mine) == 1
    for ref in ("acme", str(team.tenant_ids["acme"])):
        assert team.api(TA, "GET", "/keys", params={"tenant": ref}).status_code == 200
    for ref in _foreign_refs(team):
        _refused(team.api(TA, "GET", "/keys", params={"tenant": ref}))
        _refused(team.api(TA, "POST", "/keys", json={"tenant": ref}))
    tenant_id = team.tenant_ids["globex"]
    _refused(team.api(TA, "POST", "/keys", json={"tenant": tenant_id}))
    for prefix in _foreign_prefixes(team):
        _refused(team.api(TA, "GET", f"/keys/{prefix}"))
        _refused(team.api(TA, "PATCH", f"/keys/{prefix}", json={"name": "mine now"}))
        _refused(team.api(TA, "POST", f"/keys/{prefix}/revoke"))
        _refused(team.api(TA, "POST", f"/keys/{prefix}/rotate", json={}))
        _refused(team.api(TA, "DELETE", f"/keys/{prefix}"))
    # a prefix that exists nowhere is answered exactly as another tenant's is
    nowhere = team.api(TA, "GET", "/keys/tg-zzzzzzzz")
    _refused(nowhere)
    assert nowhere.json() == team.api(TA, "GET", f"/keys/{team.prefix('globex')}").json()
    with team.factory() as session:  # globex's key is untouched
        key = crud.get_key(session, team.prefix("globex"))
        assert key.revoked_at is None and key.name is None
        assert len(crud.list_keys(session, tenant=tenant_id)) == 1
    # its own tenant's keys: create, rename, rotate, revoke, delete
    created = team.api(TA, "POST", "/keys", json={"tenant": "acme", "name": "ci"})
    assert created.status_code == 201, created.text
    prefix = created.json()["prefix"]
    assert team.api(TA, "PATCH", f"/keys/{prefix}", json={"name": "ci2"}).status_code == 200
    assert team.api(TA, "POST", f"/keys/{prefix}/rotate", json={}).status_code == 201
    assert team.api(TA, "POST", f"/keys/{prefix}/revoke").status_code == 200
    assert team.api(TA, "DELETE", f"/keys/{prefix}").status_code == 200


def test_a_tenant_admin_reads_its_own_usage_only(team: Team) -> None:
    own = team.api(TA, "GET", "/usage/tenants").json()["data"]
    assert [(r["tenant"], r["requests"]) for r in own] == [("acme", 1)]
    series = team.api(TA, "GET", "/usage/series", params={"group_by": "tenant"})
    assert series.status_code == 200 and "globex" not in series.text
    assert [g["group"] for g in series.json()["groups"]] == ["acme"]
    exported = team.api(TA, "GET", "/usage/series", params={"format": "csv", "group_by": "tenant"})
    assert exported.status_code == 200 and "globex" not in exported.text
    groups = {r["group"] for r in csv.DictReader(io.StringIO(exported.text))}
    assert groups == {"acme"}
    for ref in _foreign_refs(team):
        _refused(team.api(TA, "GET", "/usage/tenants", params={"tenant": ref}))
        _refused(team.api(TA, "GET", "/usage/series", params={"tenant": ref}))
        _refused(team.api(TA, "GET", "/usage/series", params={"tenant": ref, "format": "csv"}))
        _refused(team.api(TA, "GET", f"/tenants/{ref.strip()}"), code="permission_denied")
    _refused(team.api(TA, "GET", "/usage/tiers"), code="permission_denied")  # sums every tenant
    _refused(team.api(TA, "GET", "/audit"), code="permission_denied")
    # staff see both tenants (the filter above is the tenant admin's, not everyone's)
    both = team.api("viewer", "GET", "/usage/tenants").json()["data"]
    assert {r["tenant"] for r in both} >= {"acme", "globex"}


def _page_refused(response: object) -> None:
    assert response.status_code == 403, response.status_code  # type: ignore[attr-defined]
    text = response.text  # type: ignore[attr-defined]
    assert 'id="error-message"' in text and "globex" not in text


def test_a_tenant_admin_on_the_dashboard_sees_only_its_tenant(team: Team) -> None:
    team.sign_in(TA)
    keys = team.get("/ui/keys")
    assert keys.status_code == 200
    assert team.prefix("acme") in keys.text and team.prefix("globex") not in keys.text
    assert "globex" not in keys.text
    usage = team.get("/ui/usage", params={"group_by": "tenant"})
    assert usage.status_code == 200 and "globex" not in usage.text
    data = team.get("/ui/usage/series.json", params={"group_by": "tenant"})
    assert data.status_code == 200 and "globex" not in data.text
    exported = team.get("/ui/usage.csv", params={"group_by": "tenant"})
    assert exported.status_code == 200 and "globex" not in exported.text
    assert {r["group"] for r in csv.DictReader(io.StringIO(exported.text))} == {"acme"}
    for ref in _foreign_refs(team):
        for page in ("/ui/keys", "/ui/usage", "/ui/usage/series.json", "/ui/usage.csv"):
            _page_refused(team.get(page, params={"tenant": ref}))
        # the form again, refused beside its tenant field (what was typed is shown again)
        again = team.post("/ui/keys/new", {"tenant": ref})
        assert again.status_code == 403
        assert "administers tenant &#39;acme&#39; only" in again.text
        assert team.prefix("globex") not in again.text
    for prefix in _foreign_prefixes(team):
        _page_refused(team.get(f"/ui/keys/{prefix}"))
        _page_refused(team.post(f"/ui/keys/{prefix}/revoke"))
        _page_refused(team.post(f"/ui/keys/{prefix}/rotate", {"grace_s": "0"}))
    for page in ("/ui/tenants/globex", "/ui/tenants", "/ui/", "/ui/audit"):
        _page_refused(team.get(page))
    with team.factory() as session:
        key = crud.get_key(session, team.prefix("globex"))
        assert key.revoked_at is None and key.expires_at is None
        assert len(crud.list_keys(session, tenant=team.tenant_ids["globex"])) == 1
    # and its own: a key created on the dashboard is acme's
    created = team.post("/ui/keys/new", {"tenant": "acme", "name": "from-ui"})
    assert created.status_code == 201, created.text
