"""The dashboard's latency profiles page (``/ui/profiles``) in the real app, signed in.

Shipped and stored profiles listed, one viewed whole, a calibrated profile imported from a JSON
upload (the API's validation, its messages beside the field), a stored one deleted unless a
backend names it.
"""

from __future__ import annotations

import html
import json
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

from gateway.app import create_app
from gateway.app.admin.credentials import ADMIN_KEY_OPERATOR
from gateway.db import crud
from gateway.db.models import AuditLog
from gateway.db.session import make_session_factory
from priority.profiles import available_profiles, load_profile

ADMIN_KEY = "ui-profiles-admin-key-" + "x" * 16
ACTOR = f"admin-ui:{ADMIN_KEY_OPERATOR}"


@dataclass
class Ui:
    client: TestClient
    engine: Engine
    csrf: str

    def upload(
        self, content: bytes | None, *, name: str = "", filename: str = "site.json"
    ) -> Response:
        files = {"document": (filename, content or b"", "application/json")}
        if content is None:
            files = {"document": ("", b"", "application/octet-stream")}
        data = {"csrf_token": self.csrf, "name": name}
        return self.client.post("/ui/profiles/-/import", data=data, files=files)


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[Ui]:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    secret = "ui-profiles-secret-" + uuid.uuid4().hex
    engine, _ = seed_database(url, secret)
    settings = app_settings(url, tmp_path, secret, ADMIN_KEY)
    with TestClient(create_app(settings, backends=[]), follow_redirects=False) as client:
        signed = client.post("/ui/login", data={"credential": ADMIN_KEY, "next": "/ui/profiles"})
        assert signed.status_code == 303, signed.text
        page = client.get("/ui/profiles")
        token = re.search(r'<meta name="csrf-token" content="([^"]+)"', page.text)
        assert token is not None
        yield Ui(client, engine, token.group(1))
    engine.dispose()


def _document(name: str = "site-a100", **engine: int) -> dict[str, Any]:
    """A calibrated profile as ``tiergate profile fit`` writes it: a shipped one, renamed."""
    document = load_profile("a100-qwen2-7b").to_dict()
    document["engine"] = {**document["engine"], **engine}
    return {**document, "name": name, "hardware": "site A100"}


def _names(page: str) -> list[str]:
    body = page[page.index('id="profiles-table"') :]
    return re.findall(r'<th scope="row"><a href="/ui/profiles/[^"]+">([^<]+)</a>', body)


def _field_error(page: Response, field: str) -> str:
    found = re.search(rf'id="error-{field}" role="alert">([^<]*)<', page.text)
    assert found is not None, page.text
    return html.unescape(found.group(1))


def test_lists_the_shipped_profiles_and_shows_one_whole(ui: Ui) -> None:
    page = ui.client.get("/ui/profiles")
    assert page.status_code == 200 and "<h1>Profiles</h1>" in page.text
    assert _names(page.text) == sorted(available_profiles())
    assert 'aria-current="page"' in page.text and 'href="/ui/profiles/-/import"' in page.text

    shown = ui.client.get("/ui/profiles/a100-qwen2-7b")
    assert shown.status_code == 200 and "<h1>Profile a100-qwen2-7b</h1>" in shown.text
    document = re.search(r'<pre id="profile-document"><code>(.*?)</code></pre>', shown.text, re.S)
    assert document is not None
    assert json.loads(html.unescape(document.group(1))) == load_profile("a100-qwen2-7b").to_dict()
    assert "Delete profile" not in shown.text  # shipped: nothing to delete
    missing = ui.client.get("/ui/profiles/no-such-profile")
    assert missing.status_code == 404 and "does not exist" in html.unescape(missing.text)

    paged = ui.client.get("/ui/profiles", params={"limit": 1, "offset": 1})
    assert _names(paged.text) == sorted(available_profiles())[1:2]
    assert f"2–2 of {len(available_profiles())}" in paged.text


def test_import_an_upload_then_view_and_delete_it(ui: Ui) -> None:
    form = ui.client.get("/ui/profiles/-/import")
    assert (
        '<label for="field-document">' in form.text and 'enctype="multipart/form-data"' in form.text
    )

    imported = ui.upload(json.dumps(_document()).encode())
    assert imported.status_code == 303, imported.text
    assert imported.headers["location"] == "/ui/profiles/site-a100"
    shown = ui.client.get("/ui/profiles/site-a100")
    assert "site A100" in shown.text and "custom" in shown.text and ADMIN_KEY_OPERATOR in shown.text
    assert "Profile site-a100 imported." in shown.text  # the flash

    renamed = ui.upload(json.dumps(_document()).encode(), name="site-a100-b")
    assert renamed.headers["location"] == "/ui/profiles/site-a100-b"
    assert {"site-a100", "site-a100-b"} <= set(_names(ui.client.get("/ui/profiles").text))

    with make_session_factory(ui.engine).begin() as s:
        crud.create_backend(
            s,
            actor="test",
            name="gpu-0",
            base_url="http://10.0.0.5:8000",
            model="qwen",
            profile="site-a100",
        )
    assert 'href="/ui/backends/gpu-0"' in ui.client.get("/ui/profiles/site-a100").text
    in_use = ui.client.post("/ui/profiles/site-a100/delete", data={"csrf_token": ui.csrf})
    assert in_use.status_code == 409
    assert "is used by backend(s) gpu-0" in html.unescape(in_use.text)
    shipped = ui.client.post("/ui/profiles/a100-qwen2-7b/delete", data={"csrf_token": ui.csrf})
    assert shipped.status_code == 409
    refused = ui.client.post("/ui/profiles/site-a100-b/delete", data={})
    assert refused.status_code == 403  # no CSRF token: nothing deleted
    deleted = ui.client.post("/ui/profiles/site-a100-b/delete", data={"csrf_token": ui.csrf})
    assert deleted.status_code == 303
    assert "site-a100-b" not in _names(ui.client.get("/ui/profiles").text)

    with make_session_factory(ui.engine)() as s:
        rows = s.scalars(select(AuditLog).where(AuditLog.entity_type == "profile"))
        assert [(r.action, r.actor) for r in rows] == [
            ("create", ACTOR),
            ("create", ACTOR),
            ("delete", ACTOR),
        ]


def test_bad_uploads_are_refused_beside_the_field(ui: Ui) -> None:
    cases: list[tuple[bytes | None, str, str, str, int]] = [
        (None, "", "document", "choose a profile JSON file", 400),
        (b"{not json", "", "document", "is not JSON", 400),
        (b"\xff\xfe", "", "document", "is not JSON", 400),
        (b"[1, 2]", "", "document", "", 400),
        (
            json.dumps({"name": "x", "hardware": "h", "model": "m"}).encode(),
            "",
            "document",
            "the profile document lacks coefficients",
            400,
        ),
        (json.dumps(_document()).encode(), "no spaces", "name", "use 1-64 letters", 400),
        (
            json.dumps(_document()).encode(),
            "a100-qwen2-7b",
            "name",
            "is a shipped profile's",
            409,
        ),
    ]
    for content, name, field, message, status in cases:
        page = ui.upload(content, name=name)
        assert page.status_code == status, (content, name, page.text)
        assert message in _field_error(page, field), (content, name)
        assert f'value="{html.escape(name)}"' in page.text or not name
    assert ui.upload(json.dumps(_document()).encode()).status_code == 303
    again = ui.upload(json.dumps(_document()).encode())
    assert again.status_code == 409 and "profile 'site-a100' already exists" in html.unescape(
        again.text
    )
    assert set(_names(ui.client.get("/ui/profiles").text)) == {*available_profiles(), "site-a100"}
