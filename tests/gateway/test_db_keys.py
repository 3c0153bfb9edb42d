"""API keys: issued once, stored only hashed, authenticated through tenant and tier."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, MetaData, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import crud
from gateway.db.errors import InvalidInput, NotFound
from gateway.db.models import ApiKey, AuditLog, utcnow
from gateway.db.security import hash_key

ACTOR = "test:bob"


@pytest.fixture
def tenant(session_factory: sessionmaker[Session]) -> str:
    with session_factory.begin() as s:
        crud.create_tier(
            s,
            actor=ACTOR,
            name="gold",
            weight=3,
            ttft_ms=800,
            tpot_ms=40,
            deadline_ms=60_000,
            rpm_limit=60,
            best_effort_allowed=True,
        )
        crud.create_tenant(s, actor=ACTOR, name="acme", tier="gold", tpm_limit=5000)
    return "acme"


def _issue(
    factory: sessionmaker[Session],
    secret: str,
    tenant: str,
    *,
    name: str | None = None,
    expires_at: datetime | None = None,
) -> str:
    with factory.begin() as s:
        created = crud.create_key(
            s, actor=ACTOR, tenant=tenant, secret=secret, name=name, expires_at=expires_at
        )
        return created.plaintext


def _all_stored_text(engine: Engine) -> str:
    """Every value in every table, as text: where a leaked key would show up."""
    metadata = MetaData()
    metadata.reflect(engine)
    chunks: list[str] = []
    with engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(select(table)):
                chunks.extend(str(v) for v in row)
    return "\n".join(chunks)


def test_plaintext_is_never_stored(
    db_engine: Engine, session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    key = _issue(session_factory, server_secret, tenant, name="ci")
    secret_part = key.split("-", 2)[2]
    stored = _all_stored_text(db_engine)
    assert key not in stored and secret_part not in stored
    with session_factory() as s:
        row = s.scalars(select(ApiKey)).one()
        assert row.key_hash == hash_key(server_secret, key)
        assert key.startswith(f"tg-{row.prefix}-")
        audit = s.scalars(select(AuditLog).where(AuditLog.entity_type == "api_key")).one()
        assert audit.after is not None and "key_hash" not in audit.after
        assert audit.after["prefix"] == row.prefix
    assert row.key_hash not in stored.replace(row.key_hash, "", 1)  # only in its own column


def test_authenticate_resolves_tenant_tier_and_policy(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    key = _issue(session_factory, server_secret, tenant)
    with session_factory.begin() as s:
        identity = crud.authenticate(s, server_secret, key)
    assert identity is not None
    assert (identity.tenant_name, identity.tier_name) == ("acme", "gold")
    assert key.startswith(f"tg-{identity.key_prefix}-")
    p = identity.policy
    assert (p.weight, p.ttft_ms, p.tpot_ms, p.deadline_ms) == (3.0, 800.0, 40.0, 60_000.0)
    assert (p.rpm_limit, p.tpm_limit, p.max_concurrency) == (60, 5000, None)
    assert p.best_effort_allowed is True
    with pytest.raises(AttributeError):
        identity.tenant_name = "other"  # type: ignore[misc]
    with session_factory() as s:
        assert s.get(ApiKey, identity.key_id).last_used_at is not None  # type: ignore[union-attr]


def test_authenticate_refuses_unknown_malformed_and_wrong_secret(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    key = _issue(session_factory, server_secret, tenant)
    tampered = key[:-1] + ("A" if key[-1] != "A" else "B")
    with session_factory() as s:
        for presented in (tampered, "tg-abcd1234-nope", "", "Bearer " + key, key + " "):
            assert crud.authenticate(s, server_secret, presented) is None, presented
        assert crud.authenticate(s, server_secret + "x", key) is None
        assert crud.authenticate(s, server_secret, key) is not None


def test_revoked_key_is_refused(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    key = _issue(session_factory, server_secret, tenant)
    prefix = key.split("-")[1]
    with session_factory.begin() as s:
        revoked = crud.revoke_key(s, f"tg-{prefix}", actor=ACTOR)
        first_revocation = revoked.revoked_at
        assert crud.revoke_key(s, prefix, actor=ACTOR).revoked_at == first_revocation
    with session_factory() as s:
        assert crud.authenticate(s, server_secret, key) is None
        actions = s.scalars(select(AuditLog.action).where(AuditLog.entity_type == "api_key"))
        assert list(actions) == ["create", "revoke"]  # the second revoke was a no-op
        assert crud.list_keys(s, active_only=True) == []
        with pytest.raises(NotFound, match="API key 'zzzzzzzz' does not exist"):
            crud.revoke_key(s, "zzzzzzzz", actor=ACTOR)


def test_expired_key_is_refused(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    now = utcnow()
    key = _issue(session_factory, server_secret, tenant, expires_at=now + timedelta(days=1))
    with session_factory() as s:
        assert crud.authenticate(s, server_secret, key, now=now, touch=False) is not None
        later = now + timedelta(days=1, seconds=1)
        assert crud.authenticate(s, server_secret, key, now=later, touch=False) is None
        assert crud.list_keys(s, active_only=True, now=later) == []
        with pytest.raises(InvalidInput, match="expires_at must be in the future"):
            crud.create_key(
                s,
                actor=ACTOR,
                tenant=tenant,
                secret=server_secret,
                expires_at=now - timedelta(seconds=1),
            )
        with pytest.raises(InvalidInput, match="timezone-aware"):
            crud.create_key(
                s,
                actor=ACTOR,
                tenant=tenant,
                secret=server_secret,
                expires_at=(now + timedelta(days=1)).replace(tzinfo=None),
            )


def test_suspended_tenant_is_refused_until_activated(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    key = _issue(session_factory, server_secret, tenant)
    with session_factory.begin() as s:
        crud.suspend_tenant(s, tenant, actor=ACTOR)
    with session_factory.begin() as s:
        assert crud.authenticate(s, server_secret, key) is None
        crud.activate_tenant(s, tenant, actor=ACTOR)
    with session_factory() as s:
        assert crud.authenticate(s, server_secret, key) is not None


def test_deleting_a_tenant_deletes_its_keys(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    key = _issue(session_factory, server_secret, tenant)
    with session_factory.begin() as s:
        crud.delete_tenant(s, tenant, actor=ACTOR)
    with session_factory() as s:
        assert s.scalars(select(ApiKey)).all() == []
        assert crud.authenticate(s, server_secret, key) is None


def test_list_rename_and_delete(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    first = _issue(session_factory, server_secret, tenant, name="one")
    _issue(session_factory, server_secret, tenant, name="two")
    with session_factory.begin() as s:
        assert {k.name for k in crud.list_keys(s, tenant=tenant)} == {"one", "two"}
        prefix = first.split("-")[1]
        crud.update_key(s, prefix, {"name": "renamed"}, actor=ACTOR)
        assert crud.get_key(s, prefix).name == "renamed"
        crud.delete_key(s, prefix, actor=ACTOR)
        assert [k.name for k in crud.list_keys(s)] == ["two"]
        with pytest.raises(InvalidInput, match="cannot update api_key field"):
            crud.update_key(s, crud.list_keys(s)[0].id, {"key_hash": "0" * 64}, actor=ACTOR)
