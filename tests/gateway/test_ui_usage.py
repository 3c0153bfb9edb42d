"""The usage page (``/ui/usage``), its chart data (``/ui/usage/series.json``) and its CSV
export (``/ui/usage.csv``) in the real app, signed in: empty, with the hand-made rows
(``usage_rows.py``), and with bad filters shown beside their field."""

from __future__ import annotations

import csv
import io
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from seeded_app import app_settings, seed_database
from sqlalchemy import insert
from usage_rows import hand_rows, make_tenants

from gateway.app import create_app
from gateway.app.usage_csv import COLUMNS
from gateway.db.models import UsageRecord
from gateway.db.session import make_session_factory

ADMIN_KEY = "ui-usage-admin-key-" + "x" * 16
WINDOW = {"from": "2030-01-01T00:00", "to": "2030-01-01T02:00"}


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[tuple[TestClient, Any]]:
    """The whole gateway on a seeded SQLite database, signed in with the admin key."""
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    secret = "ui-usage-secret-" + uuid.uuid4().hex
    engine, _ = seed_database(url, secret, tenant="seeded")
    settings = app_settings(url, tmp_path, secret, ADMIN_KEY)
    with TestClient(create_app(settings), follow_redirects=False) as client:
        signed = client.post("/ui/login", data={"credential": ADMIN_KEY, "next": "/ui/usage"})
        assert signed.status_code == 303, signed.text
        yield client, make_session_factory(engine)
    engine.dispose()


def test_signed_out_is_sent_to_sign_in(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    engine, _ = seed_database(url, "s" * 32)
    with TestClient(create_app(app_settings(url, tmp_path, "s" * 32, ADMIN_KEY))) as client:
        for path in ("/ui/usage", "/ui/usage/series.json", "/ui/usage.csv"):
            response = client.get(path, follow_redirects=False)
            assert response.status_code == 303
            assert response.headers["location"].startswith("/ui/login")
    engine.dispose()


def test_empty_page_renders_and_charts_are_empty(app_client: tuple[TestClient, Any]) -> None:
    client, _ = app_client
    page = client.get("/ui/usage")
    assert page.status_code == 200, page.text
    assert "<h1>Usage</h1>" in page.text
    assert 'id="usage-empty"' in page.text and 'id="usage-table"' not in page.text
    assert 'src="/ui/static/vendor/uplot/uPlot.iife.min.js"' in page.text
    assert 'aria-current="page"' in page.text and 'href="/ui/usage"' in page.text
    for label in ("Window", "From (UTC)", "Group by", "Tenant", "Tier", "Bucket"):
        assert re.search(rf'<label for="field-[a-z_]+">{re.escape(label)}', page.text), label
    data_url = re.search(r'data-series-url="([^"]+)"', page.text)
    assert data_url is not None
    data = client.get(data_url.group(1).replace("&amp;", "&")).json()
    assert data["requests"] == 0 and data["bucket"] == "hour"  # 24 h: hours
    assert len(data["x"]) in (24, 25)  # 25 unless now is on the hour
    requests = next(c for c in data["charts"] if c["id"] == "requests")
    assert requests["series"] == []  # no group has records
    assert client.get("/ui/static/usage.js").status_code == 200
    assert client.get("/ui/static/vendor/uplot/uPlot.iife.min.js").status_code == 200


@pytest.fixture
def with_rows(app_client: tuple[TestClient, Any]) -> TestClient:
    client, factory = app_client
    with factory.begin() as s:
        acme, beta = make_tenants(s)
        s.execute(insert(UsageRecord), hand_rows(acme, beta))
    return client


def test_page_with_data_table_and_chart_data(with_rows: TestClient) -> None:
    params = {**WINDOW, "group_by": "tenant", "bucket": "hour"}
    page = with_rows.get("/ui/usage", params=params)
    assert page.status_code == 200, page.text
    table = page.text[page.text.index('id="usage-table"') :]
    rows = re.findall(r"<tr>\s*<td>(.*?)</td>\s*<td class=\"num\">([\d,]+)</td>", table, re.S)
    assert [(re.sub(r"<[^>]+>", "", name), n) for name, n in rows] == [
        ("acme", "7"),
        ("beta", "3"),
        ("deleted tenants", "1"),
    ]
    assert "75.0%" in table  # acme's SLO attainment: 3 of 4 finished
    assert "300 / 740 / 788" in table  # acme's TTFT p50 / p95 / p99
    data = with_rows.get("/ui/usage/series.json", params=params).json()
    assert data["x"] == [1893456000, 1893459600]  # 2030-01-01 00:00 and 01:00 UTC
    assert data["requests"] == 11
    charts = {c["id"]: c for c in data["charts"]}
    assert {s["label"]: s["data"] for s in charts["requests"]["series"]} == {
        "acme": [7, 0],
        "beta": [1, 2],
        "deleted tenants": [0, 1],
    }
    slo = {s["label"]: s["data"] for s in charts["slo"]["series"]}
    assert slo["acme"][0] == pytest.approx(0.75) and slo["acme"][1] is None
    ttft = {s["label"]: s["data"] for s in charts["ttft"]["series"]}
    assert ttft["acme"][0] == pytest.approx(740.0)  # grouped: p95 per group
    ungrouped = with_rows.get("/ui/usage/series.json", params={**WINDOW, "group_by": "none"})
    latency = {
        s["label"]: s["data"]
        for s in next(c for c in ungrouped.json()["charts"] if c["id"] == "ttft")["series"]
    }
    assert set(latency) == {"p50", "p95", "p99"}


def test_csv_export(with_rows: TestClient) -> None:
    response = with_rows.get(
        "/ui/usage.csv", params={**WINDOW, "group_by": "tier", "bucket": "hour"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert (
        "tiergate-usage-20300101T0000-20300101T0200.csv" in response.headers["content-disposition"]
    )
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert list(rows[0]) == list(COLUMNS)
    got = {(r["group"], r["start"]): int(r["requests"]) for r in rows}
    assert got == {
        ("gold", "2030-01-01T00:00:00Z"): 7,
        ("gold", "2030-01-01T01:00:00Z"): 1,
        ("silver", "2030-01-01T00:00:00Z"): 1,
        ("silver", "2030-01-01T01:00:00Z"): 2,
    }


@pytest.mark.parametrize(
    ("params", "field", "status"),
    [
        ({"from": "yesterday"}, "from", 400),
        ({"from": "2030-01-02T00:00", "to": "2030-01-01T00:00"}, "from", 400),
        ({"range": "custom"}, "from", 400),
        ({"range": "forever"}, "range", 400),
        ({"group_by": "model"}, "group_by", 400),
        ({"bucket": "week"}, "bucket", 400),
        ({"range": "30d", "bucket": "minute"}, "bucket", 400),  # 43,200 points
        ({"tenant": "nobody"}, "tenant", 404),
        ({"top": "0"}, "top", 400),
    ],
)
def test_bad_filters_are_shown_beside_the_field(
    app_client: tuple[TestClient, Any], params: dict[str, str], field: str, status: int
) -> None:
    client, _ = app_client
    page = client.get("/ui/usage", params=params)
    assert page.status_code == status, page.text
    assert f'id="error-{field}" role="alert"' in page.text
    assert "<h1>Usage</h1>" in page.text  # the page, with the filters, not an error page
    data = client.get("/ui/usage/series.json", params=params)
    assert data.status_code == status
    assert data.json()["error"]["param"] == field
    assert client.get("/ui/usage.csv", params=params).status_code == status


def test_window_is_an_alias_of_range_and_unknown_parameters_are_refused(
    app_client: tuple[TestClient, Any],
) -> None:
    client, _ = app_client
    hour = client.get("/ui/usage", params={"window": "1h"})
    assert hour.status_code == 200, hour.text
    assert '<option value="1h" selected' in hour.text  # the window asked for, not the default
    data = client.get("/ui/usage/series.json", params={"window": "1h", "bucket": "minute"})
    assert data.status_code == 200 and len(data.json()["x"]) in (60, 61)
    for path in ("/ui/usage", "/ui/usage/series.json", "/ui/usage.csv"):
        refused = client.get(path, params={"widnow": "1h"})
        assert refused.status_code == 400, (path, refused.text)
        assert "unknown parameter" in refused.text and "widnow" in refused.text
    clash = client.get("/ui/usage/series.json", params={"window": "1h", "range": "6h"})
    assert clash.status_code == 400 and clash.json()["error"]["param"] == "window"
