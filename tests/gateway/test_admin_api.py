"""The admin REST API over a real database (SQLite and PostgreSQL), through HTTP.

The app here mounts only the admin router, on a stand-in gateway state: the real session
factory and secret, with recording fakes for the two side effects the API has on a running
gateway (``auth.invalidate`` and ``pool.reload``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.app.admin import build_admin_router
from gateway.db import crud
from gateway.db.models import ApiKey, AuditLog, Base, UsageRecord, utcnow
from gateway.db.security import hash_key
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from priority.profiles import available_profiles, load_profile

ADMIN_KEY = "admin-secret-for-tests"
PREFIX = "/admin/v1"
ACTOR = "admin-api:testclient"  # TestClient's client host


class FakeAuthCache:
    """Records ``invalidate`` calls (None = everything)."""

    def __init__(self) -> None:
        self.invalidated: list[str | None] = []

    def invalidate(self, key_prefix: str | None = None) -> None:
        self.invalidated.append(key_prefix)


class FakeBackendPool:
    """Counts ``reload`` calls."""

    def __init__(self) -> None:
        self.reloads = 0

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


def _app(state: FakeGatewayState) -> FastAPI:
    app = FastAPI()
    app.state.gateway = state
    app.include_router(build_admin_router(), prefix=PREFIX)
    return app


@contextmanager
def _admin(session_factory: sessionmaker[Session], secret: str) -> Iterator[Admin]:
    state = FakeGatewayState(
        settings=Settings(admin_key=SecretStr(ADMIN_KEY)),
        session_factory=session_factory,
        secret=secret,
    )
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with TestClient(_app(state), headers=headers) as client:
        yield Admin(client, state)


@pytest.fixture
def admin(session_factory: sessionmaker[Session], server_secret: str) -> Iterator[Admin]:
    """The admin API on SQLite and on PostgreSQL."""
    with _admin(session_factory, server_secret) as a:
        yield a


@pytest.fixture
def sqlite_admin(sqlite_url: str, server_secret: str) -> Iterator[Admin]:
    """The admin API on SQLite only, for checks that end before the database is touched."""
    engine = make_engine(sqlite_url)
    Base.metadata.create_all(engine)
    try:
        with _admin(make_session_factory(engine), server_secret) as a:
            yield a
    finally:
        engine.dispose()


def _error(response: Any, status: int) -> dict[str, Any]:
    """The OpenAI-shaped error of ``response``, after checking its status and shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return dict(body["error"])


def _tier(admin: Admin, name: str = "gold", **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "weight": 3.0, "ttft_ms": 800.0, "tpot_ms": 40.0}
    spec.update(overrides)
    return dict(admin.ok("POST", "/tiers", spec, expect=201))


def _tenant(admin: Admin, name: str = "acme", tier: Any = "gold", **extra: Any) -> dict[str, Any]:
    return dict(admin.ok("POST", "/tenants", {"name": name, "tier": tier, **extra}, expect=201))


def _key(admin: Admin, tenant: str = "acme", **extra: Any) -> dict[str, Any]:
    return dict(admin.ok("POST", "/keys", {"tenant": tenant, **extra}, expect=201))


def _backend(admin: Admin, name: str = "b1", **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "base_url": "http://10.0.0.1:8000/",
        "model": "qwen2-7b",
        "profile": available_profiles()[0],
    }
    spec.update(overrides)
    return dict(admin.ok("POST", "/backends", spec, expect=201))


def _audit(admin: Admin, **filters: Any) -> list[dict[str, Any]]:
    return list(admin.ok("GET", "/audit", **filters)["data"])


# -- auth -------------------------------------------------------------------------------------


def test_requests_without_the_admin_key_get_401_and_change_nothing(admin: Admin) -> None:
    admin.client.headers.pop("Authorization")
    spec = {"name": "gold", "weight": 3.0, "ttft_ms": 800.0, "tpot_ms": 40.0}
    for authorization in [
        None,
        "Bearer wrong-key",
        f"Basic {ADMIN_KEY}",
        f"Bearer {ADMIN_KEY}x",
        f"Bearer {ADMIN_KEY[:-1]}",
        "Bearer ",
    ]:
        headers = {"Authorization": authorization} if authorization is not None else {}
        response = admin.client.post(f"{PREFIX}/tiers", json=spec, headers=headers)
        err = _error(response, 401)
        assert err["code"] == "invalid_admin_key", authorization
        assert response.headers["www-authenticate"] == "Bearer"
        assert ADMIN_KEY not in response.text
    with admin.state.session_factory() as s:
        assert crud.list_tiers(s) == []


def test_auth_is_checked_before_the_body_is_parsed(sqlite_admin: Admin) -> None:
    sqlite_admin.client.headers.pop("Authorization")
    response = sqlite_admin.client.post(
        f"{PREFIX}/tiers", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert _error(response, 401)["code"] == "invalid_admin_key"


def test_every_route_requires_the_admin_key(sqlite_admin: Admin) -> None:
    routes = [r for r in build_admin_router().routes if isinstance(r, APIRoute)]
    assert len(routes) >= 20
    sqlite_admin.client.headers.pop("Authorization")
    for route in routes:
        path = PREFIX + route.path.replace("{ref}", "x").replace("{prefix}", "x")
        for method in route.methods or ():
            response = sqlite_admin.client.request(method, path, json={})
            assert response.status_code == 401, (method, path, response.text)


def test_without_a_configured_admin_key_the_api_is_disabled_with_403(sqlite_admin: Admin) -> None:
    for configured in (None, SecretStr("")):
        sqlite_admin.state.settings = Settings(admin_key=configured)
        err = _error(sqlite_admin.call("GET", "/tiers"), 403)
        assert "TIERGATE_ADMIN_KEY" in err["message"]
        assert err["code"] == "admin_api_disabled"
        # Even the "right" (empty) bearer token must not open it.
        response = sqlite_admin.client.get(f"{PREFIX}/tiers", headers={"Authorization": "Bearer "})
        assert response.status_code == 403


def test_openapi_documents_every_route_with_the_bearer_scheme() -> None:
    app = FastAPI()
    app.include_router(build_admin_router(), prefix=PREFIX)
    schema = app.openapi()
    assert schema["components"]["securitySchemes"]["admin key"]["scheme"] == "bearer"
    expected = {PREFIX + r.path for r in build_admin_router().routes if isinstance(r, APIRoute)}
    assert set(schema["paths"]) == expected
    assert "401" in schema["paths"][f"{PREFIX}/keys"]["post"]["responses"]


# -- tiers ------------------------------------------------------------------------------------


def test_tier_crud_by_name_and_id(admin: Admin) -> None:
    gold = _tier(admin, rpm_limit=60, description="paying customers")
    assert gold["object"] == "tier" and gold["rpm_limit"] == 60 and gold["tpm_limit"] is None
    _tier(admin, "free", weight=1.0)
    assert admin.ok("GET", "/tiers/gold") == gold
    assert admin.ok("GET", f"/tiers/{gold['id']}") == gold
    listed = admin.ok("GET", "/tiers")
    assert listed["object"] == "list"
    assert [t["name"] for t in listed["data"]] == ["gold", "free"]  # most important first

    patched = admin.ok("PATCH", "/tiers/gold", {"weight": 5, "rpm_limit": None})
    assert (patched["weight"], patched["rpm_limit"]) == (5.0, None)
    assert patched["description"] == "paying customers"  # untouched: not sent
    assert admin.state.auth.invalidated == [None]  # every identity on the tier is stale

    deleted = admin.ok("DELETE", f"/tiers/{gold['id']}")
    assert deleted == {"object": "tier", "id": gold["id"], "name": "gold", "deleted": True}
    err = _error(admin.call("GET", "/tiers/gold"), 404)
    assert err["code"] == "not_found" and err["param"] == "tier"


def test_noop_tier_patch_neither_audits_nor_invalidates(admin: Admin) -> None:
    _tier(admin)
    admin.ok("PATCH", "/tiers/gold", {"weight": 3.0})
    assert admin.state.auth.invalidated == []
    assert [e["action"] for e in _audit(admin, entity_type="tier")] == ["create"]


def test_a_digit_name_wins_over_an_id(admin: Admin) -> None:
    first = _tier(admin, "first")
    named = _tier(admin, str(first["id"]), weight=9.0)
    assert admin.ok("GET", f"/tiers/{first['id']}")["id"] == named["id"]
    _error(admin.call("GET", "/tiers/99999999999999999999"), 404)  # beyond any id: no 500


def test_tier_conflicts(admin: Admin) -> None:
    _tier(admin)
    _tier(admin, "free", weight=1.0)
    assert (
        _error(
            admin.call(
                "POST", "/tiers", {"name": "gold", "weight": 1.0, "ttft_ms": 1.0, "tpot_ms": 1.0}
            ),
            409,
        )["code"]
        == "already_exists"
    )
    err = _error(admin.call("PATCH", "/tiers/free", {"name": "gold"}), 409)
    assert (err["code"], err["param"]) == ("already_exists", "name")
    _tenant(admin)
    err = _error(admin.call("DELETE", "/tiers/gold"), 409)
    assert err["code"] == "in_use" and "1 tenant" in err["message"]


INVALID_TIERS: list[tuple[dict[str, Any], str, str]] = [
    ({"weight": 0}, "weight", "invalid_input"),  # the data layer's rule
    ({"weight": "3"}, "weight", "float_type"),  # no coercion from strings
    ({"weight": True}, "weight", "float_type"),
    ({"rpm_limit": 2.5}, "rpm_limit", "int_type"),
    ({"rpm_limit": 0}, "rpm_limit", "invalid_input"),
    ({"rpm_limit": 2**40}, "rpm_limit", "less_than_equal"),  # would overflow PostgreSQL's int
    ({"min_ttft_ms": 900.0}, "min_ttft_ms", "invalid_input"),  # above the default 800
    ({"name": "bad name"}, "name", "invalid_input"),
    ({"colour": "gold"}, "colour", "extra_forbidden"),
]


def test_invalid_tier_input_is_422_naming_the_field(admin: Admin) -> None:
    for body, param, code in INVALID_TIERS:
        spec = {"name": "gold", "weight": 3.0, "ttft_ms": 800.0, "tpot_ms": 40.0, **body}
        err = _error(admin.call("POST", "/tiers", spec), 422)
        assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error")
    assert admin.ok("GET", "/tiers")["data"] == []
    _tier(admin)
    for body, param, code in INVALID_TIERS:
        err = _error(admin.call("PATCH", "/tiers/gold", body), 422)
        assert (err["param"], err["code"]) == (param, code), body
    assert [e["action"] for e in _audit(admin)] == ["create"]


def test_missing_fields_malformed_json_and_non_objects(admin: Admin) -> None:
    err = _error(admin.call("POST", "/tiers", {"name": "gold", "weight": 1.0}), 422)
    assert (err["param"], err["code"]) == ("ttft_ms", "missing")
    assert "more error" in err["message"]  # tpot_ms is missing too
    response = admin.client.post(
        f"{PREFIX}/tiers", content=b'{"name": "gold",', headers={"content-type": "application/json"}
    )
    assert _error(response, 400)["code"] == "invalid_json"
    assert _error(admin.call("POST", "/tiers", [1, 2]), 422)["param"] == "body"
    assert _error(admin.call("PATCH", "/tiers/gold", {"weight": None}), 404)["param"] == "tier"
    _tier(admin)
    err = _error(admin.call("PATCH", "/tiers/gold", {"weight": None}), 422)
    assert err["param"] == "weight"  # null only clears optional fields


_JSON_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=80)
    | st.lists(st.integers(), max_size=2)
)
_TIER_FIELDS = ["name", "weight", "ttft_ms", "tpot_ms", "rpm_limit", "deadline_ms", "x"]


def test_no_tier_body_produces_a_server_error(admin: Admin) -> None:
    """Whatever JSON object arrives, the answer is 201 or an OpenAI-shaped 4xx, never a 500.

    (TestClient re-raises a server-side exception, so a 500 fails loudly here.)
    """
    _tier(admin, "target")
    headers = {"content-type": "application/json"}

    @settings(max_examples=40, deadline=None, derandomize=True)
    @given(body=st.dictionaries(st.sampled_from(_TIER_FIELDS), _JSON_VALUES))
    def check(body: dict[str, Any]) -> None:
        # Python's json writes (and FastAPI reads) NaN and Infinity: they must be refused too.
        content = json.dumps(body)
        response = admin.client.post(f"{PREFIX}/tiers", content=content, headers=headers)
        if response.status_code != 201:
            assert 400 <= _error_status(response) < 500
        response = admin.client.patch(f"{PREFIX}/tiers/target", content=content, headers=headers)
        if response.status_code != 200:
            assert 400 <= _error_status(response) < 500

    check()


def _error_status(response: Any) -> int:
    _error(response, response.status_code)
    return int(response.status_code)


# -- tenants ----------------------------------------------------------------------------------


def test_tenant_crud_overrides_and_effective_policy(admin: Admin) -> None:
    gold = _tier(admin, min_ttft_ms=200.0, rpm_limit=60)
    _tier(admin, "free", weight=1.0, ttft_ms=5000.0)
    acme = _tenant(admin, tier=gold["id"], ttft_ms=300.0)
    assert (acme["object"], acme["tier"], acme["status"]) == ("tenant", "gold", "active")
    assert acme["effective"]["ttft_ms"] == 300.0 and acme["effective"]["rpm_limit"] == 60
    assert admin.ok("GET", f"/tenants/{acme['id']}") == admin.ok("GET", "/tenants/acme")

    err = _error(admin.call("PATCH", "/tenants/acme", {"ttft_ms": 100.0}), 422)
    assert err["param"] == "ttft_ms" and "tighter" in err["message"]
    patched = admin.ok("PATCH", "/tenants/acme", {"rpm_limit": 10, "ttft_ms": None})
    assert patched["effective"]["rpm_limit"] == 10 and patched["effective"]["ttft_ms"] == 800.0
    moved = admin.ok("PATCH", "/tenants/acme", {"tier": "free", "name": "acme2"})
    assert (moved["tier"], moved["name"], moved["effective"]["weight"]) == ("free", "acme2", 1.0)
    assert _error(admin.call("PATCH", "/tenants/acme2", {"tier": None}), 422)["param"] == "tier"
    assert _error(admin.call("PATCH", "/tenants/acme2", {"tier": "nope"}), 404)["param"] == "tier"
    assert (
        _error(admin.call("PATCH", "/tenants/acme2", {"status": "suspended"}), 422)["code"]
        == "extra_forbidden"
    )  # status changes through the audited actions only


def test_tenant_conflicts_and_bad_references(admin: Admin) -> None:
    _tier(admin)
    _tenant(admin)
    assert (
        _error(admin.call("POST", "/tenants", {"name": "acme", "tier": "gold"}), 409)["code"]
        == "already_exists"
    )
    err = _error(admin.call("POST", "/tenants", {"name": "x", "tier": "platinum"}), 404)
    assert err["param"] == "tier"
    assert _error(admin.call("POST", "/tenants", {"name": "x", "tier": 0}), 422)["param"] == "tier"
    err = _error(admin.call("POST", "/tenants", {"name": "x", "tier": "gold", "status": "?"}), 422)
    assert err["param"] == "status"


def test_tenant_list_filters(admin: Admin) -> None:
    _tier(admin)
    _tier(admin, "free", weight=1.0)
    for name, tier in [("a", "gold"), ("b", "free"), ("c", "gold")]:
        _tenant(admin, name, tier)
    admin.ok("POST", "/tenants/c/suspend")

    def names(**q: Any) -> list[str]:
        return [t["name"] for t in admin.ok("GET", "/tenants", **q)["data"]]

    assert names() == ["a", "b", "c"]
    assert names(tier="gold") == ["a", "c"]
    assert names(tier="gold", status="active") == ["a"]
    assert names(status="suspended") == ["c"]
    assert _error(admin.call("GET", "/tenants", status="gone"), 422)["param"] == "status"
    assert _error(admin.call("GET", "/tenants", tier="nope"), 404)["param"] == "tier"


def test_suspend_and_activate_invalidate_the_tenants_keys_at_once(admin: Admin) -> None:
    _tier(admin)
    _tenant(admin)
    keys = [_key(admin), _key(admin)]
    bare = sorted(k["prefix"].removeprefix("tg-") for k in keys)
    suspended = admin.ok("POST", "/tenants/acme/suspend")
    assert suspended["status"] == "suspended"
    assert sorted(p for p in admin.state.auth.invalidated if p is not None) == bare
    with admin.state.session_factory() as s:
        assert crud.authenticate(s, admin.state.secret, keys[0]["key"], touch=False) is None
    admin.state.auth.invalidated.clear()
    assert admin.ok("POST", "/tenants/acme/activate")["status"] == "active"
    assert sorted(p for p in admin.state.auth.invalidated if p is not None) == bare
    with admin.state.session_factory() as s:
        assert crud.authenticate(s, admin.state.secret, keys[0]["key"], touch=False) is not None
    actions = [e["action"] for e in _audit(admin, entity_type="tenant")]
    assert actions == ["activate", "suspend", "create"]


def test_deleting_a_tenant_deletes_its_keys_and_invalidates_them(admin: Admin) -> None:
    _tier(admin)
    acme = _tenant(admin)
    key = _key(admin)
    deleted = admin.ok("DELETE", "/tenants/acme")
    assert deleted == {"object": "tenant", "id": acme["id"], "name": "acme", "deleted": True}
    assert admin.state.auth.invalidated == [key["prefix"].removeprefix("tg-")]
    assert admin.ok("GET", "/keys")["data"] == []
    _error(admin.call("DELETE", "/tenants/acme"), 404)


# -- keys -------------------------------------------------------------------------------------


def test_key_plaintext_is_shown_once_and_stored_nowhere(admin: Admin) -> None:
    _tier(admin)
    _tenant(admin)
    created = _key(admin, name="ci")
    plaintext = created["key"]
    assert plaintext.startswith(created["prefix"] + "-")
    assert (created["tenant"], created["name"], created["status"]) == ("acme", "ci", "active")

    listed = admin.call("GET", "/keys")
    one = admin.call("GET", f"/keys/{created['prefix']}")
    audit = admin.call("GET", "/audit")
    for response in (listed, one, audit):
        assert response.status_code == 200
        assert plaintext not in response.text
        assert "key_hash" not in response.text
    assert "key" not in listed.json()["data"][0]
    assert {k: v for k, v in created.items() if k != "key"} == one.json()

    with admin.state.session_factory() as s:
        row = s.scalars(select(ApiKey)).one()
        stored = json.dumps([getattr(row, c.key) for c in ApiKey.__table__.columns], default=str)
        stored += json.dumps([(a.before, a.after) for a in s.scalars(select(AuditLog))])
        assert plaintext not in stored
        assert row.key_hash == hash_key(admin.state.secret, plaintext)
        identity = crud.authenticate(s, admin.state.secret, plaintext, touch=False)
        assert identity is not None and identity.tenant_name == "acme"


def test_revoke_invalidates_and_is_idempotent(admin: Admin) -> None:
    _tier(admin)
    _tenant(admin)
    key = _key(admin)
    bare = key["prefix"].removeprefix("tg-")
    revoked = admin.ok("POST", f"/keys/{key['prefix']}/revoke")
    assert revoked["status"] == "revoked" and revoked["revoked_at"] is not None
    assert admin.state.auth.invalidated == [bare]
    with admin.state.session_factory() as s:
        assert crud.authenticate(s, admin.state.secret, key["key"], touch=False) is None
    again = admin.ok("POST", f"/keys/{bare}/revoke")  # the bare prefix works too
    assert again["revoked_at"] == revoked["revoked_at"]
    assert [e["action"] for e in _audit(admin, entity_type="api_key")] == ["revoke", "create"]
    _error(admin.call("POST", "/keys/tg-00000000/revoke"), 404)


def test_key_listing_filters_update_and_delete(admin: Admin) -> None:
    _tier(admin)
    _tenant(admin)
    _tenant(admin, "globex")
    a, b = _key(admin), _key(admin, "globex")
    admin.ok("POST", f"/keys/{b['prefix']}/revoke")

    def prefixes(**q: Any) -> set[str]:
        return {k["prefix"] for k in admin.ok("GET", "/keys", **q)["data"]}

    assert prefixes() == {a["prefix"], b["prefix"]}
    assert prefixes(tenant="globex") == {b["prefix"]}
    assert prefixes(active_only=True) == {a["prefix"]}

    past = (utcnow() - timedelta(minutes=1)).isoformat()
    admin.state.auth.invalidated.clear()
    expired = admin.ok("PATCH", f"/keys/{a['prefix']}", {"expires_at": past, "name": "old"})
    assert (expired["status"], expired["name"]) == ("expired", "old")
    assert admin.state.auth.invalidated == [a["prefix"].removeprefix("tg-")]
    assert prefixes(active_only=True) == set()

    admin.state.auth.invalidated.clear()
    deleted = admin.ok("DELETE", f"/keys/{a['prefix']}")
    assert deleted == {"object": "api_key", "id": a["id"], "name": a["prefix"], "deleted": True}
    assert admin.state.auth.invalidated == [a["prefix"].removeprefix("tg-")]
    _error(admin.call("GET", f"/keys/{a['prefix']}"), 404)


def test_key_creation_errors(admin: Admin) -> None:
    _tier(admin)
    _tenant(admin)
    assert _error(admin.call("POST", "/keys", {"tenant": "nope"}), 404)["param"] == "tenant"
    naive = datetime.now().replace(microsecond=0).isoformat()
    err = _error(admin.call("POST", "/keys", {"tenant": "acme", "expires_at": naive}), 422)
    assert err["param"] == "expires_at"
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    err = _error(admin.call("POST", "/keys", {"tenant": "acme", "expires_at": past}), 422)
    assert (err["param"], err["code"]) == ("expires_at", "invalid_input")
    assert admin.ok("GET", "/keys")["data"] == []


# -- backends ---------------------------------------------------------------------------------


def test_backend_crud_reloads_the_pool(admin: Admin) -> None:
    b1 = _backend(admin)
    assert b1["base_url"] == "http://10.0.0.1:8000" and b1["enabled"] and b1["kind"] == "vllm"
    assert admin.state.pool.reloads == 1
    _backend(admin, "b2", model="llama")
    assert admin.state.pool.reloads == 2
    assert admin.ok("GET", f"/backends/{b1['id']}") == admin.ok("GET", "/backends/b1")

    disabled = admin.ok("PATCH", "/backends/b1", {"enabled": False})
    assert disabled["enabled"] is False and admin.state.pool.reloads == 3
    admin.ok("PATCH", "/backends/b1", {"enabled": False})  # no change: no reload
    assert admin.state.pool.reloads == 3

    def names(**q: Any) -> list[str]:
        return [b["name"] for b in admin.ok("GET", "/backends", **q)["data"]]

    assert names() == ["b1", "b2"]
    assert names(enabled=True) == ["b2"]
    assert names(model="qwen2-7b") == ["b1"]

    assert admin.ok("DELETE", "/backends/b1")["deleted"] is True
    assert admin.state.pool.reloads == 4
    assert names() == ["b2"]


def test_invalid_backends_are_422_and_do_not_reload(admin: Admin) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"profile": "no-such-profile"}, "profile"),
        ({"base_url": "ftp://x"}, "base_url"),
        ({"kind": "tgi"}, "kind"),
        ({"model": ""}, "model"),
        ({"enabled": "yes"}, "enabled"),
    ]
    spec = {"name": "b1", "base_url": "http://h:1", "model": "m"}
    spec["profile"] = available_profiles()[0]
    for body, param in cases:
        assert _error(admin.call("POST", "/backends", {**spec, **body}), 422)["param"] == param
    assert admin.state.pool.reloads == 0
    admin.ok("POST", "/backends", spec, expect=201)
    for body, param in cases:
        assert _error(admin.call("PATCH", "/backends/b1", body), 422)["param"] == param
    assert admin.state.pool.reloads == 1


def test_backend_conflicts_and_missing(admin: Admin) -> None:
    _backend(admin)
    _backend(admin, "b2")
    assert _error(admin.call("PATCH", "/backends/b2", {"name": "b1"}), 409)["param"] == "name"
    spec = {
        "name": "b1",
        "base_url": "http://h:1",
        "model": "m",
        "profile": available_profiles()[0],
    }
    assert _error(admin.call("POST", "/backends", spec), 409)["code"] == "already_exists"
    assert _error(admin.call("DELETE", "/backends/b9"), 404)["param"] == "backend"
    assert admin.state.pool.reloads == 2


# -- profiles ---------------------------------------------------------------------------------


def _calibrated(name: str = "site-a100") -> dict[str, Any]:
    """An operator's measured profile document: a shipped one, re-measured and renamed."""
    document = load_profile("a100-qwen2-7b").to_dict()
    document["engine"] = {**document["engine"], "max_num_seqs": 7}
    return {**document, "name": name, "hardware": "site A100"}


def test_profile_round_trip(admin: Admin) -> None:
    created = admin.ok("POST", "/profiles", {"document": _calibrated()}, expect=201)
    assert (created["object"], created["name"], created["source"]) == (
        "latency_profile",
        "site-a100",
        "custom",
    )
    assert created["document"] == _calibrated() and created["created_by"] == ACTOR
    assert (created["hardware"], created["model"], created["tensor_parallel"]) == (
        "site A100",
        "Qwen2-7B",
        1,
    )
    renamed = admin.ok(
        "POST", "/profiles", {"document": _calibrated(), "name": "site-a100-b"}, expect=201
    )
    assert renamed["document"]["name"] == "site-a100-b"

    listed = {p["name"]: p for p in admin.ok("GET", "/profiles")["data"]}
    assert set(listed) == {*available_profiles(), "site-a100", "site-a100-b"}
    assert "document" not in listed["site-a100"]
    assert listed["site-a100"]["id"] == created["id"]
    shipped = listed["a100-qwen2-7b"]
    assert (shipped["source"], shipped["id"], shipped["created_by"]) == ("shipped", None, None)

    assert admin.ok("GET", "/profiles/site-a100") == created
    assert admin.ok("GET", f"/profiles/{created['id']}") == created
    one_shipped = admin.ok("GET", "/profiles/a100-qwen2-7b")
    assert one_shipped["document"] == load_profile("a100-qwen2-7b").to_dict()

    _backend(admin, profile="site-a100")
    in_use = _error(admin.call("DELETE", "/profiles/site-a100"), 409)
    assert (in_use["code"], in_use["param"]) == ("in_use", "profile")
    assert "used by backend(s) b1" in in_use["message"]
    admin.ok("DELETE", "/backends/b1")
    deleted = admin.ok("DELETE", f"/profiles/{created['id']}")
    assert deleted == {"object": "latency_profile", "id": created["id"], "name": "site-a100",
                       "deleted": True}  # fmt: skip
    assert _error(admin.call("GET", "/profiles/site-a100"), 404)["param"] == "profile"
    assert admin.state.pool.reloads == 2  # the backend's create and delete; profiles need none
    actions = [e["action"] for e in _audit(admin, entity_type="profile")]
    assert actions == ["delete", "create", "create"]


def test_invalid_profiles_are_refused_with_the_admin_error_conventions(admin: Admin) -> None:
    shipped = load_profile("a100-qwen2-7b").to_dict()
    for body, status, code, param in [
        ({"document": shipped}, 409, "already_exists", "name"),
        ({"document": _calibrated(), "name": "a100-qwen2-7b"}, 409, "already_exists", "name"),
        ({"document": {**_calibrated(), "coefficients": {}}}, 422, "invalid_input", "document"),
        ({"document": _calibrated("no spaces allowed")}, 422, "invalid_input", "name"),
        ({"document": [1, 2]}, 422, "dict_type", "document"),
        ({"document": _calibrated(), "extra": 1}, 422, "extra_forbidden", "extra"),
        ({"name": "x"}, 422, "missing", "document"),
    ]:
        err = _error(admin.call("POST", "/profiles", body), status)
        assert (err["code"], err["param"]) == (code, param), body
    admin.ok("POST", "/profiles", {"document": _calibrated()}, expect=201)
    err = _error(admin.call("POST", "/profiles", {"document": _calibrated()}), 409)
    assert err["message"] == "profile 'site-a100' already exists"
    err = _error(admin.call("DELETE", "/profiles/a100-qwen2-7b"), 409)
    assert err["code"] == "conflict" and "shipped with tiergate" in err["message"]
    assert _error(admin.call("DELETE", "/profiles/nope"), 404)["code"] == "not_found"
    assert [p["name"] for p in admin.ok("GET", "/profiles")["data"] if p["source"] == "custom"] == [
        "site-a100"
    ]


def test_backends_name_stored_profiles(admin: Admin) -> None:
    unknown = _error(
        admin.call("POST", "/backends", {"name": "b1", "base_url": "http://h:1", "model": "m",
                                         "profile": "site-a100"}),
        422,
    )  # fmt: skip
    assert unknown["param"] == "profile" and "unknown profile 'site-a100'" in unknown["message"]
    admin.ok("POST", "/profiles", {"document": _calibrated()}, expect=201)
    admin.ok("POST", "/profiles", {"document": _calibrated("site-h100")}, expect=201)
    assert _backend(admin, profile="site-a100")["profile"] == "site-a100"
    patched = admin.ok("PATCH", "/backends/b1", {"profile": "site-h100"})
    assert patched["profile"] == "site-h100"


# -- usage ------------------------------------------------------------------------------------


def _seed_usage(admin: Admin) -> tuple[datetime, list[UsageRecord]]:
    """Records for two tenants over the last hours (and one a day old); returns now and them."""
    _tier(admin)
    _tier(admin, "free", weight=1.0)
    acme, globex = _tenant(admin), _tenant(admin, "globex", "free")
    now = utcnow()
    spec = [
        # tenant, tier, age (h), status, prompt, completion, slo_met, gain, ideal
        (acme, "gold", 0.5, "ok", 100, 50, True, 3.0, 3.0),
        (acme, "gold", 1.5, "ok", 200, 20, False, 1.0, 3.0),
        (acme, "gold", 0.1, "rejected", 30, 0, False, 0.0, 3.0),
        (globex, "free", 0.2, "ok", 10, 5, True, 1.0, 1.0),
        (globex, "free", 0.3, "error", 10, 0, False, 0.0, 1.0),
        (globex, "free", 30.0, "ok", 999, 999, True, 1.0, 1.0),
    ]
    rows = [
        UsageRecord(
            request_id=f"r{i}",
            tenant_id=t["id"],
            tier=tier,
            status=status,
            prompt_tokens=p,
            completion_tokens=c,
            slo_met=met,
            gain=g,
            ideal_gain=ideal,
            created_at=now - timedelta(hours=age),
        )
        for i, (t, tier, age, status, p, c, met, g, ideal) in enumerate(spec)
    ]
    with admin.state.session_factory.begin() as s:
        s.add_all(rows)
    return now, rows


def _expected(rows: list[UsageRecord], since: datetime, until: datetime | None, key: Any) -> Any:
    """Totals per group computed straight from the seeded rows."""
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        if r.created_at < since or (until is not None and r.created_at >= until):
            continue
        g = out.setdefault(
            key(r), {"requests": 0, "tokens": 0, "met": 0, "gain": 0.0, "ideal": 0.0}
        )
        g["requests"] += 1
        g["tokens"] += r.prompt_tokens + r.completion_tokens
        g["met"] += int(r.slo_met)
        g["gain"] += r.gain
        g["ideal"] += r.ideal_gain
    return out


def test_usage_summaries_per_tenant_and_tier(admin: Admin) -> None:
    now, rows = _seed_usage(admin)
    names = {r.tenant_id: n for n, r in zip(["acme"] * 3 + ["globex"] * 3, rows, strict=True)}
    for path, params, field_name, key in [
        ("/usage/tenants", {}, "tenant", lambda r: names[r.tenant_id]),
        ("/usage/tenants", {"hours": 1}, "tenant", lambda r: names[r.tenant_id]),
        ("/usage/tiers", {"hours": 48}, "tier", lambda r: r.tier),
        ("/usage/tiers", {"hours": 1}, "tier", lambda r: r.tier),
    ]:
        report = admin.ok("GET", path, **params)
        since = datetime.fromisoformat(report["since"])
        hours = params.get("hours", 24)
        assert abs((now - since).total_seconds() - hours * 3600) < 60
        expected = _expected(rows, since, None, key)
        got = {g[field_name]: g for g in report["data"]}
        assert set(got) == set(expected), (path, params)
        for name, e in expected.items():
            g = got[name]
            assert (g["requests"], g["total_tokens"], g["slo_met"]) == (
                e["requests"],
                e["tokens"],
                e["met"],
            )
            assert g["slo_attainment"] == pytest.approx(e["met"] / e["requests"])
            assert g["tdg_ratio"] == pytest.approx(e["gain"] / e["ideal"])


def test_usage_window_by_since_and_until_and_filters(admin: Admin) -> None:
    now, rows = _seed_usage(admin)
    since, until = now - timedelta(hours=1), now - timedelta(minutes=15)
    report = admin.ok(
        "GET", "/usage/tiers", since=since.isoformat(), until=until.isoformat(), tier="free"
    )
    assert datetime.fromisoformat(report["until"]) == until
    expected = _expected(rows, since, until, lambda r: r.tier)
    [free] = report["data"]
    assert (free["tier"], free["requests"]) == ("free", expected["free"]["requests"])
    assert (free["errors"], free["ok"]) == (1, 0)  # the ok one (12 min old) is after until
    [acme] = admin.ok("GET", "/usage/tenants", tenant="acme", hours=2)["data"]
    assert (acme["tenant"], acme["requests"], acme["rejected"]) == ("acme", 3, 1)
    report = admin.ok(
        "GET", "/usage/tenants", hours=1, until=(now - timedelta(hours=1)).isoformat()
    )
    assert [(g["tenant"], g["requests"]) for g in report["data"]] == [("acme", 1)]


def test_bad_usage_windows_are_4xx(admin: Admin) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"hours": 1, "since": "2024-01-01T00:00:00Z"}, "hours"),
        ({"since": "2024-01-01T00:00:00"}, "since"),  # naive: which timezone?
        ({"since": "yesterday"}, "since"),
        ({"hours": 0}, "hours"),
        ({"hours": 1e12}, "hours"),
        ({"since": "2024-01-02T00:00:00Z", "until": "2024-01-01T00:00:00Z"}, "since"),
        ({"until": "0001-01-01T00:30:00Z"}, "hours"),  # the window would start before year 1
    ]
    for params, param in cases:
        for path in ("/usage/tenants", "/usage/tiers"):
            assert _error(admin.call("GET", path, **params), 422)["param"] == param, params
    assert _error(admin.call("GET", "/usage/tenants", tenant="nobody"), 404)["param"] == "tenant"


# -- audit ------------------------------------------------------------------------------------


def test_audit_entries_carry_actor_and_before_after(admin: Admin) -> None:
    gold = _tier(admin)
    admin.ok("PATCH", "/tiers/gold", {"weight": 4.0})
    _backend(admin)
    entries = _audit(admin, entity_type="tier", entity_id=gold["id"])
    assert [e["action"] for e in entries] == ["update", "create"]
    update, create = entries
    assert all(e["actor"] == ACTOR and e["object"] == "audit_entry" for e in entries)
    assert create["before"] is None and create["after"]["weight"] == 3.0
    assert (update["before"]["weight"], update["after"]["weight"]) == (3.0, 4.0)
    assert len(_audit(admin)) == 3
    assert len(_audit(admin, limit=1)) == 1
    assert _audit(admin, actor="someone-else") == []
    future = (utcnow() + timedelta(hours=1)).isoformat()
    assert _audit(admin, since=future) == []
    assert _error(admin.call("GET", "/audit", limit=0), 422)["param"] == "limit"
