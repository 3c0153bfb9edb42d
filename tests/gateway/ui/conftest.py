"""The whole gateway app with its dashboard, on SQLite and PostgreSQL, through HTTP.

:class:`UI` drives the pages as a browser's form posts would (``TestClient``: the real app,
its lifespan, the real database); :mod:`tests.browser` drives them in a real browser.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.app.app import create_app
from gateway.db.crud import operators
from gateway.db.models import AuditLog
from gateway.db.session import make_session_factory
from gateway.settings import Settings
from tests.gateway.seeded_app import seed_database

SECRET = "ui-tests-server-secret-1f2e3d"
ADMIN_KEY = "ui-tests-admin-key-9a8b7c"
BASE = "http://testserver"

_ERROR = re.compile(r'id="error-([\w-]+)" role="alert">([^<]*)<')
_CSRF = re.compile(r'<meta name="csrf-token" content="([^"]*)">')


@dataclass
class UI:
    """A browser-like client of one gateway, and the database behind it."""

    client: TestClient
    app: FastAPI
    factory: sessionmaker[Session]
    credential: str  # the stored operator credential
    tenant_key: str  # tenant acme's API key

    def sign_in(self, credential: str | None = None, **extra: str) -> httpx.Response:
        data = {"credential": credential if credential is not None else self.credential, **extra}
        return self.client.post("/ui/login", data=data, follow_redirects=False)

    def csrf(self) -> str:
        match = _CSRF.search(self.client.get("/ui/tiers").text)
        assert match is not None and match.group(1), "no CSRF token on a signed-in page"
        return match.group(1)

    def post(self, path: str, data: dict[str, Any] | None = None, *, csrf: bool = True) -> Any:
        body = dict(data or {})
        if csrf:
            body["csrf_token"] = self.csrf()
        return self.client.post(path, data=body, follow_redirects=False)

    def audit(self) -> list[AuditLog]:
        with self.factory() as session:
            return list(session.scalars(select(AuditLog).order_by(AuditLog.id)))


def field_errors(response: httpx.Response) -> dict[str, str]:
    """``{field: message}`` of the errors shown beside the form's fields."""
    return {name: html.unescape(text) for name, text in _ERROR.findall(response.text)}


def flash(response: httpx.Response) -> str | None:
    match = re.search(r'id="flash">([^<]*)<', response.text)
    return html.unescape(match.group(1)) if match else None


def make_ui(
    url: str, root: Path, *, admin_key: str | None = ADMIN_KEY, **overrides: Any
) -> Iterator[UI]:
    engine, tenant_key = seed_database(url, SECRET)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        credential = operators.create_credential(session, actor="test", secret=SECRET).plaintext
    settings = Settings(
        database_url=url,
        secret=SecretStr(SECRET),
        admin_key=SecretStr(admin_key) if admin_key else None,
        data_dir=root,
        redis_url=None,
        **overrides,
    )
    app = create_app(settings, backends=[])
    try:
        with TestClient(app, base_url=BASE) as client:
            yield UI(client, app, factory, credential, tenant_key)
    finally:
        engine.dispose()


@pytest.fixture
def ui(db_url: str, tmp_path: Path) -> Iterator[UI]:
    """The app on SQLite and on PostgreSQL, nobody signed in."""
    yield from make_ui(db_url, tmp_path)


@pytest.fixture
def sqlite_ui(sqlite_url: str, tmp_path: Path) -> Iterator[UI]:
    """The app on SQLite only, for checks that are about HTTP rather than the database."""
    yield from make_ui(sqlite_url, tmp_path)


@pytest.fixture
def signed_in(ui: UI) -> UI:
    """:func:`ui`, signed in with the operator credential."""
    assert ui.sign_in().status_code == 303
    return ui
