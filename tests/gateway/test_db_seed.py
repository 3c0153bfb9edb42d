"""Seeding the default tiers and the demo tenant is idempotent and leaves edits alone."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import crud
from gateway.db.models import AuditLog
from gateway.db.seed import DEFAULT_TIERS, DEMO_TENANT, DEMO_TIER, seed_defaults


def test_seed_is_idempotent(session_factory: sessionmaker[Session], server_secret: str) -> None:
    with session_factory.begin() as s:
        first = seed_defaults(s)
    assert first.created_tiers == [t["name"] for t in DEFAULT_TIERS]
    assert first.created_demo_tenant and first.demo_key_needed
    with session_factory.begin() as s:
        tiers = {t.name: t for t in crud.list_tiers(s)}
        assert [t.name for t in crud.list_tiers(s)] == ["premium", "standard", "batch"]
        assert tiers["batch"].best_effort_allowed and tiers["batch"].deadline_ms is not None
        assert not tiers["premium"].best_effort_allowed
        assert crud.get_tenant(s, DEMO_TENANT).tier.name == DEMO_TIER
        crud.update_tier(s, "premium", {"weight": 8.0}, actor="ops")  # an operator's edit
        audit_rows = s.scalar(select(func.count()).select_from(AuditLog))
    with session_factory.begin() as s:
        second = seed_defaults(s)
        assert second.created_tiers == [] and not second.created_demo_tenant
        assert second.demo_key_needed  # still no key
        crud.create_key(s, actor="test", tenant=DEMO_TENANT, secret=server_secret)
    with session_factory.begin() as s:
        third = seed_defaults(s)
        assert not third.demo_key_needed
        assert crud.get_tier(s, "premium").weight == 8.0
        # Nothing re-created: only the key's audit row was added since.
        assert s.scalar(select(func.count()).select_from(AuditLog)) == (audit_rows or 0) + 1
