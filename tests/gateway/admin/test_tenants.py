"""``/tenants``: overrides and effective policy, references, filters, suspend/activate."""

from __future__ import annotations

from typing import Any

from gateway.db import crud

from .support import Admin, error


def test_tenant_crud_overrides_and_effective_policy(admin: Admin) -> None:
    gold = admin.tier(min_ttft_ms=200.0, rpm_limit=60)
    admin.tier("free", weight=1.0, ttft_ms=5000.0)
    acme = admin.tenant(tier=gold["id"], ttft_ms=300.0)
    assert (acme["object"], acme["tier"], acme["status"]) == ("tenant", "gold", "active")
    assert acme["effective"]["ttft_ms"] == 300.0 and acme["effective"]["rpm_limit"] == 60
    assert admin.ok("GET", f"/tenants/{acme['id']}") == admin.ok("GET", "/tenants/acme")

    err = error(admin.call("PATCH", "/tenants/acme", {"ttft_ms": 100.0}), 400)
    assert err["param"] == "ttft_ms" and "tighter" in err["message"]
    patched = admin.ok("PATCH", "/tenants/acme", {"rpm_limit": 10, "ttft_ms": None})
    assert patched["effective"]["rpm_limit"] == 10 and patched["effective"]["ttft_ms"] == 800.0
    moved = admin.ok("PATCH", "/tenants/acme", {"tier": "free", "name": "acme2"})
    assert (moved["tier"], moved["name"], moved["effective"]["weight"]) == ("free", "acme2", 1.0)
    assert error(admin.call("PATCH", "/tenants/acme2", {"tier": None}), 400)["param"] == "tier"
    assert error(admin.call("PATCH", "/tenants/acme2", {"tier": "nope"}), 404)["param"] == "tier"
    assert (
        error(admin.call("PATCH", "/tenants/acme2", {"status": "suspended"}), 400)["code"]
        == "unknown_parameter"
    )  # status changes through the audited actions only


def test_tenant_conflicts_and_bad_references(admin: Admin) -> None:
    admin.tier()
    admin.tenant()
    assert (
        error(admin.call("POST", "/tenants", {"name": "acme", "tier": "gold"}), 409)["code"]
        == "already_exists"
    )
    err = error(admin.call("POST", "/tenants", {"name": "x", "tier": "platinum"}), 404)
    assert err["param"] == "tier"
    assert error(admin.call("POST", "/tenants", {"name": "x", "tier": 0}), 400)["param"] == "tier"
    err = error(admin.call("POST", "/tenants", {"name": "x", "tier": "gold", "status": "?"}), 400)
    assert err["param"] == "status"


def test_tenant_list_filters(admin: Admin) -> None:
    admin.tier()
    admin.tier("free", weight=1.0)
    for name, tier in [("a", "gold"), ("b", "free"), ("c", "gold")]:
        admin.tenant(name, tier)
    admin.ok("POST", "/tenants/c/suspend")

    def names(**q: Any) -> list[str]:
        return [t["name"] for t in admin.ok("GET", "/tenants", **q)["data"]]

    assert names() == ["a", "b", "c"]
    assert names(tier="gold") == ["a", "c"]
    assert names(tier="gold", status="active") == ["a"]
    assert names(status="suspended") == ["c"]
    assert error(admin.call("GET", "/tenants", status="gone"), 400)["param"] == "status"
    assert error(admin.call("GET", "/tenants", tier="nope"), 404)["param"] == "tier"


def test_suspend_and_activate_invalidate_the_tenants_keys_at_once(admin: Admin) -> None:
    admin.tier()
    admin.tenant()
    keys = [admin.key(), admin.key()]
    bare = sorted(k["prefix"].removeprefix("tg-") for k in keys)
    suspended = admin.ok("POST", "/tenants/acme/suspend")
    assert suspended["status"] == "suspended"
    assert sorted(p for p in admin.state.auth.invalidated if p is not None) == bare
    with admin.state.session_factory() as s:
        assert crud.authenticate(s, admin.state.secret, keys[0]["key"], touch=False) is None
    admin.state.auth.invalidated.clear()
    assert admin.ok("POST", "/tenants/acme/activate")["status"] == "active"
    assert sorted(p for p in admin.state.auth.invalidated if p is not None) == bare
    with admin.state.session_factory() as s:
        assert crud.authenticate(s, admin.state.secret, keys[0]["key"], touch=False) is not None
    actions = [e["action"] for e in admin.audit(entity_type="tenant")]
    assert actions == ["activate", "suspend", "create"]


def test_deleting_a_tenant_deletes_its_keys_and_invalidates_them(admin: Admin) -> None:
    admin.tier()
    acme = admin.tenant()
    key = admin.key()
    deleted = admin.ok("DELETE", "/tenants/acme")
    assert deleted == {"object": "tenant", "id": acme["id"], "name": "acme", "deleted": True}
    assert admin.state.auth.invalidated == [key["prefix"].removeprefix("tg-")]
    assert admin.ok("GET", "/keys")["data"] == []
    error(admin.call("DELETE", "/tenants/acme"), 404)


def test_all_digit_refs_are_ids_and_names_cannot_be_all_digits(admin: Admin) -> None:
    """A tenant or tier named "2" cannot shadow id 2: an all-digit ref is always an id, and
    new names made only of digits are refused (a row named so before stays reachable by id)."""
    first = admin.tier()
    for path, body in (
        ("/tiers", {"name": "2", "weight": 1.0, "ttft_ms": 800.0, "tpot_ms": 40.0}),
        ("/tenants", {"name": "2", "tier": "gold"}),
    ):
        assert error(admin.call("POST", path, body), 400)["param"] == "name"
    acme = admin.tenant()
    assert error(admin.call("PATCH", "/tenants/acme", {"name": "007"}), 400)["param"] == "name"
    # a row named "<digits>" written before the rule (straight into the table)
    with admin.state.session_factory.begin() as s:
        legacy = crud.get_tenant(s, acme["id"])
        legacy.name = str(acme["id"] + 1)
    other = admin.tenant("other")
    assert other["id"] == acme["id"] + 1
    got = admin.ok("GET", f"/tenants/{other['id']}")
    assert got["name"] == "other"  # id wins over the legacy name
    admin.ok("PATCH", f"/tenants/{other['id']}", {"ttft_ms": 900.0})
    assert admin.ok("GET", f"/tenants/{acme['id']}")["name"] == str(acme["id"] + 1)
    assert admin.ok("GET", f"/tenants/{other['id']}")["ttft_ms"] == 900.0
    assert admin.ok("GET", f"/tiers/{first['id']}")["name"] == "gold"
