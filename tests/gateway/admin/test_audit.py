"""``/audit``: every change with its actor, before and after; the listing's filters."""

from __future__ import annotations

from datetime import timedelta

from gateway.db.models import utcnow

from .support import ACTOR, Admin, error


def test_audit_entries_carry_actor_and_before_after(admin: Admin) -> None:
    gold = admin.tier()
    admin.ok("PATCH", "/tiers/gold", {"weight": 4.0})
    admin.backend()
    entries = admin.audit(entity_type="tier", entity_id=gold["id"])
    assert [e["action"] for e in entries] == ["update", "create"]
    update, create = entries
    assert all(e["actor"] == ACTOR and e["object"] == "audit_entry" for e in entries)
    assert create["before"] is None and create["after"]["weight"] == 3.0
    assert (update["before"]["weight"], update["after"]["weight"]) == (3.0, 4.0)
    assert len(admin.audit()) == 3
    assert len(admin.audit(limit=1)) == 1
    assert admin.audit(actor="someone-else") == []
    future = (utcnow() + timedelta(hours=1)).isoformat()
    assert admin.audit(since=future) == []
    assert error(admin.call("GET", "/audit", limit=0), 400)["param"] == "limit"
