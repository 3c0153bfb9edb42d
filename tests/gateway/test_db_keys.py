"""API keys: issued once, stored only hashed, authenticated through tenant and tier."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, select, update
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import crud
from gateway.db.errors import Conflict, InvalidInput, NotFound
from gateway.db.models import ApiKey, AuditLog, utcnow
from gateway.db.security import ServerSecret, hash_key, secret_id

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


# -- key rotation ---------------------------------------------------------------------------


def _prefix(key: str) -> str:
    return key.split("-")[1]


def test_rotation_issues_a_successor_and_gives_the_old_key_a_grace_period(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    old = _issue(session_factory, server_secret, tenant, name="ci")
    now = utcnow()
    with session_factory.begin() as s:
        created = crud.rotate_key(
            s, _prefix(old), actor=ACTOR, secret=server_secret, grace_s=3600, now=now
        )
        new = created.plaintext
        assert created.api_key.name == f"ci (rotated from tg-{_prefix(old)})"
        assert created.api_key.expires_at is None and created.api_key.tenant_id is not None
    assert new != old and new not in repr(created)
    with session_factory() as s:
        during = now + timedelta(minutes=59)
        for key in (old, new):  # both work during the grace period, for the same tenant
            identity = crud.authenticate(s, server_secret, key, now=during, touch=False)
            assert identity is not None and identity.tenant_name == "acme"
        assert crud.get_key(s, _prefix(old)).expires_at == now + timedelta(hours=1)
        after = now + timedelta(hours=1, seconds=1)
        assert crud.authenticate(s, server_secret, old, now=after, touch=False) is None
        assert crud.authenticate(s, server_secret, new, now=after, touch=False) is not None
        audit = select(AuditLog).where(AuditLog.entity_type == "api_key").order_by(AuditLog.id)
        rows = s.scalars(audit).all()
    assert [(r.action, r.actor) for r in rows] == [
        ("create", ACTOR),
        ("create", ACTOR),
        ("rotate", ACTOR),
    ]
    rotate = rows[2]
    assert rotate.before is not None and rotate.before["expires_at"] is None
    assert rotate.after is not None and rotate.after["rotated_to"] == _prefix(new)
    assert rotate.after["expires_at"] == (now + timedelta(hours=1)).isoformat()
    assert "key_hash" not in rotate.after and new not in str(rotate.after)


def test_rotation_never_extends_an_earlier_expiry_and_names_do_not_stack(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    now = utcnow()
    soon = now + timedelta(minutes=10)
    old = _issue(session_factory, server_secret, tenant, name="app", expires_at=soon)
    unnamed = _issue(session_factory, server_secret, tenant)
    with session_factory.begin() as s:
        first = crud.rotate_key(s, _prefix(old), actor=ACTOR, secret=server_secret, now=now)
        assert crud.get_key(s, _prefix(old)).expires_at == soon  # 24 h grace: later than soon
        second = crud.rotate_key(
            s, first.api_key.prefix, actor=ACTOR, secret=server_secret, grace_s=0, now=now
        )
        assert second.api_key.name == f"app (rotated from tg-{first.api_key.prefix})"
        assert crud.get_key(s, first.api_key.prefix).expires_at == now  # grace 0: at once
        third = crud.rotate_key(s, _prefix(unnamed), actor=ACTOR, secret=server_secret, now=now)
        assert third.api_key.name == f"key (rotated from tg-{_prefix(unnamed)})"
    with session_factory() as s:
        assert crud.authenticate(s, server_secret, first.plaintext, now=now, touch=False) is None


def test_rotation_refuses_revoked_expired_unknown_keys_and_bad_grace(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    now = utcnow()
    revoked = _issue(session_factory, server_secret, tenant)
    expiring = _issue(session_factory, server_secret, tenant, expires_at=now + timedelta(seconds=5))
    with session_factory.begin() as s:
        crud.revoke_key(s, _prefix(revoked), actor=ACTOR)
    later = now + timedelta(seconds=6)
    cases: list[tuple[str, dict[str, Any], type[Exception], str]] = [
        (_prefix(revoked), {}, Conflict, "is revoked; create a new key"),
        (_prefix(expiring), {"now": later}, Conflict, "has expired; create a new key"),
        ("zzzzzzzz", {}, NotFound, "does not exist"),
        (_prefix(expiring), {"grace_s": -1}, InvalidInput, "grace_s must be a number"),
        (_prefix(expiring), {"grace_s": 400 * 86400}, InvalidInput, "366 days"),
        (_prefix(expiring), {"grace_s": True}, InvalidInput, "grace_s"),
    ]
    for ref, options, error, message in cases:
        with session_factory.begin() as s, pytest.raises(error, match=message):
            crud.rotate_key(s, ref, actor=ACTOR, secret=server_secret, **options)
    with session_factory() as s:  # nothing was issued or changed
        assert len(crud.list_keys(s)) == 2
        assert s.scalars(select(AuditLog.action).where(AuditLog.action == "rotate")).all() == []


# -- server secret rotation -------------------------------------------------------------------


def _stored(factory: sessionmaker[Session], key: str) -> tuple[str, str | None]:
    with factory() as s:
        row = crud.get_key(s, _prefix(key))
        return row.key_hash, row.secret_id


def test_a_key_under_a_previous_secret_works_and_is_rehashed_on_use(
    session_factory: sessionmaker[Session], tenant: str
) -> None:
    old_secret, new_secret = "secret-A-" + "x" * 30, "secret-B-" + "y" * 30
    key = _issue(session_factory, old_secret, tenant)
    idle = _issue(session_factory, old_secret, tenant)  # never used after the rotation
    assert _stored(session_factory, key) == (hash_key(old_secret, key), secret_id(old_secret))
    rotated = ServerSecret(new_secret, [old_secret])
    with session_factory() as s:
        assert crud.authenticate(s, new_secret, key, touch=False) is None  # needs PREVIOUS
        status = crud.secret_status(s, rotated)
    assert (status.current, status.previous, status.unrecorded, status.other) == (0, (2,), 0, 0)
    assert status.waiting == 2
    with session_factory.begin() as s:  # in-session re-hash: committed with the caller
        identity = crud.authenticate(s, rotated, key)
        assert identity is not None and identity.tenant_name == "acme"
    assert _stored(session_factory, key) == (hash_key(new_secret, key), secret_id(new_secret))
    with session_factory() as s:
        assert crud.authenticate(s, new_secret, key, touch=False) is not None  # PREVIOUS gone
        assert crud.authenticate(s, old_secret, key, touch=False) is None
        status = crud.secret_status(s, rotated)
        assert (status.current, status.previous, status.waiting) == (1, (1,), 1)
        assert crud.secret_status(s, new_secret).other == 1  # idle: no configured secret
        assert crud.authenticate(s, new_secret, idle, touch=False) is None
    with session_factory.begin() as s:  # a revoked key no longer counts as waiting
        crud.revoke_key(s, _prefix(idle), actor=ACTOR)
    with session_factory() as s:
        assert crud.secret_status(s, rotated).waiting == 0


def test_a_read_only_caller_rehashes_in_its_own_transaction(
    session_factory: sessionmaker[Session], tenant: str
) -> None:
    """What the auth cache does: a plain read session, never committed; the re-hash sticks."""
    key = _issue(session_factory, "old-secret-" + "a" * 30, tenant)
    rotated = ServerSecret("new-secret-" + "b" * 30, ["old-secret-" + "a" * 30])
    with session_factory() as s:
        identity = crud.authenticate(s, rotated, key, touch=False, rehash_in=session_factory)
        assert identity is not None
        s.rollback()  # the caller's own transaction is thrown away
    assert _stored(session_factory, key) == (hash_key(rotated, key), secret_id(rotated))


def test_keys_issued_before_secrets_were_recorded_are_stamped_on_use(
    session_factory: sessionmaker[Session], server_secret: str, tenant: str
) -> None:
    key = _issue(session_factory, server_secret, tenant)
    with session_factory.begin() as s:
        s.execute(update(ApiKey).values(secret_id=None))  # as migration 0006 leaves them
    with session_factory() as s:
        status = crud.secret_status(s, server_secret)
        assert (status.current, status.unrecorded, status.waiting) == (0, 1, 1)
    with session_factory.begin() as s:
        assert crud.authenticate(s, server_secret, key) is not None
    assert _stored(session_factory, key) == (hash_key(server_secret, key), secret_id(server_secret))
    with session_factory() as s:
        assert crud.secret_status(s, server_secret).waiting == 0
