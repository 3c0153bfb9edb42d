"""API keys: issue (plaintext returned once), list, revoke, delete, and authenticate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from gateway.db.crud._common import (
    add_audited,
    check_aware,
    check_fields,
    check_optional_text,
    delete_audited,
    lock,
    record_change,
    snapshot,
)
from gateway.db.crud.tenants import get_tenant
from gateway.db.errors import AlreadyExists, InvalidInput, NotFound
from gateway.db.identity import KeyIdentity
from gateway.db.models import ApiKey, Tenant, utcnow
from gateway.db.security import generate_key, hash_key, hashes_equal, normalize_prefix, parse_prefix

ENTITY = "api_key"
UPDATABLE = ("name", "expires_at")
_PREFIX_ATTEMPTS = 8  # 36^8 prefixes: a collision is rare, eight in a row is impossible in practice


@dataclass(frozen=True, slots=True)
class CreatedKey:
    """The stored key and its plaintext — the only time the plaintext exists server-side."""

    api_key: ApiKey
    plaintext: str

    def __repr__(self) -> str:
        return f"CreatedKey(prefix={self.api_key.prefix!r}, plaintext=<hidden>)"


def _audit_view(key: ApiKey) -> dict[str, Any]:
    return snapshot(key, exclude=("key_hash", "last_used_at"))


def get_key(session: Session, ref: int | str) -> ApiKey:
    """A key by id (int) or prefix (str: ``abcd1234`` or ``tg-abcd1234``)."""
    if isinstance(ref, int):
        key = session.get(ApiKey, ref)
    else:
        key = session.scalar(select(ApiKey).where(ApiKey.prefix == normalize_prefix(ref)))
    if key is None:
        raise NotFound(f"API key {ref!r} does not exist", param="key")
    return key


def list_keys(
    session: Session,
    *,
    tenant: int | str | None = None,
    active_only: bool = False,
    now: datetime | None = None,
) -> list[ApiKey]:
    """Keys (newest first), optionally of one tenant and only the usable ones."""
    query = (
        select(ApiKey)
        .options(joinedload(ApiKey.tenant))
        .order_by(ApiKey.created_at.desc(), ApiKey.id.desc())
    )
    if tenant is not None:
        query = query.where(ApiKey.tenant_id == get_tenant(session, tenant).id)
    if active_only:
        now = now or utcnow()
        query = query.where(ApiKey.revoked_at.is_(None)).where(
            (ApiKey.expires_at.is_(None)) | (ApiKey.expires_at > now)
        )
    return list(session.scalars(query))


def create_key(
    session: Session,
    *,
    actor: str,
    tenant: int | str,
    secret: str | bytes,
    name: str | None = None,
    expires_at: datetime | None = None,
    now: datetime | None = None,
) -> CreatedKey:
    """Issue a key for ``tenant``; only its HMAC and prefix are stored."""
    now = now or utcnow()
    check_optional_text(name, "name", 128)
    expires_at = check_aware(expires_at, "expires_at")
    if expires_at is not None and expires_at <= now:
        raise InvalidInput("expires_at must be in the future", param="expires_at")
    tenant_row = get_tenant(session, tenant)
    for _ in range(_PREFIX_ATTEMPTS):
        generated = generate_key()
        if session.scalar(select(ApiKey.id).where(ApiKey.prefix == generated.prefix)) is None:
            break
    else:  # pragma: no cover - would need eight random 41-bit collisions in a row
        raise AlreadyExists("could not draw an unused key prefix", param="prefix")
    key = ApiKey(
        tenant_id=tenant_row.id,
        name=name,
        prefix=generated.prefix,
        key_hash=hash_key(secret, generated.plaintext),
        created_at=now,
        expires_at=expires_at,
    )
    add_audited(
        session,
        key,
        actor=actor,
        entity=ENTITY,
        conflict="key prefix collision; try again",
        view=_audit_view,
    )
    return CreatedKey(api_key=key, plaintext=generated.plaintext)


def update_key(
    session: Session, ref: int | str, changes: Mapping[str, Any], *, actor: str
) -> ApiKey:
    """Rename a key or change its expiry (an expiry in the past expires it now)."""
    check_fields(changes, UPDATABLE, ENTITY)
    key = lock(session, get_key(session, ref), ENTITY)
    before = _audit_view(key)
    if "name" in changes:
        key.name = check_optional_text(changes["name"], "name", 128)
    if "expires_at" in changes:
        key.expires_at = check_aware(changes["expires_at"], "expires_at")
    record_change(session, before, _audit_view(key), actor=actor, action="update", entity=ENTITY)
    return key


def revoke_key(
    session: Session, ref: int | str, *, actor: str, now: datetime | None = None
) -> ApiKey:
    """Revoke a key by id or prefix. Revoking a revoked key changes nothing (idempotent)."""
    key = lock(session, get_key(session, ref), ENTITY)
    if key.revoked_at is not None:
        return key
    before = _audit_view(key)
    key.revoked_at = now or utcnow()
    record_change(session, before, _audit_view(key), actor=actor, action="revoke", entity=ENTITY)
    return key


def delete_key(session: Session, ref: int | str, *, actor: str) -> None:
    key = lock(session, get_key(session, ref), ENTITY)
    delete_audited(session, key, actor=actor, entity=ENTITY, view=_audit_view)


def authenticate(
    session: Session,
    secret: str | bytes,
    presented_key: str,
    *,
    now: datetime | None = None,
    touch: bool = True,
) -> KeyIdentity | None:
    """Resolve a presented key to its identity, or None if it must be refused.

    Refused: malformed, unknown, revoked, expired, or the tenant is suspended. The lookup is by
    the key's HMAC (unique index); the digests are then compared in constant time. With
    ``touch`` the key's ``last_used_at`` is set in this session (the caller commits).
    """
    prefix = parse_prefix(presented_key)
    if prefix is None:
        return None
    digest = hash_key(secret, presented_key)
    row = session.execute(
        select(ApiKey, Tenant)
        .join(Tenant, ApiKey.tenant_id == Tenant.id)
        .options(joinedload(Tenant.tier))
        .where(ApiKey.key_hash == digest)
    ).first()
    if row is None:
        return None
    key, tenant = row
    if not hashes_equal(key.key_hash, digest) or key.prefix != prefix:
        return None
    now = now or utcnow()
    if key.revoked_at is not None and key.revoked_at <= now:
        return None
    if key.expires_at is not None and key.expires_at <= now:
        return None
    if tenant.status != "active":
        return None
    if touch:
        key.last_used_at = now
    return KeyIdentity.from_rows(key, tenant, tenant.tier)
