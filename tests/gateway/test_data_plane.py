"""The generation endpoints answered ahead of the middleware stack (``gateway.app.data_plane``):
they must keep doing what the skipped layers did — count the request for the drain, bound the
body, answer every failure in the gateway's dialect — and leave the rest of the app alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from seeded_app import app_settings, seed_database

from gateway.app import create_app
from gateway.app import data_plane as data_plane_module
from gateway.errors import ErrorOut

SECRET = "data-plane-test-secret"
ADMIN_KEY = "data-plane-admin-key-0123456789abcdef"
BODY = {"model": "nowhere", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    engine, key = seed_database(url, SECRET)
    settings = app_settings(url, tmp_path, SECRET, ADMIN_KEY, max_body_bytes=2048)
    with TestClient(create_app(settings, backends=[]), raise_server_exceptions=False) as client:
        yield client, {"authorization": f"Bearer {key}"}
    engine.dispose()


def _error(response: Any) -> dict[str, Any]:
    payload = response.json()
    assert ErrorOut.model_validate(payload).error.message
    error: dict[str, Any] = payload["error"]
    return error


def test_a_failure_nobody_handles_is_a_500_in_the_dialect_not_plain_text(
    gateway: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, headers = gateway

    async def broken(*_: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(data_plane_module, "serve", broken)
    response = client.post("/v1/chat/completions", json=BODY, headers=headers)
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("application/json")
    assert _error(response)["code"] == "internal_error"
    assert "a bug" not in response.text  # what failed inside stays inside


def test_the_apps_own_handlers_answer_what_they_handle(
    gateway: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = gateway
    unknown = client.post("/v1/completions", json={**BODY, "prompt": "hi"}, headers=headers)
    assert unknown.status_code == 404 and _error(unknown)["code"] == "model_not_found"
    anonymous = client.post("/v1/chat/completions", json=BODY)
    assert anonymous.status_code == 401 and _error(anonymous)["type"] == "invalid_request_error"


def test_requests_are_counted_for_the_drain_and_released(
    gateway: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = gateway
    drain = client.app.state.drain  # type: ignore[attr-defined]
    before = drain.taken
    for path in ("/v1/chat/completions", "/v1/completions"):
        client.post(path, json=BODY, headers=headers)
    assert drain.taken == before + 2
    assert not drain.requests


def test_a_body_over_the_limit_is_413_declared_or_chunked(
    gateway: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = gateway
    big = b'{"model": "' + b"x" * 4096 + b'"}'
    declared = client.post("/v1/chat/completions", content=big, headers=headers)
    chunked = client.post(
        "/v1/chat/completions", content=iter([big[:1000], big[1000:]]), headers=headers
    )
    for response in (declared, chunked):
        assert response.status_code == 413
        assert _error(response)["code"] == "request_too_large"


def test_other_methods_and_paths_still_go_through_the_app(
    gateway: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = gateway
    wrong_method = client.get("/v1/chat/completions", headers=headers)
    assert wrong_method.status_code == 405 and _error(wrong_method)
    trailing = client.post("/v1/chat/completions/", json=BODY, headers=headers)
    assert trailing.status_code in (307, 404)  # FastAPI's answer, not the data plane's
    assert client.get("/health/liveliness").json() == {"status": "ok"}
