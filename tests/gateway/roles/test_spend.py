"""Spend views on SQLite and PostgreSQL: the cost of usage records summed per tenant, key and
tier over time (admin API JSON and CSV, the dashboard's usage page), the same on both
databases, and a tenant admin's view holding its own tenant's keys only."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal

from sqlalchemy import insert, select

from gateway.db.models import ApiKey, UsageRecord, utcnow
from tests.gateway.usage_rows import row

from .conftest import Team


def _charge(team: Team) -> dict[str, int]:
    """Records with costs: acme's key 0.000000001 + 1.5, globex's key 2.25 (tier silver)."""
    at = utcnow() - timedelta(minutes=3)
    with team.factory.begin() as s:
        keys = dict(s.execute(select(ApiKey.tenant_id, ApiKey.id)).all())
        acme, globex = team.tenant_ids["acme"], team.tenant_ids["globex"]
        rows = [
            row(at, tenant_id=acme, api_key_id=keys[acme], cost=Decimal("0.000000001")),
            row(at, tenant_id=acme, api_key_id=keys[acme], cost=Decimal("1.5")),
            row(at, tenant_id=globex, api_key_id=keys[globex], tier="silver", cost=Decimal("2.25")),
        ]
        s.execute(insert(UsageRecord), rows)
    return {"acme": keys[acme], "globex": keys[globex]}


def test_spend_per_tenant_key_and_tier_in_the_api_and_csv(team: Team) -> None:
    keys = _charge(team)
    by_tenant = team.api("owner", "GET", "/usage/tenants").json()["data"]
    assert {r["tenant"]: r["cost"] for r in by_tenant} == {
        "acme": "1.500000001",
        "globex": "2.250000000",
    }
    by_tier = team.api("owner", "GET", "/usage/tiers").json()["data"]
    assert {r["tier"]: r["cost"] for r in by_tier}["silver"] == "2.250000000"
    series = team.api("owner", "GET", "/usage/series", params={"group_by": "key"}).json()
    assert series["group_by"] == "key"
    spent = {p["group_id"]: Decimal(p["cost"]) for p in series["data"] if p["group_id"]}
    assert spent == {keys["acme"]: Decimal("1.500000001"), keys["globex"]: Decimal("2.25")}
    names = {p["group"] for p in series["data"] if p["group_id"]}
    assert all(n.startswith("tg-") for n in names)
    text = team.api(
        "owner", "GET", "/usage/series", params={"group_by": "tenant", "format": "csv"}
    ).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {r["group"]: r["cost"] for r in rows} == {"acme": "1.500000001", "globex": "2.250000000"}


def test_a_tenant_admin_sees_its_own_keys_spend_only(team: Team) -> None:
    keys = _charge(team)
    series = team.api("tenant_admin", "GET", "/usage/series", params={"group_by": "key"}).json()
    assert {p["group_id"] for p in series["data"] if p["group_id"]} == {keys["acme"]}
    refused = team.api(
        "tenant_admin", "GET", "/usage/series", params={"group_by": "key", "tenant": "globex"}
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "other_tenant"


def test_the_usage_page_shows_spend(team: Team) -> None:
    _charge(team)
    team.sign_in("viewer")
    page = team.get("/ui/usage", params={"group_by": "key"})
    assert page.status_code == 200, page.text
    assert "Spend" in page.text and "1.500000" in page.text and "2.250000" in page.text
    charts = team.get("/ui/usage/series.json", params={"group_by": "tier"}).json()
    spend = next(c for c in charts["charts"] if c["id"] == "spend")
    totals = {line["label"]: sum(line["data"]) for line in spend["series"]}
    assert totals["silver"] == 2.25
    team.sign_in("tenant_admin")
    mine = team.get("/ui/usage", params={"group_by": "key"}).text
    assert "1.500000" in mine and "2.250000" not in mine
