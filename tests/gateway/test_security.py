"""Security drill, through the whole app: the admin guard, tenant isolation on every
route, key rotation with a grace period (admin API and CLI), server-secret rotation across
restarts, and the audit actor's source address behind (un)trusted proxies.

Header limits are in ``test_http_limits.py``; the grep of a full run's logs in
``test_clean_logs.py``.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from typer.testing import CliRunner

from gateway.app import create_app
from gateway.app.admin import credentials
from gateway.app.admin.deps import AdminRoute
from gateway.app.server import GatewayThread
from gateway.app.ui.deps import UiRoute
from gateway.cli import register
from gateway.db import crud
from gateway.db.models import ApiKey, AuditLog, utcnow
from gateway.db.security import secret_id, server_secret
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings, get_settings
from tests.gateway.seeded_app import app_settings, seed_database

SECRET = "security-test-secret-" + "s" * 24
NEW_SECRET = "security-test-secret-2-" + "n" * 24
ADMIN_KEY = "security-test-admin-key-" + "a" * 24
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
KEY_RE = re.compile(r"tg-[a-z0-9]{8}-[A-Za-z0-9_-]{20,}")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI-shaped error of ``response``, which must have ``status``."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"])
    return dict(body["error"])


@dataclass
class Gateway:
    client: TestClient
    url: str
    keys: dict[str, str]  # tenant -> a key

    @property
    def app(self) -> FastAPI:
        app: FastAPI = self.client.app  # type: ignore[assignment]
        return app

    def admin(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        response = self.client.request(method, "/admin/v1" + path, json=body, headers=ADMIN)
        assert response.status_code == expect, response.text
        return response.json()

    def models(self, key: str) -> httpx.Response:
        return self.client.get("/v1/models", headers=bearer(key))


@contextmanager
def running(url: str, root: Path, secret: str = SECRET, **overrides: Any) -> Iterator[TestClient]:
    settings = app_settings(url, root, secret, ADMIN_KEY, **overrides)
    with TestClient(create_app(settings, backends=[])) as client:
        yield client


@pytest.fixture
def gateway(db_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """The whole app (no backends), on SQLite and PostgreSQL, with tenants ``acme`` and
    ``globex``."""
    engine, acme_key = seed_database(db_url, SECRET, tenant="acme")
    with make_session_factory(engine).begin() as session:
        crud.create_tenant(session, actor="test", name="globex", tier="premium")
        globex_key = crud.create_key(
            session, actor="test", tenant="globex", secret=SECRET, name="globex-app"
        ).plaintext
    engine.dispose()
    with running(db_url, tmp_path) as client:
        yield Gateway(client, db_url, {"acme": acme_key, "globex": globex_key})


# -- the admin key -------------------------------------------------------------------------


def test_the_admin_guard_compares_digests_in_constant_time(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(credentials.hmac, "compare_digest", spy)
    cases = {
        None: 401,
        "Bearer wrong": 401,
        f"Bearer {ADMIN_KEY[:-1]}": 401,  # a prefix of the key: no early exit to time
        f"Basic {ADMIN_KEY}": 401,
        f"Bearer {gateway.keys['acme']}": 401,  # a tenant key is no admin key
        f"Bearer {ADMIN_KEY}": 200,
        f"bearer   {ADMIN_KEY}  ": 200,
    }
    for authorization, status in cases.items():
        headers = {"Authorization": authorization} if authorization is not None else {}
        response = gateway.client.get("/admin/v1/tenants", headers=headers)
        assert response.status_code == status, (authorization, response.text)
        if status == 401:
            assert error(response, 401)["code"] == "invalid_admin_key"
            assert ADMIN_KEY not in response.text
    # every bearer attempt went through compare_digest, on fixed-length digests
    assert len(compared) == sum(1 for a in cases if a and a.lower().startswith("bearer"))
    assert all(len(a) == len(b) == 32 for a, b in compared)


# -- tenant isolation on every route -----------------------------------------------------------

PUBLIC = {"/health/liveliness", "/health/readiness", "/metrics"}
DOCS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
SIGN_IN = {"/", "/ui/login"}
"""Dashboard routes anyone may reach: the redirect to it and its sign-in form."""


def endpoints(app: FastAPI) -> list[tuple[str, str, type]]:
    """(method, path, route class) of every route the app serves, included routers opened."""
    found: list[tuple[str, str, type]] = []
    for route in app.routes:
        contexts: Callable[[], Any] | None = getattr(route, "effective_route_contexts", None)
        if contexts is not None:  # an included router (FastAPI >= 0.120 keeps them nested)
            items = [(c.path, c.methods, type(c.original_route)) for c in contexts()]
        else:
            items = [(route.path, getattr(route, "methods", None), type(route))]  # type: ignore[attr-defined]
        for path, methods, kind in items:
            found += [(m, path, kind) for m in sorted(methods or ()) if m != "HEAD"]
    return found


def _concrete(path: str, prefix: str) -> str:
    """A route's path with every parameter naming the other tenant's things."""
    return re.sub(r"\{(\w+)(:\w+)?\}", lambda m: "globex" if m[1] != "prefix" else prefix, path)


def test_every_route_is_guarded_and_no_tenant_sees_another(gateway: Gateway) -> None:
    routes = endpoints(gateway.app)
    paths = {path for _, path, _ in routes}
    documented = set(gateway.client.get("/openapi.json").json()["paths"])
    # nothing the walk missed (the schema names ``{model:path}`` as ``{model}``)
    assert documented <= {re.sub(r"\{(\w+):\w+\}", r"{\1}", p) for p in paths}
    unclassified = {
        p
        for p in paths
        if not p.startswith(("/admin/v1/", "/v1/", "/ui/")) and p not in PUBLIC | DOCS | SIGN_IN
    }
    assert not unclassified, (
        f"new routes: decide who may call them, then list them here: {unclassified}"
    )
    admin_routes = [r for r in routes if r[1].startswith("/admin/v1/")]
    assert len(admin_routes) >= 30 and all(kind is AdminRoute for *_, kind in admin_routes)
    ui_routes = [r for r in routes if r[1].startswith("/ui/") and r[1] not in SIGN_IN]
    assert len(ui_routes) >= 20 and all(kind is UiRoute for *_, kind in ui_routes)

    acme, globex = gateway.keys["acme"], gateway.keys["globex"]
    globex_prefix = globex.split("-")[1]
    secrets_of_globex = ("globex", globex_prefix, "premium")
    for method, path, _ in routes:
        url = _concrete(path, globex_prefix)
        if path.startswith("/admin/v1/"):
            # a tenant key (anyone's) never opens the admin API, whatever it names
            for key in (acme, globex):
                response = gateway.client.request(method, url, json={}, headers=bearer(key))
                assert error(response, 401)["code"] == "invalid_admin_key", (method, url)
        elif path.startswith("/v1/"):
            response = gateway.client.request(method, url, json={}, headers=ADMIN)
            assert error(response, 401)["code"] == "invalid_api_key", (
                method,
                url,
            )  # admin ≠ tenant
            body = {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}
            response = gateway.client.request(method, url, json=body, headers=bearer(acme))
            assert response.status_code < 500, (method, url, response.text)
            assert not any(s in response.text for s in secrets_of_globex), (method, url)
        elif path.startswith("/ui/") and path not in SIGN_IN:
            # no session: a key (a tenant's, or even the admin key) is no dashboard sign-in
            for headers in (bearer(acme), ADMIN):
                response = gateway.client.request(
                    method, url, headers=headers, follow_redirects=False
                )
                if response.status_code != 403:  # a POST may also be refused for its CSRF token
                    assert response.status_code == 303, (method, url, response.status_code)
                    assert response.headers["location"].startswith("/ui/login"), url
                assert not any(s in response.text for s in secrets_of_globex), (method, url)
        else:
            response = gateway.client.request(method, url)
            assert response.status_code != 500, (method, url)
            assert not any(s in response.text for s in (*secrets_of_globex, "acme")), url
    # and nothing changed: no route let a tenant key write
    with gateway.app.state.gateway.session_factory() as s:
        writers = select(AuditLog.actor).where(AuditLog.actor.not_in(("test", "seed")))
        assert s.scalars(writers).all() == []


# -- key rotation ---------------------------------------------------------------------------


def test_key_rotation_through_the_admin_api(gateway: Gateway) -> None:
    old = gateway.keys["acme"]
    prefix = old.split("-")[1]
    before = utcnow()
    rotated = gateway.admin("POST", f"/keys/tg-{prefix}/rotate", {"grace_s": 3600}, expect=201)
    new = rotated["key"]
    assert KEY_RE.fullmatch(new) and rotated["prefix"] == "tg-" + new.split("-")[1]
    assert rotated["tenant"] == "acme" and rotated["name"].endswith(f"(rotated from tg-{prefix})")
    replaced = rotated["replaces"]
    assert replaced["prefix"] == f"tg-{prefix}" and replaced["status"] == "active"
    assert "key" not in replaced
    # the old key now expires an hour after the rotation: both work meanwhile, for acme
    expires = replaced["expires_at"]
    assert before + timedelta(seconds=3599) < _parse(expires) <= utcnow() + timedelta(hours=1)
    for key in (old, new):
        assert gateway.models(key).status_code == 200
    assert new not in json.dumps(gateway.admin("GET", f"/keys/tg-{prefix}"))  # shown once
    # the grace period ends (moved into the past here, instead of waiting an hour); once the
    # cached identity is stale (the cache's own clock, stepped past its TTL) the old key is out
    auth = gateway.app.state.gateway.auth
    with gateway.app.state.gateway.session_factory.begin() as s:
        s.execute(
            update(ApiKey)
            .where(ApiKey.prefix == prefix)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    clock = auth.clock
    auth.clock = lambda: clock() + 10 * auth.ttl_s
    refused = error(gateway.models(old), 401)
    assert refused["code"] == "invalid_api_key" and "expired" in refused["message"]
    assert old not in refused["message"] and f"tg-{prefix}" in refused["message"]
    assert gateway.models(new).status_code == 200
    # audited with the actor and its source address
    entries = gateway.admin("GET", "/audit?entity_type=api_key")["data"]
    rotation = next(e for e in entries if e["action"] == "rotate")
    assert rotation["actor"] == "admin-api:admin-key@testclient"
    assert rotation["after"]["rotated_to"] == new.split("-")[1]
    # bad requests
    for body, status in (({"grace_s": -1}, 400), ({"grace_s": "1h"}, 400), ({"x": 1}, 400)):
        error(
            gateway.client.post(f"/admin/v1/keys/{prefix}/rotate", json=body, headers=ADMIN), status
        )
    error(gateway.client.post("/admin/v1/keys/zzzzzzzz/rotate", json={}, headers=ADMIN), 404)
    gateway.admin("POST", f"/keys/{new.split('-')[1]}/revoke")
    conflict = error(
        gateway.client.post(f"/admin/v1/keys/{new.split('-')[1]}/rotate", json={}, headers=ADMIN),
        409,
    )
    assert "revoked" in conflict["message"]


def test_rotation_invalidates_the_old_keys_cached_identity_at_once(gateway: Gateway) -> None:
    old = gateway.keys["globex"]
    assert gateway.models(old).status_code == 200  # cached now
    gateway.admin("POST", f"/keys/{old.split('-')[1]}/rotate", {"grace_s": 0}, expect=201)
    assert "expired" in error(gateway.models(old), 401)["message"]  # no wait for the TTL


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@pytest.fixture
def cli(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    monkeypatch.setenv("TIERGATE_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("TIERGATE_SECRET", SECRET)
    get_settings.cache_clear()
    app = typer.Typer()
    register(app)
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> str:
        result = runner.invoke(app, list(args))
        assert result.exit_code == code, result.output
        return result.output

    invoke("db", "upgrade")
    invoke("db", "seed")
    invoke("tenants", "create", "acme", "--tier", "standard")
    return invoke


def test_key_rotation_through_the_cli(cli: Callable[..., Any], sqlite_url: str) -> None:
    old = cli("keys", "create", "--tenant", "acme", "--name", "billing", "-q").strip()
    prefix = old.split("-")[1]
    out = cli("keys", "rotate", f"tg-{prefix}", "--grace", "2h")
    new = KEY_RE.findall(out)
    assert len(new) == 1 and new[0] != old and f"tg-{prefix} keeps working until" in out
    factory = make_session_factory(make_engine(sqlite_url))
    now = utcnow()
    with factory() as s:
        for key in (old, new[0]):
            assert crud.authenticate(s, SECRET, key, now=now, touch=False) is not None
        expiry = crud.get_key(s, prefix).expires_at
        assert expiry is not None and now + timedelta(minutes=119) < expiry <= now + timedelta(
            hours=2
        )
        later = now + timedelta(hours=2, seconds=1)
        assert crud.authenticate(s, SECRET, old, now=later, touch=False) is None
        assert crud.get_key(s, new[0].split("-")[1]).name == f"billing (rotated from tg-{prefix})"
        rotation = s.scalars(select(AuditLog).where(AuditLog.action == "rotate")).one()
        assert rotation.actor.startswith("cli:")
    quiet = cli("keys", "rotate", new[0].split("-")[1], "--grace", "0", "-q").strip()
    assert KEY_RE.fullmatch(quiet)
    with factory() as s:
        assert crud.authenticate(s, SECRET, new[0], touch=False) is None  # grace 0: at once
    assert "use e.g. 90s" in cli("keys", "rotate", prefix, "--grace", "soon", code=2)
    assert "does not exist" in cli("keys", "rotate", "zzzzzzzz", code=2)
    factory.kw["bind"].dispose()


# -- server secret rotation ------------------------------------------------------------------


def test_secret_rotation_across_restarts(sqlite_url: str, tmp_path: Path) -> None:
    engine, used = seed_database(sqlite_url, SECRET)
    with make_session_factory(engine).begin() as s:
        idle = crud.create_key(s, actor="test", tenant="acme", secret=SECRET).plaintext
    engine.dispose()

    def status(client: TestClient) -> dict[str, Any]:
        response = client.get("/admin/v1/keys/secret-status", headers=ADMIN)
        assert response.status_code == 200, response.text
        return dict(response.json())

    # 1. the new secret, the old one as previous: both keys still work; a used key moves over
    with running(sqlite_url, tmp_path, NEW_SECRET, secret_previous=SECRET) as client:
        before = status(client)
        assert (before["current"], before["previous"], before["safe_to_drop_previous"]) == (
            0,
            [2],
            False,
        )
        assert client.get("/v1/models", headers=bearer(used)).status_code == 200
        after = status(client)
        assert (after["current"], after["previous"], after["safe_to_drop_previous"]) == (
            1,
            [1],
            False,
        )
        factory = client.app.state.gateway.session_factory  # type: ignore[attr-defined]
        with factory() as s:
            row = s.scalars(select(ApiKey).where(ApiKey.prefix == used.split("-")[1])).one()
            assert row.secret_id == secret_id(NEW_SECRET)
    # 2. the previous secret dropped too early: the key never used since is cut off, says status
    with running(sqlite_url, tmp_path, NEW_SECRET) as client:
        assert client.get("/v1/models", headers=bearer(used)).status_code == 200
        assert (
            error(client.get("/v1/models", headers=bearer(idle)), 401)["code"] == "invalid_api_key"
        )
        dropped = status(client)
        assert (dropped["current"], dropped["previous"], dropped["other"]) == (1, [], 1)
    # 3. restored, the idle key is used once; now nothing needs the previous secret
    with running(
        sqlite_url, tmp_path, NEW_SECRET, secret_previous=f"{SECRET}, unrelated"
    ) as client:
        assert client.get("/v1/models", headers=bearer(idle)).status_code == 200
        final = status(client)
        assert (final["current"], final["previous"], final["safe_to_drop_previous"]) == (
            2,
            [0, 0],
            True,
        )


def test_secret_status_through_the_cli(
    cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = cli("keys", "create", "--tenant", "acme", "-q").strip()
    monkeypatch.setenv("TIERGATE_SECRET", NEW_SECRET)
    monkeypatch.setenv("TIERGATE_SECRET_PREVIOUS", SECRET)
    get_settings.cache_clear()
    out = cli("keys", "secret-status")
    assert "previous #1" in out and "2 key(s) may still need" in out  # with the demo key
    cli("keys", "secret-status", "--check", code=1)
    settings = get_settings()
    factory = make_session_factory(make_engine(settings.database_url))
    with factory.begin() as s:
        assert crud.authenticate(s, server_secret(settings), key) is not None
    assert "1 key(s) may still need" in cli("keys", "secret-status")
    with factory.begin() as s:
        (demo,) = crud.list_keys(s, tenant="demo")
        crud.revoke_key(s, demo.id, actor="test")  # not usable: no longer waiting
    factory.kw["bind"].dispose()
    assert "TIERGATE_SECRET_PREVIOUS can go" in cli("keys", "secret-status", "--check")
    for text in (SECRET, NEW_SECRET):
        assert text not in out


# -- the audit actor's address behind a proxy ------------------------------------------------


@contextmanager
def served(app: FastAPI, settings: Settings) -> Iterator[GatewayThread]:
    """The app under uvicorn: GatewayThread applies the app's own HTTP options (``tiergate
    serve``'s head limits and proxy trust) from the settings it was created with."""
    assert app.state.settings is settings
    with GatewayThread(app) as gateway:
        yield gateway


@pytest.mark.parametrize(
    ("trusted", "actor"),
    [
        (None, "admin-api:admin-key@127.0.0.1"),
        ("127.0.0.1", "admin-api:admin-key@203.0.113.7"),
        ("10.0.0.0/8", "admin-api:admin-key@127.0.0.1"),
    ],
)
def test_the_audit_actor_is_the_peer_unless_it_is_a_trusted_proxy(
    sqlite_url: str, tmp_path: Path, trusted: str | None, actor: str
) -> None:
    engine, key = seed_database(sqlite_url, SECRET)
    engine.dispose()
    settings = app_settings(sqlite_url, tmp_path, SECRET, ADMIN_KEY, trusted_proxies=trusted)
    with served(create_app(settings, backends=[]), settings) as gw:
        headers = {**ADMIN, "X-Forwarded-For": "198.51.100.1, 203.0.113.7"}
        prefix = key.split("-")[1]
        response = httpx.post(f"{gw.url}/admin/v1/keys/{prefix}/rotate", json={}, headers=headers)
        assert response.status_code == 201, response.text
        with gw.state.session_factory() as s:
            rotation = s.scalars(select(AuditLog).where(AuditLog.action == "rotate")).one()
            newest = select(AuditLog).where(AuditLog.action == "create").order_by(AuditLog.id)
            creation = s.scalars(newest).all()[-1]  # the successor's
    assert rotation.actor == actor and creation.actor == actor
