"""Budgets through the admin API on SQLite and PostgreSQL: staff set them (audited), each answer
shows the current period's spend and state, a tenant admin reads only its own tenant's, bad
input is a 4xx naming the field, and the gateway's guard reads them (and the spend so far)
from the database."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import insert, select

from gateway.db.models import ApiKey, UsageRecord, utcnow
from gateway.limits.budget import BudgetExceeded
from tests.gateway.usage_rows import row

from .conftest import Team


def _spend(team: Team, tenant: str, amount: str) -> None:
    with team.factory.begin() as s:
        tenant_id = team.tenant_ids[tenant]
        key_id = s.scalar(select(ApiKey.id).where(ApiKey.tenant_id == tenant_id))
        at = utcnow() - timedelta(seconds=5)
        record = row(at, tenant_id=tenant_id, api_key_id=key_id, cost=Decimal(amount))
        s.execute(insert(UsageRecord), [record])


def test_budgets_are_set_read_changed_and_deleted(team: Team) -> None:
    _spend(team, "acme", "0.85")
    made = team.api(
        "operator",
        "POST",
        "/budgets",
        json={"tenant": "acme", "period": "day", "amount": "1", "soft_fraction": 0.8},
    )
    assert made.status_code == 201, made.text
    budget = made.json()
    assert (budget["amount"], budget["spent"], budget["state"]) == (
        "1.000000000",
        "0.850000000",
        "soft",
    )
    assert budget["resets_at"] > budget["period_start"]
    key = team.prefix("acme")
    by_key = team.api(
        "owner", "POST", "/budgets", json={"key": key, "period": "month", "amount": 0.5}
    ).json()
    assert (by_key["key"], by_key["tenant"], by_key["state"]) == (f"tg-{key}", "acme", "exhausted")
    again = team.api(
        "owner", "POST", "/budgets", json={"tenant": "acme", "period": "day", "amount": 2}
    )
    assert again.status_code == 409
    changed = team.api("owner", "PATCH", f"/budgets/{budget['id']}", json={"amount": "2.5"})
    assert changed.json()["state"] == "ok" and changed.json()["amount"] == "2.500000000"
    listed = team.api("viewer", "GET", "/budgets")
    assert listed.headers["x-total-count"] == "2"
    assert team.api("owner", "DELETE", f"/budgets/{by_key['id']}").status_code == 200
    assert team.api("owner", "GET", f"/budgets/{by_key['id']}").status_code == 404
    audit = team.api("owner", "GET", "/audit", params={"entity_type": "budget"}).json()["data"]
    actions = [
        (e["action"], e["actor"].split("@")[0]) for e in audit if e["entity_type"] == "budget"
    ]
    assert sorted(actions) == sorted(
        [
            ("create", "admin-api:oscar"),
            ("create", "admin-api:olivia"),
            ("update", "admin-api:olivia"),
            ("delete", "admin-api:olivia"),
        ]
    )


def test_a_tenant_admin_reads_its_own_budgets_only(team: Team) -> None:
    ids = {}
    for tenant in ("acme", "globex"):
        made = team.api(
            "owner", "POST", "/budgets", json={"tenant": tenant, "period": "month", "amount": 9}
        )
        ids[tenant] = made.json()["id"]
    mine = team.api("tenant_admin", "GET", "/budgets").json()["data"]
    assert [b["tenant"] for b in mine] == ["acme"]
    assert team.api("tenant_admin", "GET", f"/budgets/{ids['acme']}").status_code == 200
    for path in (f"/budgets/{ids['globex']}", "/budgets/99999"):  # another's and none alike
        refused = team.api("tenant_admin", "GET", path)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "other_tenant"
    other = team.api("tenant_admin", "GET", "/budgets", params={"tenant": "globex"})
    assert other.status_code == 403
    write = team.api(
        "tenant_admin", "POST", "/budgets", json={"tenant": "acme", "period": "day", "amount": 1}
    )
    assert write.json()["error"]["code"] == "permission_denied"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tenant": "acme", "period": "week", "amount": 1}, "period"),
        ({"tenant": "acme", "period": "day", "amount": "0"}, "amount"),
        ({"tenant": "acme", "period": "day", "amount": "1.0000001"}, "amount"),
        ({"tenant": "acme", "period": "day", "amount": 1, "soft_fraction": 1.5}, "soft_fraction"),
        ({"tenant": "acme", "period": "day", "amount": 1, "webhook_url": "ftp://x"}, "webhook_url"),
        ({"period": "day", "amount": 1}, "tenant"),
        ({"tenant": "globex", "key": "PLACEHOLDER", "period": "day", "amount": 1}, "key"),
    ],
)
def test_bad_budgets_are_400_naming_the_field(
    sqlite_team: Team, body: dict[str, object], param: str
) -> None:
    if body.get("key") == "PLACEHOLDER":
        body["key"] = sqlite_team.prefix("acme")
    refused = sqlite_team.api("owner", "POST", "/budgets", json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param


def test_the_gateways_guard_reads_the_budgets_and_the_spend_so_far(team: Team) -> None:
    _spend(team, "acme", "0.95")
    made = team.api(
        "owner", "POST", "/budgets", json={"tenant": "acme", "period": "day", "amount": 1}
    )
    assert made.status_code == 201
    guard = team.app.state.gateway.budgets
    acme = team.tenant_ids["acme"]

    async def admit(cost: str) -> object:
        return await guard.reserve(acme, None, Decimal(cost))

    with pytest.raises(BudgetExceeded) as refused:
        asyncio.run(admit("0.10"))  # 0.95 spent + 0.10 > 1
    assert refused.value.headers()["x-tiergate-reject-reason"] == "budget_exceeded"
    assert asyncio.run(admit("0.05")) is not None
    assert asyncio.run(guard.reserve(team.tenant_ids["globex"], None, Decimal(5))) is None
