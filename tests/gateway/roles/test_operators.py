"""Named operators: managed through the admin API, the dashboard and the CLI; each change
audited by the operator who made it; credentials shown once and kept only as keyed hashes; a
role change applies to the next request; the last owner stays."""

from __future__ import annotations

import json
import re

import pytest
import typer
from sqlalchemy import select
from typer.testing import CliRunner

from gateway.cli import register
from gateway.db.models import AuditLog, OperatorCredential, OperatorSession
from gateway.db.security import hash_key
from gateway.settings import get_settings

from .conftest import ADMIN_KEY, SECRET, Team

_CREDENTIAL = re.compile(r'<code id="new-credential">(tgop-[^<]+)</code>')


def _audit(team: Team) -> list[AuditLog]:
    with team.factory() as session:
        return list(session.scalars(select(AuditLog).order_by(AuditLog.id)))


def _sessions(team: Team) -> list[OperatorSession]:
    with team.factory() as session:
        return list(session.scalars(select(OperatorSession)))


def test_operators_through_the_admin_api(team: Team) -> None:
    made = team.api(
        "owner",
        "POST",
        "/operators",
        json={"name": "tom", "role": "tenant_admin", "tenant": "globex"},
    )
    assert made.status_code == 201, made.text
    body = made.json()
    credential = body["credential"]
    assert credential.startswith("tgop-")
    assert (body["role"], body["tenant"]) == ("tenant_admin", "globex")
    me = team.client.get("/admin/v1/me", headers={"Authorization": f"Bearer {credential}"}).json()
    assert (me["name"], me["role"], me["tenant"]) == ("tom", "tenant_admin", "globex")
    listed = team.api("viewer", "GET", "/operators")
    assert listed.status_code == 200
    assert {o["name"]: o["role"] for o in listed.json()["data"]} == {
        "olivia": "owner",
        "oscar": "operator",
        "vera": "viewer",
        "tina": "tenant_admin",
        "tom": "tenant_admin",
    }
    assert "tgop-" not in listed.text and "hash" not in listed.text
    # refusals in the API's words, beside their field
    cases = [
        ({"name": "tom", "role": "viewer"}, 409, None),
        ({"name": "t2", "role": "tenant_admin"}, 400, "tenant"),
        ({"name": "t3", "role": "viewer", "tenant": "acme"}, 400, "tenant"),
        ({"name": "t4", "role": "root"}, 400, "role"),
        ({"name": "t5", "role": "tenant_admin", "tenant": "nosuch"}, 404, None),
    ]
    for spec, status, param in cases:
        response = team.api("owner", "POST", "/operators", json=spec)
        assert response.status_code == status, (spec, response.text)
        if param is not None:
            assert response.json()["error"]["param"] == param, spec
    # a role change applies to the very next request
    assert team.api("viewer", "POST", "/tiers", json={"name": "x"}).status_code == 403
    changed = team.api("owner", "PATCH", "/operators/vera", json={"role": "operator"})
    assert changed.status_code == 200 and changed.json()["role"] == "operator"
    assert (
        team.api("viewer", "POST", "/tiers", json={"name": "x"}).status_code == 400
    )  # now past the role check
    # reset: the old credential stops working, the new one is the same operator
    reset = team.api("owner", "POST", "/operators/tom/reset")
    assert reset.status_code == 201 and reset.json()["role"] == "tenant_admin"
    old = team.client.get("/admin/v1/me", headers={"Authorization": f"Bearer {credential}"})
    assert old.status_code == 401
    new = reset.json()["credential"]
    assert (
        team.client.get("/admin/v1/me", headers={"Authorization": f"Bearer {new}"}).status_code
        == 200
    )
    assert team.api("owner", "POST", "/operators/nobody/reset").status_code == 404
    # delete
    assert team.api("owner", "DELETE", "/operators/tom").status_code == 200
    assert (
        team.client.get("/admin/v1/me", headers={"Authorization": f"Bearer {new}"}).status_code
        == 401
    )
    # every change above names olivia, and no audit row holds a credential or its hash
    rows = [r for r in _audit(team) if r.entity_type == "operator_credential" and r.actor != "test"]
    assert rows and {r.actor for r in rows} == {"admin-api:olivia@testclient"}
    dumped = json.dumps([[r.before, r.after] for r in _audit(team)])
    for secret in (credential, new, *team.credentials.values()):
        assert secret not in dumped and hash_key(SECRET, secret) not in dumped
    assert "credential_hash" not in dumped


def test_the_last_owner_is_kept(team: Team) -> None:
    refused = team.api(None, "PATCH", "/operators/olivia", json={"role": "viewer"})
    assert refused.status_code == 409 and "last owner" in refused.json()["error"]["message"]
    assert team.api(None, "DELETE", "/operators/olivia").status_code == 409
    assert team.api(None, "PATCH", "/operators/oscar", json={"role": "owner"}).status_code == 200
    assert (
        team.api("operator", "DELETE", "/operators/olivia").status_code == 200
    )  # oscar: owner now
    assert team.api(None, "DELETE", "/operators/oscar").status_code == 409


def test_every_audit_row_names_the_operator_who_made_the_change(team: Team) -> None:
    tier = {"name": "t-oscar", "weight": 1.0, "ttft_ms": 500.0, "tpot_ms": 50.0}
    assert team.api("operator", "POST", "/tiers", json=tier).status_code == 201
    assert team.api("tenant_admin", "POST", "/keys", json={"tenant": "acme"}).status_code == 201
    assert team.api(None, "POST", "/tenants/globex/suspend").status_code == 200
    team.sign_in("operator")
    assert team.post("/ui/tenants/globex/activate").status_code == 303
    team.sign_in("tenant_admin")
    assert team.post("/ui/keys/new", {"tenant": "acme"}).status_code == 201
    rows = [r for r in _audit(team) if r.actor not in ("test", "seed")]
    actors = [
        (r.actor, r.action, r.entity_type) for r in rows if r.entity_type != "operator_session"
    ]
    assert actors == [
        ("admin-api:oscar@testclient", "create", "tier"),
        ("admin-api:tina@testclient", "create", "api_key"),
        ("admin-api:admin-key@testclient", "suspend", "tenant"),
        ("admin-ui:oscar", "activate", "tenant"),
        ("admin-ui:tina", "create", "api_key"),
    ]
    signins = [r.actor for r in rows if r.action == "signin"]
    assert signins == ["admin-ui:oscar", "admin-ui:tina"]
    # one operator's changes, through the API and the dashboard together
    listed = team.api("viewer", "GET", "/audit", params={"operator": "oscar"})
    found = [(e["actor"], e["action"]) for e in listed.json()["data"]]
    assert found == [
        ("admin-ui:oscar", "activate"),
        ("admin-ui:oscar", "signin"),
        ("admin-api:oscar@testclient", "create"),
    ]
    assert listed.headers["x-total-count"] == "3"
    assert team.api("viewer", "GET", "/audit", params={"operator": "osc%"}).json()["data"] == []
    team.sign_in("viewer")
    page = team.get("/ui/audit", params={"operator": "tina"})
    assert (
        page.status_code == 200
        and "admin-ui:tina" in page.text
        and "admin-ui:oscar" not in page.text
    )


def test_operators_on_the_dashboard(team: Team) -> None:
    team.sign_in("owner")
    page = team.get("/ui/operators")
    assert page.status_code == 200
    for name in ("olivia", "oscar", "vera", "tina"):
        assert f">{name}</a>" in page.text
    assert 'href="/ui/operators/-/new"' in page.text
    made = team.post("/ui/operators/-/new", {"name": "ursula", "role": "viewer", "tenant": ""})
    assert made.status_code == 201, made.text
    match = _CREDENTIAL.search(made.text)
    assert match is not None
    credential = match.group(1)
    bad = team.post("/ui/operators/-/new", {"name": "u2", "role": "tenant_admin", "tenant": ""})
    assert bad.status_code == 400 and 'id="error-tenant"' in bad.text
    # ursula signs in as a viewer, and is promoted while signed in
    team.client.cookies.clear()
    assert (
        team.client.post(
            "/ui/login", data={"credential": credential}, follow_redirects=False
        ).status_code
        == 303
    )
    assert "Not allowed for your role" in team.post("/ui/tiers/-/new", {"name": "x"}).text
    team.sign_in("owner")
    promoted = team.post("/ui/operators/ursula", {"role": "operator", "tenant": ""})
    assert promoted.status_code == 303, promoted.text
    page = team.get("/ui/operators/ursula")
    assert 'id="operator-role">operator<' in page.text
    last = team.post("/ui/operators/olivia", {"role": "viewer", "tenant": ""})
    assert last.status_code == 409 and "last owner" in last.text
    reset = team.post("/ui/operators/ursula/reset")
    assert reset.status_code == 201
    match = _CREDENTIAL.search(reset.text)
    assert match is not None and match.group(1) != credential
    assert team.post("/ui/operators/ursula/delete").status_code == 303
    with team.factory() as session:
        names = set(session.scalars(select(OperatorCredential.name)))
    assert "ursula" not in names


def test_deleting_an_operator_ends_its_sessions(team: Team) -> None:
    team.sign_in("viewer")
    assert team.get("/ui/tiers").status_code == 200
    assert len(_sessions(team)) == 1
    assert team.api("owner", "DELETE", "/operators/vera").status_code == 200
    assert _sessions(team) == []
    assert team.get("/ui/tiers").headers["location"].startswith("/ui/login")


def test_deleting_a_tenant_deletes_its_tenant_admins_audited(team: Team) -> None:
    assert team.api(None, "DELETE", "/tenants/acme").status_code == 200
    assert (
        team.client.get(
            "/admin/v1/me", headers={"Authorization": f"Bearer {team.credentials['tenant_admin']}"}
        ).status_code
        == 401
    )
    deleted = [
        r for r in _audit(team) if r.entity_type == "operator_credential" and r.action == "delete"
    ]
    assert [r.before["name"] for r in deleted if r.before] == ["tina"]


def test_the_viewer_sees_no_write_controls(team: Team) -> None:
    pages = [
        "/ui/",
        "/ui/usage",
        "/ui/tiers",
        "/ui/tiers/standard",
        "/ui/tenants",
        "/ui/tenants/acme",
        "/ui/keys",
        f"/ui/keys/{team.prefix('acme')}",
        "/ui/backends",
        "/ui/backends/-/live",
        "/ui/backends/b1",
        "/ui/profiles",
        "/ui/audit",
        "/ui/operators",
        "/ui/operators/vera",
    ]
    post_form = re.compile(r'<form[^>]*method="post"[^>]*action="([^"]+)"')
    writes: dict[str, dict[str, list[str]]] = {}
    for role in ("viewer", "operator"):
        team.sign_in(role)
        writes[role] = {}
        for path in pages:
            response = team.get(path)
            assert response.status_code == 200, (role, path)
            actions = [a for a in post_form.findall(response.text) if a != "/ui/logout"]
            links = re.findall(r'href="(/ui/[^"]*/-/(?:new|import))"', response.text)
            writes[role][path] = actions + links
    assert all(found == [] for found in writes["viewer"].values()), writes["viewer"]
    # not vacuous: the same pages give an operator its controls
    assert writes["operator"]["/ui/tiers/standard"] and writes["operator"]["/ui/keys"]
    assert writes["operator"]["/ui/tiers"] == ["/ui/tiers/-/new"]


def test_operators_through_the_cli(
    sqlite_team: Team, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = sqlite_team
    monkeypatch.setenv("TIERGATE_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("TIERGATE_SECRET", SECRET)
    get_settings.cache_clear()
    cli = typer.Typer()
    register(cli)
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, ["operators", *args])
        assert result.exit_code == code, result.output
        return result.output

    credential = run("create", "cleo", "--role", "tenant_admin", "--tenant", "globex", "-q").strip()
    assert credential.startswith("tgop-")
    me = team.client.get("/admin/v1/me", headers={"Authorization": f"Bearer {credential}"}).json()
    assert (me["role"], me["tenant"]) == ("tenant_admin", "globex")
    listed = run("list")
    assert "cleo" in listed and "globex" in listed and "tgop-" not in listed
    run("create", "cleo2", "--role", "tenant_admin", code=2)  # no tenant
    run("set-role", "cleo", "--role", "viewer")
    me = team.client.get("/admin/v1/me", headers={"Authorization": f"Bearer {credential}"}).json()
    assert (me["role"], me["tenant"]) == ("viewer", None)
    new = run("reset", "cleo", "-q").strip()
    assert new.startswith("tgop-") and new != credential
    run("delete", "olivia", code=2)  # the last owner
    run("delete", "cleo")
    assert (
        team.client.get("/admin/v1/me", headers={"Authorization": f"Bearer {new}"}).status_code
        == 401
    )
    actors = {
        r.actor
        for r in _audit(team)
        if r.entity_type == "operator_credential" and r.actor.startswith("cli:")
    }
    assert len(actors) == 1
    assert ADMIN_KEY not in listed


def _form_token(text: str) -> str:
    match = re.search(r'name="form_token" value="([^"]+)"', text)
    assert match is not None, "no one-time token in the form"
    return match.group(1)


def test_reloading_the_page_that_showed_a_credential_issues_no_other(team: Team) -> None:
    team.sign_in("owner")
    token = _form_token(team.get("/ui/operators/-/new").text)
    form = {"name": "rita", "role": "viewer", "tenant": "", "form_token": token}
    first = team.post("/ui/operators/-/new", form)
    assert first.status_code == 201
    again = team.post("/ui/operators/-/new", {**form, "name": "rita2"})  # same form, re-sent
    assert again.status_code == 409 and "already issued the credential of operator" in again.text
    assert _CREDENTIAL.search(again.text) is None
    token = _form_token(team.get("/ui/operators/rita").text)
    reset = team.post("/ui/operators/rita/reset", {"form_token": token})
    assert reset.status_code == 201
    match = _CREDENTIAL.search(reset.text)
    assert match is not None
    shown = match.group(1)
    reloaded = team.post("/ui/operators/rita/reset", {"form_token": token})
    assert reloaded.status_code == 409 and _CREDENTIAL.search(reloaded.text) is None
    me = team.client.get("/admin/v1/me", headers={"Authorization": f"Bearer {shown}"})
    assert me.status_code == 200 and me.json()["name"] == "rita"  # the one shown still works
    with team.factory() as session:
        names = list(session.scalars(select(OperatorCredential.name)))
    assert "rita2" not in names and names.count("rita") == 1
