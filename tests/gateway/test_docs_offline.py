"""The API reference (``/docs``) works without internet.

FastAPI's own page loads Swagger UI from a CDN; the gateway's references only itself: the
vendored ``swagger-ui-dist`` assets and ``/openapi.json``, each served with its content type.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from admin_ui import ROOT as ADMIN_UI
from gateway.app import create_app
from gateway.app.docs import REDOC_DIR, SWAGGER_UI_DIR
from gateway.settings import Settings


class _References(HTMLParser):
    """Every ``src`` and ``href`` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href") and v is not None]


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    """The real app (dashboard on, as ``tiergate serve`` has it); no lifespan is needed to
    serve the reference."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'tiergate.db'}", data_dir=tmp_path)
    return TestClient(create_app(settings))


EXPECTED_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
}


def test_docs_reference_no_external_host_and_their_assets_are_served(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.search(r"(?i)\bhttps?://|//cdn|jsdelivr|unpkg", page.text), page.text
    parser = _References()
    parser.feed(page.text)
    assert parser.urls, "the page loads its script and stylesheet"
    assets = [url for url in parser.urls if url.startswith("/docs/assets/")]
    assert {Path(url).suffix for url in assets} == set(EXPECTED_TYPES)
    for url in parser.urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, url  # this gateway, nothing else
    scripts = re.findall(r'<script src="([^"]+)"', page.text)
    assert scripts == ["/docs/assets/swagger-ui-bundle.js"]
    for url in assets:
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert asset.headers["content-type"].startswith(EXPECTED_TYPES[Path(url).suffix]), url
        assert asset.content == (SWAGGER_UI_DIR / Path(url).name).read_bytes()
    # the document it loads is this app's, and Swagger UI's validator badge (a request to
    # validator.swagger.io) is off
    openapi_url = re.search(r"url: '([^']+)'", page.text)
    assert openapi_url is not None and openapi_url.group(1) == "/openapi.json"
    assert "/v1/chat/completions" in json.loads(client.get("/openapi.json").text)["paths"]
    assert '"validatorUrl": null' in page.text


def test_redoc_is_served_offline_and_the_oauth2_redirect_is_local(client: TestClient) -> None:
    page = client.get("/redoc")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.search(r"(?i)\bhttps?://|//cdn|jsdelivr|unpkg|fonts.googleapis", page.text)
    scripts = re.findall(r'<script src="([^"]+)"', page.text)
    assert scripts == ["/redoc/assets/redoc.standalone.js"]
    assert 'spec-url="/openapi.json"' in page.text
    bundle = client.get(scripts[0])
    assert bundle.status_code == 200
    assert bundle.headers["content-type"].startswith("text/javascript")
    assert bundle.content == (REDOC_DIR / "redoc.standalone.js").read_bytes()
    # the bundle names one image on a CDN (its footer logo): the page's policy keeps the
    # browser from loading anything but this gateway's own files
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "img-src 'self' data:" in policy
    assert "connect-src 'self'" in policy
    redirect = client.get("/docs/oauth2-redirect")
    assert redirect.status_code == 200
    assert not re.search(r"(?i)<script[^>]+src=", redirect.text)
    assert client.get("/docs/assets/nope.js").status_code == 404
    assert client.get("/redoc/assets/nope.js").status_code == 404


def test_the_vendored_files_carry_their_licence() -> None:
    licence = (SWAGGER_UI_DIR / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0" in licence
    assert (SWAGGER_UI_DIR / "swagger-ui-bundle.js.LICENSE.txt").is_file()
    vendored = (ADMIN_UI / "VENDORED.md").read_text()
    assert re.search(r"swagger-ui-dist.*5\.35\.0.*Apache-2\.0", vendored), vendored
    assert "MIT License" in (REDOC_DIR / "LICENSE").read_text()
    assert (REDOC_DIR / "redoc.standalone.js.LICENSE.txt").is_file()
    assert re.search(r"redoc.*2\.5\.0.*MIT", vendored), vendored
