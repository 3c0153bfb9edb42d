"""The admin API over a real database (SQLite and PostgreSQL), through HTTP.

The app here mounts only the admin router, on a stand-in gateway state: the real session
factory and secret, with recording fakes for the two side effects the API has on a running
gateway (``auth.invalidate`` and ``pool.reload``). :class:`Admin` is what the fixtures in
``conftest.py`` hand to the tests: a client with the admin key, and shortcuts to create rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from gateway.app.admin import build_admin_router
from gateway.settings import Settings
from priority.profiles import available_profiles

ADMIN_KEY = "admin-secret-for-tests"
PREFIX = "/admin/v1"
ACTOR = "admin-api:admin-key@testclient"  # the admin key's holder, TestClient's host


class FakeAuthCache:
    """Records ``invalidate`` calls (None = everything)."""

    def __init__(self) -> None:
        self.invalidated: list[str | None] = []

    def invalidate(self, key_prefix: str | None = None) -> None:
        self.invalidated.append(key_prefix)


class FakeBackendPool:
    """Counts ``reload`` calls; routes to nothing (``GET /backends`` lists the table's rows)."""

    reads_database = True

    def __init__(self) -> None:
        self.reloads = 0
        self.backends: list[Any] = []

    async def reload(self) -> None:
        self.reloads += 1


@dataclass
class FakeGatewayState:
    """What the admin API reads from ``app.state.gateway``, with fakes for the side effects."""

    settings: Settings
    session_factory: sessionmaker[Session]
    secret: str
    auth: FakeAuthCache = field(default_factory=FakeAuthCache)
    pool: FakeBackendPool = field(default_factory=FakeBackendPool)


@dataclass
class Admin:
    client: TestClient
    state: FakeGatewayState

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        response = self.client.request(method, PREFIX + path, json=body, params=params or None)
        return response

    def ok(self, method: str, path: str, body: Any = None, expect: int = 200, **params: Any) -> Any:
        response = self.call(method, path, body, **params)
        assert response.status_code == expect, response.text
        return response.json()

    def tier(self, name: str = "gold", **overrides: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": name, "weight": 3.0, "ttft_ms": 800.0, "tpot_ms": 40.0}
        spec.update(overrides)
        return dict(self.ok("POST", "/tiers", spec, expect=201))

    def tenant(self, name: str = "acme", tier: Any = "gold", **extra: Any) -> dict[str, Any]:
        return dict(self.ok("POST", "/tenants", {"name": name, "tier": tier, **extra}, expect=201))

    def key(self, tenant: str = "acme", **extra: Any) -> dict[str, Any]:
        return dict(self.ok("POST", "/keys", {"tenant": tenant, **extra}, expect=201))

    def backend(self, name: str = "b1", **overrides: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": name,
            "base_url": "http://10.0.0.1:8000/",
            "model": "qwen2-7b",
            "profile": available_profiles()[0],
        }
        spec.update(overrides)
        return dict(self.ok("POST", "/backends", spec, expect=201))

    def audit(self, **filters: Any) -> list[dict[str, Any]]:
        return list(self.ok("GET", "/audit", **filters)["data"])


def admin_app(state: FakeGatewayState) -> FastAPI:
    app = FastAPI()
    app.state.gateway = state
    app.include_router(build_admin_router(), prefix=PREFIX)
    return app


@contextmanager
def running_admin(session_factory: sessionmaker[Session], secret: str) -> Iterator[Admin]:
    state = FakeGatewayState(
        settings=Settings(admin_key=SecretStr(ADMIN_KEY)),
        session_factory=session_factory,
        secret=secret,
    )
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with TestClient(admin_app(state), headers=headers) as client:
        yield Admin(client, state)


def error(response: Any, status: int) -> dict[str, Any]:
    """The OpenAI-shaped error of ``response``, after checking its status and shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return dict(body["error"])
