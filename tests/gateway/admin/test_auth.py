"""The admin key: required on every route, checked before the body is parsed, in OpenAPI."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import SecretStr

from gateway.app.admin import RESOURCES, build_admin_router
from gateway.app.admin.deps import AdminRoute
from gateway.db import crud
from gateway.settings import Settings

from .support import ADMIN_KEY, PREFIX, Admin, error


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
        err = error(response, 401)
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
    assert error(response, 401)["code"] == "invalid_admin_key"


def _routes() -> list[APIRoute]:
    """Every admin route, from the resource modules the admin router is assembled from."""
    return [r for m in RESOURCES for r in m.router.routes if isinstance(r, APIRoute)]


def test_every_route_requires_the_admin_key(sqlite_admin: Admin) -> None:
    routes = _routes()
    assert len(routes) >= 20
    assert all(isinstance(r, AdminRoute) for r in routes)  # the class that checks the key
    sqlite_admin.client.headers.pop("Authorization")
    for route in routes:
        path = PREFIX + route.path.replace("{ref}", "x").replace("{prefix}", "x")
        for method in route.methods or ():
            response = sqlite_admin.client.request(method, path, json={})
            assert response.status_code == 401, (method, path, response.text)


def test_without_a_configured_admin_key_the_api_is_disabled_with_403(sqlite_admin: Admin) -> None:
    for configured in (None, SecretStr("")):
        sqlite_admin.state.settings = Settings(admin_key=configured)
        err = error(sqlite_admin.call("GET", "/tiers"), 403)
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
    expected = {PREFIX + r.path for r in _routes()}
    assert set(schema["paths"]) == expected
    assert "401" in schema["paths"][f"{PREFIX}/keys"]["post"]["responses"]
