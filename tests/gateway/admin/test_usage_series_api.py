"""``GET /admin/v1/usage/series``: the series as JSON and CSV over the hand-made rows
(``usage_rows.py``), its parameters, and its 400s."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from sqlalchemy import insert
from usage_rows import HOUR, T0, hand_rows, make_tenants

from gateway.app.usage_csv import COLUMNS
from gateway.db.models import UsageRecord

from .support import Admin, error

WINDOW = {"since": T0.isoformat(), "until": (T0 + 2 * HOUR).isoformat()}


@pytest.fixture
def seeded(admin: Admin) -> Admin:
    with admin.state.session_factory.begin() as s:
        acme, beta = make_tenants(s)
        s.execute(insert(UsageRecord), hand_rows(acme, beta))
    return admin


def test_series_json_per_tenant(seeded: Admin) -> None:
    body = seeded.ok("GET", "/usage/series", **WINDOW, bucket="hour", group_by="tenant")
    assert body["object"] == "usage_series"
    assert (body["bucket"], body["bucket_seconds"], body["group_by"]) == ("hour", 3600, "tenant")
    assert [g["group"] for g in body["groups"]] == ["acme", "beta", None]
    acme = next(p for p in body["data"] if p["group"] == "acme")
    assert acme["start"].startswith("2030-01-01T00:00:00")
    assert (acme["requests"], acme["ok"], acme["rejected"], acme["slo_met"]) == (7, 4, 1, 3)
    assert acme["slo_attainment"] == pytest.approx(0.75)
    assert acme["tdg_ratio"] == pytest.approx(4.5 / 11)
    assert acme["ttft_p50_ms"] == pytest.approx(300.0)
    assert acme["ttft_p99_ms"] == pytest.approx(788.0)
    assert acme["tpot_p95_ms"] == pytest.approx(74.0)
    deleted = next(p for p in body["data"] if p["group"] is None)
    assert deleted["group_id"] is None and deleted["requests"] == 1


def test_series_filters_and_default_bucket(seeded: Admin) -> None:
    body = seeded.ok("GET", "/usage/series", **WINDOW, tenant="beta")
    assert body["bucket"] == "minute"  # two hours
    assert sum(p["requests"] for p in body["data"]) == 3
    tiers = seeded.ok("GET", "/usage/series", **WINDOW, group_by="tier", top=1, bucket="day")
    assert [p["group"] for p in tiers["data"]] == ["gold"]  # 8 requests; silver has 3
    assert tiers["data"][0]["requests"] == 8
    nothing = seeded.ok("GET", "/usage/series", hours=1)  # the last hour: no records
    assert nothing["data"] == [] and nothing["groups"] == []


def read_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize("how", ["format", "accept"])
def test_series_csv(seeded: Admin, how: str) -> None:
    params: dict[str, Any] = {**WINDOW, "bucket": "hour"}
    headers = {}
    if how == "format":
        params["format"] = "csv"
    else:
        headers["accept"] = "text/csv"
    response = seeded.client.get("/admin/v1/usage/series", params=params, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    assert "attachment" in response.headers["content-disposition"]
    rows = read_csv(response.text)
    assert list(rows[0]) == list(COLUMNS)
    assert [r["start"] for r in rows] == ["2030-01-01T00:00:00Z", "2030-01-01T01:00:00Z"]
    first = rows[0]
    assert (first["requests"], first["ok"], first["prompt_tokens"]) == ("8", "5", "18")
    assert float(first["ttft_p95_ms"]) == pytest.approx(720.0)
    assert float(first["tdg_ratio"]) == pytest.approx(5.5 / 12)
    assert first["group"] == "" and first["group_id"] == ""
    explicit_json = seeded.client.get(
        "/admin/v1/usage/series", params={**WINDOW, "format": "json"}, headers=headers
    )
    assert explicit_json.headers["content-type"].startswith("application/json")


def test_empty_series_csv_is_a_header(sqlite_admin: Admin) -> None:
    response = sqlite_admin.call("GET", "/usage/series", hours=2, format="csv")
    assert response.status_code == 200
    assert response.text.strip() == ",".join(COLUMNS)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"bucket": "week"}, "bucket"),
        ({"group_by": "model"}, "group_by"),
        ({"top": 0}, "top"),
        ({"top": 51}, "top"),
        ({"format": "xml"}, "format"),
        ({"hours": 24 * 40, "bucket": "minute"}, "bucket"),  # 57,600 buckets
        ({"since": "2030-01-02T00:00:00Z", "until": "2030-01-01T00:00:00Z"}, "since"),
        ({"since": "2030-01-01T00:00:00"}, "since"),  # no offset
    ],
)
def test_bad_series_parameters_are_400(
    sqlite_admin: Admin, params: dict[str, Any], param: str
) -> None:
    assert error(sqlite_admin.call("GET", "/usage/series", **params), 400)["param"] == param


def test_an_unknown_tenant_is_404(sqlite_admin: Admin) -> None:
    error(sqlite_admin.call("GET", "/usage/series", tenant="nobody"), 404)
