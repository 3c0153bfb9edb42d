"""API keys: issue (plaintext returned once), list, revoke, rotate, delete, and authenticate.

Rotation comes in two kinds (``docs/operations/security.md``): a *key* is rotated by issuing
its successor and giving the old key a grace period (:func:`rotate_key`); the *server secret*
is rotated by moving it to ``TIERGATE_SECRET_PREVIOUS``, after which :func:`authenticate`
re-hashes each key under the new secret the first time it is presented, and
:func:`secret_status` counts the usable keys still waiting for that.

A key issued from a dashboard form records the keyed hash of that form's one-time token
(:func:`form_token_hash`, a unique column): the same form sent again — a reload of the page
that showed the secret — issues nothing and raises :class:`AlreadyIssued` instead.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, func, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, joinedload, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value

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
from gateway.db.crud.pages import count_rows, page
from gateway.db.crud.tenants import get_tenant
from gateway.db.errors import AlreadyExists, Conflict, InvalidInput, NotFound, describe
from gateway.db.identity import KeyIdentity
from gateway.db.models import ApiKey, Tenant, utcnow
from gateway.db.security import (
    display_prefix,
    generate_key,
    hash_key,
    hashes_equal,
    normalize_prefix,
    parse_prefix,
    secret_id,
    secrets_of,
)

log = logging.getLogger(__name__)

ENTITY = "api_key"
UPDATABLE = ("name", "expires_at")
_PREFIX_ATTEMPTS = 8  # 36^8 prefixes: a collision is rare, eight in a row is impossible in practice
DEFAULT_GRACE_S = 24 * 3600.0
MAX_GRACE_S = 366 * 24 * 3600.0
NAME_LENGTH = 128
_ROTATED_SUFFIX = re.compile(r" \(rotated from tg-[a-z0-9]+\)$")
FORM_TOKEN_LENGTH = 128
_FORM_TOKEN_LABEL = "tiergate key form v1:"


class AlreadyIssued(Conflict):
    """The form token already issued a key: the form was sent twice (409, nothing written)."""

    def __init__(self, prefix: str) -> None:
        super().__init__(
            f"this form already issued API key {display_prefix(prefix)}; its secret was shown "
            "once, to that first submission",
            param="form_token",
        )
        self.prefix = prefix


@dataclass(frozen=True, slots=True)
class CreatedKey:
    """The stored key and its plaintext — the only time the plaintext exists server-side."""

    api_key: ApiKey
    plaintext: str

    def __repr__(self) -> str:
        return f"CreatedKey(prefix={self.api_key.prefix!r}, plaintext=<hidden>)"


def _audit_view(key: ApiKey) -> dict[str, Any]:
    return snapshot(key, exclude=("key_hash", "last_used_at", "form_token_hash"))


def form_token_hash(secret: str | bytes, token: str) -> str:
    """``HMAC(server secret, label + token)``: what a key keeps of the form that issued it (the
    label keeps it from ever equalling a key's own hash)."""
    return hash_key(secret, _FORM_TOKEN_LABEL + token)


def find_key_by_form_token(session: Session, secret: str | bytes, token: str) -> ApiKey | None:
    """The key the form with ``token`` issued, if any (after a refusal: was it a re-sent form?)."""
    digest = form_token_hash(secret, token)
    return session.scalar(select(ApiKey).where(ApiKey.form_token_hash == digest))


def _issued_by(session: Session, digest: str) -> str | None:
    """The prefix of the key already issued under this form-token hash, if any."""
    return session.scalar(select(ApiKey.prefix).where(ApiKey.form_token_hash == digest))


def _unused_form_token(session: Session, secret: str | bytes, token: str | None) -> str | None:
    """The hash to store for ``token`` (None: no token), or :class:`AlreadyIssued`. Two posts
    that race past this check are told apart by the unique index at insert."""
    if token is None:
        return None
    check_optional_text(token, "form_token", FORM_TOKEN_LENGTH)
    digest = form_token_hash(secret, token)
    earlier = _issued_by(session, digest)
    if earlier is not None:
        raise AlreadyIssued(earlier)
    return digest


def get_key(session: Session, ref: int | str) -> ApiKey:
    """A key by id (int) or prefix (str: ``abcd1234`` or ``tg-abcd1234``)."""
    if isinstance(ref, int):
        key = session.get(ApiKey, ref)
    else:
        key = session.scalar(select(ApiKey).where(ApiKey.prefix == normalize_prefix(ref)))
    if key is None:
        raise NotFound(f"API key {ref!r} does not exist", param="key")
    return key


def _key_query(
    session: Session, tenant: int | str | None, active_only: bool, now: datetime | None
) -> Select[Any]:
    query = select(ApiKey)
    if tenant is not None:
        query = query.where(ApiKey.tenant_id == get_tenant(session, tenant).id)
    if active_only:
        now = now or utcnow()
        query = query.where(ApiKey.revoked_at.is_(None)).where(
            (ApiKey.expires_at.is_(None)) | (ApiKey.expires_at > now)
        )
    return query


def list_keys(
    session: Session,
    *,
    tenant: int | str | None = None,
    active_only: bool = False,
    now: datetime | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[ApiKey]:
    """Keys, newest first (id breaks ties: stable pages), optionally of one tenant and only
    the usable ones."""
    query = _key_query(session, tenant, active_only, now)
    query = query.options(joinedload(ApiKey.tenant)).order_by(
        ApiKey.created_at.desc(), ApiKey.id.desc()
    )
    return list(session.scalars(page(query, limit, offset)))


def count_keys(
    session: Session,
    *,
    tenant: int | str | None = None,
    active_only: bool = False,
    now: datetime | None = None,
) -> int:
    """How many keys :func:`list_keys` lists with the same filters."""
    return count_rows(session, _key_query(session, tenant, active_only, now))


def create_key(
    session: Session,
    *,
    actor: str,
    tenant: int | str,
    secret: str | bytes,
    name: str | None = None,
    expires_at: datetime | None = None,
    now: datetime | None = None,
    form_token: str | None = None,
) -> CreatedKey:
    """Issue a key for ``tenant``; only its HMAC and prefix are stored. With ``form_token``
    (the dashboard's one-time form token) its keyed hash is stored too, and a token that
    already issued a key raises :class:`AlreadyIssued`."""
    now = now or utcnow()
    check_optional_text(name, "name", 128)
    token_hash = _unused_form_token(session, secret, form_token)
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
        secret_id=secret_id(secret),
        created_at=now,
        expires_at=expires_at,
        form_token_hash=token_hash,
    )
    add_audited(
        session,
        key,
        actor=actor,
        entity=ENTITY,
        conflict="key prefix collision, or this form was sent twice at once; try again",
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


def rotate_key(
    session: Session,
    ref: int | str,
    *,
    actor: str,
    secret: str | bytes,
    grace_s: float = DEFAULT_GRACE_S,
    expires_at: datetime | None = None,
    now: datetime | None = None,
    form_token: str | None = None,
) -> CreatedKey:
    """Issue the successor of a key and let the old one expire ``grace_s`` from now.

    The successor belongs to the same tenant and is named after the old key ("<name> (rotated
    from tg-<prefix>)"); ``expires_at`` is its own expiry (default: none). The old key's expiry
    only ever moves earlier: one already due sooner keeps its date. Two audit rows: the
    successor's ``create`` and the old key's ``rotate`` (its new expiry and ``rotated_to``).
    A revoked or expired key is not rotated (409): issue a new key instead. ``form_token`` as
    for :func:`create_key`, checked first: a re-sent rotation (whose grace may have ended the
    old key) is :class:`AlreadyIssued`, not "expired".
    """
    now = now or utcnow()
    grace = _check_grace(grace_s)
    _unused_form_token(session, secret, form_token)
    old = lock(session, get_key(session, ref), ENTITY)
    if old.revoked_at is not None and old.revoked_at <= now:
        raise Conflict(f"API key {display_prefix(old.prefix)} is revoked; create a new key")
    if old.expires_at is not None and old.expires_at <= now:
        raise Conflict(f"API key {display_prefix(old.prefix)} has expired; create a new key")
    created = create_key(
        session,
        actor=actor,
        tenant=old.tenant_id,
        secret=secret,
        name=_successor_name(old),
        expires_at=expires_at,
        now=now,
        form_token=form_token,
    )
    before = _audit_view(old)
    deadline = now + grace
    if old.expires_at is None or deadline < old.expires_at:
        old.expires_at = deadline
    after = {**_audit_view(old), "rotated_to": created.api_key.prefix}
    record_change(session, before, after, actor=actor, action="rotate", entity=ENTITY)
    return created


def _check_grace(grace_s: Any) -> timedelta:
    valid = isinstance(grace_s, int | float) and not isinstance(grace_s, bool)
    if not valid or not 0 <= grace_s <= MAX_GRACE_S:
        raise InvalidInput(
            f"grace_s must be a number of seconds from 0 to {MAX_GRACE_S:g} (366 days), "
            f"got {grace_s!r}",
            param="grace_s",
        )
    return timedelta(seconds=float(grace_s))


def _successor_name(old: ApiKey) -> str:
    suffix = f" (rotated from {display_prefix(old.prefix)})"
    base = _ROTATED_SUFFIX.sub("", old.name or "key")
    return base[: NAME_LENGTH - len(suffix)] + suffix


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
    rehash_in: sessionmaker[Session] | None = None,
) -> KeyIdentity | None:
    """Resolve a presented key to its identity, or None if it must be refused.

    Refused: malformed, unknown, revoked, expired, or the tenant is suspended. The lookup is by
    the key's HMAC (unique index) under the current secret and, when ``secret`` is a
    :class:`~gateway.db.security.ServerSecret` with previous secrets, under those too (one
    query); the digests are then compared in constant time. A key found under a previous secret
    (or issued before secrets were recorded) is re-hashed under the current one: in this
    session (the caller commits) or, with ``rehash_in``, in a short transaction of its own, so
    a caller that only reads still makes the change stick. With ``touch`` the key's
    ``last_used_at`` is set in this session (the caller commits).
    """
    prefix = parse_prefix(presented_key)
    if prefix is None:
        return None
    current_hash = hash_key(secret, presented_key)
    candidates = {hash_key(s, presented_key): s for s in secrets_of(secret)[1:]}
    candidates[current_hash] = secret
    row = session.execute(
        select(ApiKey, Tenant)
        .join(Tenant, ApiKey.tenant_id == Tenant.id)
        .options(joinedload(Tenant.tier))
        .where(ApiKey.key_hash.in_(list(candidates)))
    ).first()
    if row is None:
        return None
    key, tenant = row
    under = candidates.get(key.key_hash)
    if under is None or not hashes_equal(key.key_hash, hash_key(under, presented_key)):
        return None
    if key.prefix != prefix:
        return None
    current_id = secret_id(secret)
    if key.key_hash != current_hash or key.secret_id != current_id:
        _adopt_current_secret(session, rehash_in, key, current_hash, current_id)
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


def _adopt_current_secret(
    session: Session,
    rehash_in: sessionmaker[Session] | None,
    key: ApiKey,
    new_hash: str,
    new_id: str,
) -> None:
    """Move a key's hash to the current secret (compare-and-set on the old hash, so two
    gateways re-hashing the same key at once both succeed harmlessly)."""
    change = (
        update(ApiKey)
        .where(ApiKey.id == key.id, ApiKey.key_hash == key.key_hash)
        .values(key_hash=new_hash, secret_id=new_id)
        .execution_options(synchronize_session=False)
    )
    shown = display_prefix(key.prefix)
    if rehash_in is None:
        session.execute(change)
        set_committed_value(key, "key_hash", new_hash)  # as written; not dirty: no 2nd UPDATE
        set_committed_value(key, "secret_id", new_id)
        return
    try:
        with rehash_in.begin() as own:
            own.execute(change)
    except SQLAlchemyError as exc:  # e.g. the database is busy: the next use tries again
        log.warning(
            "could not re-hash API key %s under the current secret: %s", shown, describe(exc)
        )
        return
    log.info("API key %s is now hashed under the current server secret", shown)


@dataclass(frozen=True, slots=True)
class SecretStatus:
    """Usable keys (neither revoked nor expired) by the secret their hash is under.

    ``previous[i]`` counts keys under ``TIERGATE_SECRET_PREVIOUS``'s i-th secret;
    ``unrecorded``: issued before secrets were recorded (migration 0006) and not used since,
    under the current secret or a previous one; ``other``: under no configured secret — they
    cannot authenticate (a secret was dropped while they still needed it).
    """

    current: int
    previous: tuple[int, ...]
    unrecorded: int
    other: int

    @property
    def waiting(self) -> int:
        """Keys that may still need a previous secret: 0 = safe to drop them all."""
        return sum(self.previous) + self.unrecorded


def secret_status(
    session: Session, secret: str | bytes, *, now: datetime | None = None
) -> SecretStatus:
    """How many usable keys are under the current secret, each previous one, or neither."""
    now = now or utcnow()
    usable = (ApiKey.revoked_at.is_(None) | (ApiKey.revoked_at > now)) & (
        ApiKey.expires_at.is_(None) | (ApiKey.expires_at > now)
    )
    counts: dict[str | None, int] = {
        sid: n
        for sid, n in session.execute(
            select(ApiKey.secret_id, func.count()).where(usable).group_by(ApiKey.secret_id)
        )
    }
    current = counts.pop(secret_id(secret), 0)
    unrecorded = counts.pop(None, 0)
    previous = tuple(counts.pop(secret_id(p), 0) for p in secrets_of(secret)[1:])
    return SecretStatus(current, previous, unrecorded, sum(counts.values()))
