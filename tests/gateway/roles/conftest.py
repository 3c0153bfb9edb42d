"""The whole gateway app with one named operator per role, two tenants with keys and usage, on
SQLite and PostgreSQL (:class:`Team`).

``olivia`` is an owner, ``oscar`` an operator, ``vera`` a viewer, ``tina`` the tenant admin of
``acme``; ``globex`` is the other tenant, whose things a tenant admin of acme must never reach.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from gateway.app.app import create_app
from gateway.db import crud
from gateway.db.crud import operators
from gateway.db.models import UsageRecord, utcnow
from gateway.db.session import make_session_factory
from gateway.settings import Settings
from priority.profiles import available_profiles
from tests.gateway.seeded_app import seed_database
from tests.gateway.usage_rows import row

SECRET = "roles-tests-server-secret-5a6b"
ADMIN_KEY = "roles-tests-admin-key-7c8d9e"
BASE = "http://testserver"
NAMES = {"owner": "olivia", "operator": "oscar", "viewer": "vera", "tenant_admin": "tina"}
ROLES = tuple(NAMES)

_CSRF = re.compile(r'<meta name="csrf-token" content="([^"]*)">')


@dataclass
class Team:
    """A browser-like client of one gateway, the database behind it, and everyone's secrets."""

    client: TestClient
    app: FastAPI
    factory: sessionmaker[Session]
    credentials: dict[str, str]  # role -> credential
    keys: dict[str, str]  # tenant -> API key
    tenant_ids: dict[str, int] = field(default_factory=dict)

    def prefix(self, tenant: str) -> str:
        return self.keys[tenant].split("-")[1]

    def api(self, role: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """``/admin/v1`` + ``path`` with ``role``'s credential (None: ``TIERGATE_ADMIN_KEY``)."""
        secret = self.credentials[role] if role is not None else ADMIN_KEY
        headers = {"Authorization": f"Bearer {secret}"}
        return self.client.request(method, f"/admin/v1{path}", headers=headers, **kwargs)

    def sign_in(self, role: str) -> None:
        """Sign ``role``'s operator in (this client's cookie is then its session)."""
        self.client.cookies.clear()
        response = self.client.post(
            "/ui/login", data={"credential": self.credentials[role]}, follow_redirects=False
        )
        assert response.status_code == 303, response.text

    def csrf(self) -> str:
        match = _CSRF.search(self.client.get("/ui/keys").text)
        assert match is not None and match.group(1)
        return match.group(1)

    def post(self, path: str, data: dict[str, Any] | None = None) -> httpx.Response:
        body = {**(data or {}), "csrf_token": self.csrf()}
        return self.client.post(path, data=body, follow_redirects=False)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(path, follow_redirects=False, **kwargs)


def _populate(session: Session) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
    crud.create_tenant(session, actor="test", name="globex", tier="standard")
    globex_key = crud.create_key(session, actor="test", tenant="globex", secret=SECRET)
    ids = {t: crud.get_tenant(session, t).id for t in ("acme", "globex")}
    credentials = {}
    for role, name in NAMES.items():
        tenant = ids["acme"] if role == "tenant_admin" else None
        issued = operators.create_credential(
            session, actor="test", secret=SECRET, name=name, role=role, tenant=tenant
        )
        credentials[role] = issued.plaintext
    crud.create_backend(
        session,
        actor="test",
        name="b1",
        base_url="http://10.0.0.1:8000",
        model="m",
        profile=available_profiles()[0],
    )
    at = utcnow() - timedelta(minutes=5)
    rows = [
        row(at, tenant_id=ids["acme"], tier="standard", prompt_tokens=11, completion_tokens=7),
        row(at, tenant_id=ids["globex"], tier="standard", prompt_tokens=13, completion_tokens=5),
    ]
    session.execute(insert(UsageRecord), rows)
    return credentials, {"globex": globex_key.plaintext}, ids


def make_team(url: str, root: Path) -> Iterator[Team]:
    engine, acme_key = seed_database(url, SECRET)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        credentials, keys, ids = _populate(session)
    settings = Settings(
        database_url=url,
        secret=SecretStr(SECRET),
        admin_key=SecretStr(ADMIN_KEY),
        data_dir=root,
        redis_url=None,
    )
    app = create_app(settings, backends=[])
    try:
        with TestClient(app, base_url=BASE) as client:
            yield Team(client, app, factory, credentials, {"acme": acme_key, **keys}, ids)
    finally:
        engine.dispose()


@pytest.fixture
def team(db_url: str, tmp_path: Path) -> Iterator[Team]:
    """On SQLite and on PostgreSQL."""
    yield from make_team(db_url, tmp_path)


@pytest.fixture
def sqlite_team(sqlite_url: str, tmp_path: Path) -> Iterator[Team]:
    """On SQLite only: for checks of HTTP answers rather than of the database."""
    yield from make_team(sqlite_url, tmp_path)


def routes_of(app: FastAPI, prefix: str) -> list[tuple[str, str]]:
    """``(method, path)`` of every route the app serves under ``prefix``, from its route table
    (included routers opened; HEAD left out: it is answered as GET)."""
    found: list[tuple[str, str]] = []
    for route in app.routes:
        contexts: Callable[[], Any] | None = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            items = [(c.path, c.methods) for c in contexts()]
        else:
            items = [(getattr(route, "path", ""), getattr(route, "methods", None))]
        for path, methods in items:
            if path.startswith(prefix):
                found += [(m, path) for m in sorted(methods or ()) if m != "HEAD"]
    return found
