"""The dashboard's backends page (``/ui/backends``) in the real app, signed in.

A gateway on the backends table in front of an emulated engine: a backend added, edited,
disabled, enabled and deleted through the page's forms lands in the table (audited as the
operator) and in the pool at once (the admin API's side effect: a reload), and the live table
shows what the pool routes to. Bad input comes back beside its field in the API's words; a form
without the CSRF token changes nothing. A gateway serving a fixed (embedded) fleet lists its
engines read-only.
"""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx import Response
from seeded_app import app_settings, seed_database
from sqlalchemy import Engine, select

from engine_emulated import EngineSpec, EngineThread, RunningEngine
from gateway.app import BackendSpec, create_app
from gateway.app.admin.credentials import ADMIN_KEY_OPERATOR
from gateway.app.state import GatewayState
from gateway.db import crud
from gateway.db.models import AuditLog
from gateway.db.session import make_session_factory

ADMIN_KEY = "ui-backends-admin-key-" + "x" * 16
MODEL = "qwen2-7b"
PROFILE = "a100-qwen2-7b"
ACTOR = f"admin-ui:{ADMIN_KEY_OPERATOR}"


@dataclass
class Ui:
    client: TestClient
    engine: Engine
    csrf: str

    @property
    def state(self) -> GatewayState:
        state: GatewayState = self.client.app.state.gateway  # type: ignore[attr-defined]
        return state

    def routed(self) -> set[str]:
        return {b.name for b in self.state.pool.backends}

    def post(self, path: str, data: dict[str, Any], *, csrf: bool = True) -> Response:
        form = {**data, "csrf_token": self.csrf} if csrf else data
        return self.client.post(path, data=form)

    def audit(self) -> list[tuple[str, str, str]]:
        with make_session_factory(self.engine)() as s:
            rows = s.scalars(select(AuditLog).where(AuditLog.entity_type == "backend"))
            return [(r.action, r.entity_id, r.actor) for r in rows]


def _signed_in(client: TestClient) -> str:
    signed = client.post("/ui/login", data={"credential": ADMIN_KEY, "next": "/ui/backends"})
    assert signed.status_code == 303, signed.text
    page = client.get("/ui/backends")
    token = re.search(r'<meta name="csrf-token" content="([^"]+)"', page.text)
    assert token is not None
    return token.group(1)


@pytest.fixture(scope="module")
def engines() -> Iterator[list[RunningEngine]]:
    with EngineThread([EngineSpec(PROFILE, "slide", MODEL)]) as running:
        yield running


def _app(tmp_path: Path, backends: list[BackendSpec] | None = None) -> Iterator[Ui]:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    secret = "ui-backends-secret-" + uuid.uuid4().hex
    engine, _ = seed_database(url, secret)
    settings = app_settings(url, tmp_path, secret, ADMIN_KEY)
    with TestClient(create_app(settings, backends=backends), follow_redirects=False) as client:
        yield Ui(client, engine, _signed_in(client))
    engine.dispose()


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[Ui]:
    """A gateway serving the backends table (empty at first)."""
    yield from _app(tmp_path)


def _rows(page: str) -> dict[str, str]:
    """The table's rows by backend name (each row's HTML)."""
    body = page[page.index('id="backends-table"') :]
    return dict(re.findall(r'<tr id="backend-([^"]+)">(.*?)</tr>', body, re.S))


def _field_error(page: Response, field: str) -> str:
    found = re.search(rf'id="error-{field}" role="alert">([^<]*)<', page.text)
    assert found is not None, page.text
    return html.unescape(found.group(1))


def _spec(url: str, name: str = "gpu-0", **extra: str) -> dict[str, str]:
    return {"name": name, "base_url": url, "model": MODEL, "profile": PROFILE, "kind": "vllm"} | {
        "enabled": "true",
        **extra,
    }


def test_signed_out_is_sent_to_sign_in(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    engine, _ = seed_database(url, "s" * 32)
    with TestClient(create_app(app_settings(url, tmp_path, "s" * 32, ADMIN_KEY))) as client:
        for path in ("/ui/backends", "/ui/backends/-/live", "/ui/backends/-/new"):
            response = client.get(path, follow_redirects=False)
            assert response.status_code == 303, path
            assert response.headers["location"].startswith("/ui/login")
        assert client.post("/ui/backends/-/new", data={}, follow_redirects=False).status_code == 303
    engine.dispose()


def test_empty_page(ui: Ui) -> None:
    page = ui.client.get("/ui/backends")
    assert page.status_code == 200
    assert "<h1>Backends</h1>" in page.text and 'id="backends-table"' not in page.text
    assert "No backends" in page.text and 'href="/ui/backends/-/new"' in page.text
    assert 'hx-get="/ui/backends/-/live"' in page.text and 'aria-current="page"' in page.text


def test_add_edit_disable_enable_delete_reload_the_pool(
    ui: Ui, engines: list[RunningEngine]
) -> None:
    form = ui.client.get("/ui/backends/-/new")
    for label, field in (
        ("Name", "name"),
        ("Base URL", "base_url"),
        ("Latency profile", "profile"),
    ):
        assert re.search(rf'<label for="field-{field}">{label}', form.text), label
    assert f'<option value="{PROFILE}"' in form.text

    added = ui.post("/ui/backends/-/new", _spec(engines[0].url))
    assert added.status_code == 303 and added.headers["location"] == "/ui/backends"
    assert ui.routed() == {"gpu-0"}  # reloaded now, not at the next periodic refresh
    row = _rows(ui.client.get("/ui/backends").text)["gpu-0"]
    assert "database" in row and PROFILE in row and "Disable gpu-0" in row
    assert 'href="/ui/backends/gpu-0"' in row

    edit = ui.client.get("/ui/backends/gpu-0")
    assert 'value="gpu-0"' in edit.text and "Delete backend gpu-0" in edit.text
    saved = ui.post("/ui/backends/gpu-0", _spec(engines[0].url, name="gpu-a", model="other"))
    assert saved.status_code == 303
    assert ui.routed() == {"gpu-a"}
    assert {b.spec.model for b in ui.state.pool.backends} == {"other"}

    assert ui.post("/ui/backends/gpu-a/enabled", {"enabled": "false"}).status_code == 303
    assert ui.routed() == set()
    row = _rows(ui.client.get("/ui/backends").text)["gpu-a"]
    assert "not routed" in row and "Enable gpu-a" in row
    assert ui.post("/ui/backends/gpu-a/enabled", {"enabled": "true"}).status_code == 303
    assert ui.routed() == {"gpu-a"}

    deleted = ui.post("/ui/backends/gpu-a/delete", {})
    assert deleted.status_code == 303
    assert ui.routed() == set()
    assert "No backends" in ui.client.get("/ui/backends").text
    with make_session_factory(ui.engine)() as s:
        assert crud.list_backends(s) == []
    assert [(action, actor) for action, _, actor in ui.audit()] == [
        ("create", ACTOR),
        ("update", ACTOR),
        ("update", ACTOR),
        ("update", ACTOR),
        ("delete", ACTOR),
    ]


def test_bad_input_is_shown_beside_its_field_and_changes_nothing(
    ui: Ui, engines: list[RunningEngine]
) -> None:
    cases = [
        ({"base_url": "ftp://x"}, "base_url", 400, "http(s) URL with a host"),
        ({"name": "no spaces"}, "name", 400, "use 1-64 letters"),
        ({"profile": "no-such-profile"}, "profile", 400, "unknown profile 'no-such-profile'"),
        ({"kind": "triton"}, "kind", 400, "vllm"),
        ({"model": ""}, "model", 400, ""),
    ]
    for change, field, status, message in cases:
        page = ui.post("/ui/backends/-/new", _spec(engines[0].url, **change))
        assert page.status_code == status, (change, page.text)
        assert message in _field_error(page, field), change
        typed = change.get("name", "gpu-0")
        assert f'value="{html.escape(typed)}"' in page.text  # the form keeps what was typed
    assert ui.routed() == set() and ui.audit() == []

    assert ui.post("/ui/backends/-/new", _spec(engines[0].url)).status_code == 303
    taken = ui.post("/ui/backends/-/new", _spec(engines[0].url))
    assert taken.status_code == 409
    assert "backend 'gpu-0' already exists" in _field_error(taken, "name")
    bad_edit = ui.post("/ui/backends/gpu-0", _spec("http://[x"))
    assert bad_edit.status_code == 400 and _field_error(bad_edit, "base_url")
    missing = ui.post("/ui/backends/nope", _spec(engines[0].url, name="nope"))
    assert missing.status_code == 404
    assert "backend 'nope' does not exist" in html.unescape(missing.text)
    assert ui.post("/ui/backends/nope/enabled", {"enabled": "false"}).status_code == 404
    assert ui.post("/ui/backends/nope/delete", {}).status_code == 404
    assert [action for action, _, _ in ui.audit()] == ["create"]


def test_a_form_without_the_csrf_token_is_refused(ui: Ui, engines: list[RunningEngine]) -> None:
    refused = ui.post("/ui/backends/-/new", _spec(engines[0].url), csrf=False)
    assert refused.status_code == 403 and "CSRF" in refused.text
    wrong = ui.client.post("/ui/backends/-/new", data={**_spec(engines[0].url), "csrf_token": "x"})
    assert wrong.status_code == 403
    assert ui.routed() == set() and ui.audit() == []


@pytest.fixture
def embedded(tmp_path: Path, engines: list[RunningEngine]) -> Iterator[Ui]:
    """``tiergate serve``'s shape: an emulated engine given to the app; the table has a row."""
    spec = BackendSpec("emulated-0-a100-qwen2-7b", engines[0].url, MODEL, PROFILE, "emulated")
    for ui in _app(tmp_path, [spec]):
        with make_session_factory(ui.engine).begin() as s:
            crud.create_backend(
                s,
                actor="test",
                name="db-row",
                base_url="http://10.0.0.9:8000",
                model=MODEL,
                profile=PROFILE,
            )
        yield ui


def test_embedded_engines_are_listed_read_only_and_live(embedded: Ui) -> None:
    page = embedded.client.get("/ui/backends")
    assert 'id="fixed-fleet"' in page.text
    rows = _rows(page.text)
    assert set(rows) == {"db-row", "emulated-0-a100-qwen2-7b"}
    emulated = rows["emulated-0-a100-qwen2-7b"]
    assert "embedded" in emulated and "read-only" in emulated and "<form" not in emulated
    assert "healthy" in emulated and "closed" in emulated
    assert "not routed" in rows["db-row"] and "Disable db-row" in rows["db-row"]

    partial = embedded.client.get("/ui/backends/-/live", headers={"hx-request": "true"})
    assert partial.status_code == 200 and "<html" not in partial.text
    assert set(_rows(partial.text)) == set(rows)
    assert f'value="{embedded.csrf}"' in partial.text  # its buttons still post with the token

    first = embedded.client.get("/ui/backends", params={"limit": 1})
    assert list(_rows(first.text)) == ["db-row"] and "1–1 of 2" in first.text
    assert 'hx-get="/ui/backends/-/live?limit=1"' in first.text
    second = embedded.client.get("/ui/backends", params={"limit": 1, "offset": 1})
    assert list(_rows(second.text)) == ["emulated-0-a100-qwen2-7b"]
    assert embedded.client.get("/ui/backends", params={"limit": 0}).status_code == 400
    # an embedded engine is no database row: nothing to edit
    assert embedded.client.get("/ui/backends/emulated-0-a100-qwen2-7b").status_code == 404
