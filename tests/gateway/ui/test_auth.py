"""Signing in and out of the dashboard: credentials, cookie, expiry, CSRF, limits, audit."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi.routing import APIRoute
from pydantic import SecretStr
from sqlalchemy import select, update
from typer.testing import CliRunner

from gateway.app.ui import build_ui_router
from gateway.app.ui.auth import safe_next
from gateway.app.ui.deps import PublicRoute, UiRoute
from gateway.app.ui.sessions import SESSION_COOKIE, SignInLimiter
from gateway.cli import register
from gateway.db import crud
from gateway.db.crud import operators
from gateway.db.models import OperatorCredential, OperatorSession, utcnow
from gateway.db.security import hash_key
from gateway.db.session import make_engine, make_session_factory
from gateway.serve import prepare_database, prepare_operator
from gateway.settings import Settings, get_settings

from .conftest import ADMIN_KEY, SECRET, UI, field_errors, flash, make_ui


def _session_rows(ui: UI) -> list[OperatorSession]:
    with ui.factory() as session:
        return list(session.scalars(select(OperatorSession)))


def test_signing_in_with_the_operator_credential(ui: UI) -> None:
    assert ui.client.get("/ui/tiers", follow_redirects=False).headers["location"] == (
        "/ui/login?next=/ui/tiers"
    )
    response = ui.sign_in(next="/ui/tiers")
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/tiers"
    page = ui.client.get("/ui/tiers")
    assert page.status_code == 200
    assert flash(page) == "Signed in as operator."
    assert "premium" in page.text
    entry = ui.audit()[-1]
    assert (entry.actor, entry.action, entry.entity_type) == (
        "admin-ui:operator",
        "signin",
        "operator_session",
    )
    assert entry.after is not None and "token_hash" not in entry.after


def test_signing_in_with_the_admin_key(ui: UI) -> None:
    assert ui.sign_in(ADMIN_KEY).status_code == 303
    assert ui.client.get("/ui/").status_code == 200
    assert [s.operator for s in _session_rows(ui)] == ["admin-key"]


def test_a_tenant_key_is_refused_with_a_clear_message(ui: UI) -> None:
    response = ui.sign_in(ui.tenant_key)
    assert response.status_code == 401
    message = field_errors(response)["credential"]
    assert "tenant API key" in message and "cannot sign in" in message
    assert ui.tenant_key not in response.text  # not echoed back
    assert _session_rows(ui) == []
    assert SESSION_COOKIE not in response.headers.get("set-cookie", "")


@pytest.mark.parametrize("wrong", ["tgop-not-the-credential", "nope", ADMIN_KEY + "x"])
def test_a_wrong_credential_is_refused(sqlite_ui: UI, wrong: str) -> None:
    response = sqlite_ui.sign_in(wrong)
    assert response.status_code == 401
    assert "Wrong credential" in field_errors(response)["credential"]
    assert sqlite_ui.client.get("/ui/", follow_redirects=False).status_code == 303


def test_an_empty_credential_is_400_beside_the_field(sqlite_ui: UI) -> None:
    response = sqlite_ui.sign_in("  ")
    assert response.status_code == 400
    assert "credential" in field_errors(response)


def test_the_session_cookie_flags(sqlite_ui: UI) -> None:
    cookie = next(
        c
        for c in sqlite_ui.sign_in().headers.get_list("set-cookie")
        if c.startswith(SESSION_COOKIE)
    )
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "path", "samesite"} <= attributes
    assert "Path=/ui" in cookie and "SameSite=strict" in cookie
    assert "secure" not in attributes  # plain http here; https below
    secure = sqlite_ui.client.post(
        "https://testserver/ui/login",
        data={"credential": sqlite_ui.credential},
        follow_redirects=False,
    )
    assert "Secure" in secure.headers["set-cookie"]


def test_only_hashes_of_the_credential_and_the_session_token_are_stored(sqlite_ui: UI) -> None:
    sqlite_ui.sign_in()
    token = sqlite_ui.client.cookies[SESSION_COOKIE]
    with sqlite_ui.factory() as session:
        credential = session.scalars(select(OperatorCredential)).one()
        row = session.scalars(select(OperatorSession)).one()
        stored = [str(v) for v in (*credential.__dict__.values(), *row.__dict__.values())]
    assert credential.credential_hash == hash_key(SECRET, sqlite_ui.credential)
    assert row.token_hash == hash_key(SECRET, token)
    assert not any(sqlite_ui.credential in v or token in v for v in stored)


def test_idle_sessions_expire(sqlite_ui: UI) -> None:
    sqlite_ui.sign_in()
    assert sqlite_ui.client.get("/ui/", follow_redirects=False).status_code == 200
    ttl = get_settings().ui_session_ttl_s
    with sqlite_ui.factory.begin() as session:
        session.execute(
            update(OperatorSession).values(last_seen_at=utcnow() - timedelta(seconds=ttl + 1))
        )
    response = sqlite_ui.client.get("/ui/tiers", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/ui/login")
    poll = sqlite_ui.client.get("/ui/overview/live", headers={"hx-request": "true"})
    assert poll.status_code == 401 and poll.headers["hx-redirect"] == "/ui/login"


def test_a_used_session_stays_alive(sqlite_ui: UI) -> None:
    sqlite_ui.sign_in()
    ttl = get_settings().ui_session_ttl_s
    almost = utcnow() - timedelta(seconds=ttl - 30)
    with sqlite_ui.factory.begin() as session:
        session.execute(update(OperatorSession).values(last_seen_at=almost))
    assert sqlite_ui.client.get("/ui/", follow_redirects=False).status_code == 200
    assert _session_rows(sqlite_ui)[0].last_seen_at > almost  # moved forward


def test_logout_deletes_the_session(ui: UI) -> None:
    ui.sign_in()
    token = ui.client.cookies[SESSION_COOKIE]
    response = ui.post("/ui/logout")
    assert response.status_code == 303 and response.headers["location"] == "/ui/login"
    assert 'tiergate_session=""' in response.headers["set-cookie"]
    assert _session_rows(ui) == []
    assert [e.action for e in ui.audit()][-2:] == ["signin", "signout"]
    ui.client.cookies.set(SESSION_COOKIE, token)  # the old cookie replayed: signed out
    assert ui.client.get("/ui/", follow_redirects=False).status_code == 303


def test_logout_without_the_csrf_token_is_refused(sqlite_ui: UI) -> None:
    sqlite_ui.sign_in()
    response = sqlite_ui.post("/ui/logout", csrf=False)
    assert response.status_code == 403
    assert len(_session_rows(sqlite_ui)) == 1


def _routes(routes: list[Any]) -> list[APIRoute]:
    """Every page route, through included routers (FastAPI keeps them nested)."""
    out: list[APIRoute] = []
    for route in routes:
        nested = getattr(route, "original_router", None)
        if nested is not None:
            out += _routes(list(nested.routes))
        elif isinstance(route, APIRoute):
            out.append(route)
    return out


def _post_routes() -> list[APIRoute]:
    return [r for r in _routes(list(build_ui_router().routes)) if "POST" in (r.methods or ())]


def test_every_post_refuses_a_missing_or_wrong_csrf_token_and_changes_nothing(
    sqlite_ui: UI,
) -> None:
    routes = _post_routes()
    assert len(routes) >= 10
    assert all(isinstance(r, UiRoute) for r in routes)
    guarded = [r for r in routes if not isinstance(r, PublicRoute)]
    assert [r.path for r in routes if isinstance(r, PublicRoute)] == ["/login"]
    sqlite_ui.sign_in()
    before = len(sqlite_ui.audit())
    for route in guarded:
        path = "/ui" + route.path.replace("{name}", "acme").replace("{prefix}", "tg-abc")
        right = sqlite_ui.csrf()
        off_by_one = right[:-1] + ("1" if right.endswith("0") else "0")  # never the right one
        for token in (None, "wrong", off_by_one):
            data = {"name": "x", "weight": "1", "ttft_ms": "1", "tpot_ms": "1", "tenant": "acme"}
            if token is not None:
                data["csrf_token"] = token
            response = sqlite_ui.client.post(path, data=data, follow_redirects=False)
            assert response.status_code == 403, (path, token, response.status_code)
            assert "CSRF" in response.text
    assert len(sqlite_ui.audit()) == before  # nothing changed
    ok = sqlite_ui.client.post(
        "/ui/tenants/acme/suspend",
        headers={"x-csrf-token": sqlite_ui.csrf()},
        follow_redirects=False,
    )
    assert ok.status_code == 303  # the header works as well as the form field


def test_a_cross_site_sign_in_post_is_refused(sqlite_ui: UI) -> None:
    response = sqlite_ui.client.post(
        "/ui/login",
        data={"credential": sqlite_ui.credential},
        headers={"origin": "https://evil.example"},
        follow_redirects=False,
    )
    assert response.status_code == 403
    assert _session_rows(sqlite_ui) == []


def test_a_stranger_at_the_same_address_cannot_lock_the_operator_out(sqlite_ui: UI) -> None:
    """Failures are kept per (attempt, address): a flood of wrong credentials from the
    operator's own address (a proxy they share) leaves the right credential working."""
    for n in range(40):
        answer = sqlite_ui.sign_in(f"tgop-guess-{n}")
        assert answer.status_code == 401, answer.text
    assert sqlite_ui.sign_in().status_code == 303


def test_repeating_a_wrong_credential_backs_off_and_the_right_one_still_passes(
    sqlite_ui: UI,
) -> None:
    waits = []
    for _ in range(6):
        answer = sqlite_ui.sign_in("tgop-stale")
        if answer.status_code == 429:
            assert "Too many failed sign-ins" in field_errors(answer)["credential"]
            waits.append(int(answer.headers["retry-after"]))
            break
        assert answer.status_code == 401
    assert waits and waits[0] >= 1  # the same wrong value again: refused unchecked
    assert sqlite_ui.sign_in().status_code == 303  # the right one passes at once


@pytest.mark.parametrize(
    ("admin_key", "locked"),
    [
        ("short-admin-key", True),  # guessable: guesses are limited per address
        ("a-long-admin-key-of-32-characters-or-more", False),
    ],
)
def test_guesses_of_a_short_admin_key_are_limited_per_address(
    sqlite_url: str, tmp_path: Path, admin_key: str, locked: bool
) -> None:
    for ui in make_ui(sqlite_url, tmp_path, admin_key=admin_key):
        for n in range(12):
            assert ui.sign_in(f"guess-{n}").status_code in (401, 429)
        assert ui.sign_in(admin_key).status_code == (429 if locked else 303)
        assert ui.sign_in().status_code == 303  # an operator credential is never locked out


def test_the_limiter_backs_off_per_attempt_and_forgets() -> None:
    limiter = SignInLimiter(failures=2, window_s=60)
    assert limiter.retry_after("a", "x", guessable=True, now=0) is None
    limiter.failed("a", "x", now=0)
    assert limiter.retry_after("a", "x", now=0.5) == pytest.approx(0.5)  # 1 s after 1 failure
    limiter.failed("a", "x", now=1)
    assert limiter.retry_after("a", "x", now=1) == pytest.approx(2)  # then 2 s, doubling
    assert limiter.retry_after("a", "y", now=1) is None  # another attempt: unaffected
    assert limiter.retry_after("b", "x", now=1) is None  # another address: unaffected
    # a guessable secret: 2 failures per window per address, whatever was tried
    assert limiter.retry_after("a", "y", guessable=True, now=2) == pytest.approx(58)
    assert limiter.retry_after("a", "y", guessable=True, now=61) is None
    assert limiter.retry_after("a", "x", now=200) is None


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/ui/keys?tenant=a", "/ui/keys?tenant=a"),
        ("https://evil.example/ui/", "/ui/"),
        ("//evil.example/ui/", "/ui/"),
        ("/admin/v1/tiers", "/ui/"),
        ("/ui/login", "/ui/"),
        ("/ui/\\evil", "/ui/"),
        (None, "/ui/"),
    ],
)
def test_after_sign_in_only_dashboard_paths(target: str | None, expected: str) -> None:
    assert safe_next(target) == expected


def test_the_admin_api_takes_the_operator_credential_as_its_bearer(ui: UI) -> None:
    good = ui.client.get("/admin/v1/tiers", headers={"Authorization": f"Bearer {ui.credential}"})
    assert good.status_code == 200
    for bearer in ("tgop-wrong", ui.tenant_key):
        bad = ui.client.get("/admin/v1/tiers", headers={"Authorization": f"Bearer {bearer}"})
        assert bad.status_code == 401
        assert "operator credential" in bad.json()["error"]["message"]


def test_without_admin_key_or_credential_the_admin_api_is_off(
    sqlite_url: str, tmp_path: Path
) -> None:
    for ui in make_ui(sqlite_url, tmp_path, admin_key=None):
        with ui.factory.begin() as session:
            session.execute(OperatorCredential.__table__.delete())
        response = ui.client.get("/admin/v1/tiers", headers={"Authorization": "Bearer x"})
        assert response.status_code == 403
        assert "tiergate admin reset-credential" in response.json()["error"]["message"]
        assert ui.sign_in(ADMIN_KEY).status_code == 401  # no admin key configured either


def test_serve_creates_the_credential_once_and_only_without_an_admin_key(
    sqlite_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=sqlite_url, data_dir=tmp_path)
    prepare_database(settings)
    first = prepare_operator(settings)
    assert first is not None and first.startswith("tgop-")
    assert prepare_operator(settings) is None  # shown once
    engine = make_engine(sqlite_url)
    with make_session_factory(engine)() as session:
        rows = list(session.scalars(select(OperatorCredential)))
        audit = crud.list_audit(session, entity_type="operator_credential")
    engine.dispose()
    assert len(rows) == 1 and first not in rows[0].credential_hash
    assert [a.action for a in audit] == ["create"]
    fresh = f"sqlite:///{tmp_path / 'other.db'}"
    keyed = Settings(database_url=fresh, data_dir=tmp_path, admin_key=SecretStr(ADMIN_KEY))
    prepare_database(keyed)
    assert prepare_operator(keyed) is None  # production: TIERGATE_ADMIN_KEY signs in


def test_reset_credential_replaces_it_and_ends_its_sessions(
    sqlite_ui: UI, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sqlite_ui.sign_in()
    assert len(_session_rows(sqlite_ui)) == 1
    monkeypatch.setenv("TIERGATE_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("TIERGATE_SECRET", SECRET)
    get_settings.cache_clear()
    cli = typer.Typer()
    register(cli)
    result = CliRunner().invoke(cli, ["admin", "reset-credential", "-q"])
    assert result.exit_code == 0, result.output
    new = result.output.strip()
    assert new.startswith("tgop-") and new != sqlite_ui.credential
    assert _session_rows(sqlite_ui) == []  # signed out everywhere
    assert sqlite_ui.client.get("/ui/", follow_redirects=False).status_code == 303
    assert sqlite_ui.sign_in().status_code == 401  # the old one is gone
    assert sqlite_ui.sign_in(new).status_code == 303
    with sqlite_ui.factory() as session:
        actions = [a.action for a in crud.list_audit(session, entity_type="operator_credential")]
    assert actions == ["create", "delete", "create"]


def test_a_credential_under_a_previous_secret_still_signs_in_and_is_rehashed(
    sqlite_url: str, tmp_path: Path
) -> None:
    for ui in make_ui(sqlite_url, tmp_path, secret_previous="old-secret-for-ui"):
        with ui.factory.begin() as session:
            old = operators.create_credential(
                session, actor="test", secret="old-secret-for-ui", name="legacy"
            ).plaintext
        assert ui.sign_in(old).status_code == 303
        with ui.factory() as session:
            row = session.scalars(
                select(OperatorCredential).where(OperatorCredential.name == "legacy")
            ).one()
        assert row.credential_hash == hash_key(SECRET, old)
