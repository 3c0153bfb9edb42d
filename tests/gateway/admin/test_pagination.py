"""List routes paginate: ``limit``/``offset`` windows of a stable order, the total in
``x-total-count``, bad values 400 — and the crud ``list_*``/``count_*`` they stand on."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import crud
from gateway.db.errors import InvalidInput

from .support import Admin, error

ACTOR = "test:pages"


def names(body: dict[str, Any], field: str = "name") -> list[Any]:
    return [row[field] for row in body["data"]]


def pages(admin: Admin, path: str, size: int, field: str = "name", **filters: Any) -> list[Any]:
    """Walk every page of ``path``; each page's header states the same total."""
    seen: list[Any] = []
    offset = 0
    while True:
        response = admin.call("GET", path, limit=size, offset=offset, **filters)
        assert response.status_code == 200, response.text
        total = int(response.headers["x-total-count"])
        page = names(response.json(), field)
        assert len(page) <= size
        seen += page
        offset += size
        if offset >= total:
            assert len(seen) == total
            return seen


def test_tenants_and_tiers_page_in_their_order_with_totals(admin: Admin) -> None:
    for i, weight in enumerate((1.0, 5.0, 3.0, 2.0, 4.0)):
        admin.tier(f"tier{i}", weight=weight)
    for i in range(7):
        admin.tenant(f"t{(i * 5) % 7}", "tier0" if i % 2 else "tier1")
    everything = admin.ok("GET", "/tenants")  # no limit: the whole list, as before
    assert names(everything) == [f"t{i}" for i in range(7)]
    assert pages(admin, "/tenants", 3) == names(everything)
    first = admin.call("GET", "/tenants", limit=2, offset=0)
    assert first.headers["x-total-count"] == "7"
    assert names(first.json()) == ["t0", "t1"]
    assert names(admin.ok("GET", "/tenants", limit=2, offset=6)) == ["t6"]
    assert names(admin.ok("GET", "/tenants", limit=2, offset=7)) == []  # past the end: empty
    filtered = admin.call("GET", "/tenants", tier="tier0", limit=1)
    assert filtered.headers["x-total-count"] == "3"  # the filter's total, not the table's
    assert pages(admin, "/tiers", 2) == ["tier1", "tier4", "tier2", "tier3", "tier0"]
    assert admin.call("GET", "/tiers").headers["x-total-count"] == "5"


def test_keys_page_newest_first_and_backends_by_name(admin: Admin) -> None:
    admin.tier()
    admin.tenant()
    admin.tenant("other")
    made = [admin.key(name=f"k{i}")["prefix"] for i in range(5)]
    made.append(admin.key("other", name="k5")["prefix"])
    listed = pages(admin, "/keys", 4, field="prefix")
    assert listed == list(reversed(made))  # newest first
    only = admin.call("GET", "/keys", tenant="acme", limit=2, offset=2)
    assert only.headers["x-total-count"] == "5"
    assert names(only.json(), "prefix") == [made[2], made[1]]
    for name in ("b2", "b0", "b1"):
        admin.backend(name)
    assert pages(admin, "/backends", 2) == ["b0", "b1", "b2"]


def test_audit_pages_with_offset_and_until(admin: Admin) -> None:
    for i in range(6):
        admin.tier(f"g{i}")
    whole = admin.ok("GET", "/audit", limit=1000)
    assert len(whole["data"]) == 6
    ids = [row["id"] for row in whole["data"]]
    assert ids == sorted(ids, reverse=True)  # newest first
    assert pages(admin, "/audit", 4, field="id") == ids
    until = whole["data"][2]["at"]
    older = admin.call("GET", "/audit", until=until)
    assert all(row["at"] < until for row in older.json()["data"])
    assert int(older.headers["x-total-count"]) == len(older.json()["data"])


@pytest.mark.parametrize("path", ["/tiers", "/tenants", "/keys", "/backends", "/audit"])
@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": -1}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": 1.5}, "limit"),
        ({"offset": -1}, "offset"),
        ({"offset": "x"}, "offset"),
        ({"offset": 2**31}, "offset"),
    ],
)
def test_bad_pages_are_400_naming_the_parameter(
    sqlite_admin: Admin, path: str, params: dict[str, Any], param: str
) -> None:
    body = error(sqlite_admin.call("GET", path, **params), 400)
    assert body["param"] == param


@pytest.mark.parametrize("path", ["/tiers", "/tenants", "/keys", "/backends"])
def test_a_page_beyond_200_rows_is_400(sqlite_admin: Admin, path: str) -> None:
    assert error(sqlite_admin.call("GET", path, limit=201), 400)["param"] == "limit"
    assert sqlite_admin.call("GET", path, limit=200).status_code == 200


def test_crud_lists_and_counts(session_factory: sessionmaker[Session], server_secret: str) -> None:
    with session_factory.begin() as s:
        crud.create_tier(s, actor=ACTOR, name="gold", weight=2, ttft_ms=100, tpot_ms=10)
        for i in range(5):
            crud.create_tenant(s, actor=ACTOR, name=f"c{i}", tier="gold")
            crud.create_key(s, actor=ACTOR, tenant=f"c{i}", secret=server_secret, name=f"k{i}")
    with session_factory() as s:
        assert [t.name for t in crud.list_tenants(s, limit=2, offset=1)] == ["c1", "c2"]
        assert len(crud.list_tenants(s)) == crud.count_tenants(s) == 5
        assert crud.count_tenants(s, tier="gold", status="active") == 5
        assert crud.count_tenants(s, status="suspended") == 0
        keys = crud.list_keys(s)
        assert [k.name for k in keys] == [f"k{i}" for i in reversed(range(5))]
        assert [k.name for k in crud.list_keys(s, limit=2, offset=3)] == ["k1", "k0"]
        assert crud.count_keys(s, tenant="c3") == 1
        assert crud.count_keys(s, active_only=True) == 5
        assert crud.count_tiers(s) == 1 and crud.count_backends(s) == 0
        assert crud.count_audit(s) == 11  # a tier, five tenants, five keys
        assert crud.count_audit(s, entity_type="tenant") == 5
        assert len(crud.list_audit(s, limit=3, offset=9)) == 2
        for kwargs in ({"limit": 0}, {"offset": -1}, {"limit": True}):
            with pytest.raises(InvalidInput):
                crud.list_keys(s, **kwargs)
