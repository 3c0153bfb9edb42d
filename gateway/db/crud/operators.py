"""The dashboard's operators: their sign-in credential and their server-side sessions.

A credential is ``tgop-<random>`` (never a tenant key's ``tg-<prefix>-<secret>`` shape, so
neither is taken for the other) and is stored, like an API key, only as ``HMAC-SHA256(server
secret, credential)`` with the ``secret_id`` of the secret that made it; a credential hashed
under a ``TIERGATE_SECRET_PREVIOUS`` secret still signs in and is re-hashed on use. A session's
token lives in the browser's cookie; its row keeps the token's keyed hash, so a leaked
database signs nobody in. Session hashes are under the current secret only: rotating the
server secret signs every browser out, which is what a rotation is for.

Creating or resetting a credential, signing in and signing out are audited (entity types
``operator_credential`` and ``operator_session``); no hash or token is ever in an audit row.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from gateway.db.crud._common import add_audited, audit, check_name, delete_audited, snapshot
from gateway.db.models import OperatorCredential, OperatorSession, utcnow
from gateway.db.security import hash_key, hashes_equal, secret_id, secrets_of

CREDENTIAL_ENTITY = "operator_credential"
SESSION_ENTITY = "operator_session"
DEFAULT_OPERATOR = "operator"
CREDENTIAL_SCHEME = "tgop"
TOKEN_BYTES = 32
TOUCH_EVERY = timedelta(seconds=60)
"""A session's ``last_seen_at`` is written at most this often (not on every page view)."""


@dataclass(frozen=True, slots=True)
class IssuedCredential:
    """A new credential's row and its plaintext — the only time the plaintext exists."""

    row: OperatorCredential
    plaintext: str

    def __repr__(self) -> str:
        return f"IssuedCredential(name={self.row.name!r}, plaintext=<hidden>)"


@dataclass(frozen=True, slots=True)
class StartedSession:
    """A new session's row and its token (for the cookie; only the hash is stored)."""

    row: OperatorSession
    token: str

    def __repr__(self) -> str:
        return f"StartedSession(id={self.row.id!r}, token=<hidden>)"


def _credential_view(row: OperatorCredential) -> dict[str, Any]:
    return snapshot(row, exclude=("credential_hash", "last_used_at"))


def _session_view(row: OperatorSession) -> dict[str, Any]:
    return snapshot(row, exclude=("token_hash", "last_seen_at"))


def generate_credential() -> str:
    return f"{CREDENTIAL_SCHEME}-{secrets.token_urlsafe(TOKEN_BYTES)}"


def has_credential(session: Session) -> bool:
    """Whether any operator credential is stored (the admin API is then on)."""
    return session.scalar(select(func.count()).select_from(OperatorCredential)) != 0


def create_credential(
    session: Session, *, actor: str, secret: str | bytes, name: str = DEFAULT_OPERATOR
) -> IssuedCredential:
    """Issue a credential for operator ``name`` (a name already taken: 409)."""
    check_name(name, "operator")
    plaintext = generate_credential()
    row = OperatorCredential(
        name=name, credential_hash=hash_key(secret, plaintext), secret_id=secret_id(secret)
    )
    add_audited(
        session,
        row,
        actor=actor,
        entity=CREDENTIAL_ENTITY,
        conflict=f"operator {name!r} already has a credential",
        view=_credential_view,
    )
    return IssuedCredential(row=row, plaintext=plaintext)


def reset_credential(
    session: Session, *, actor: str, secret: str | bytes, name: str = DEFAULT_OPERATOR
) -> IssuedCredential:
    """Replace operator ``name``'s credential (or issue its first): the old one stops
    working at once and every session it signed in is ended."""
    old = session.scalar(select(OperatorCredential).where(OperatorCredential.name == name))
    if old is not None:
        session.execute(delete(OperatorSession).where(OperatorSession.credential_id == old.id))
        delete_audited(session, old, actor=actor, entity=CREDENTIAL_ENTITY, view=_credential_view)
    return create_credential(session, actor=actor, secret=secret, name=name)


def find_credential(
    session: Session,
    secret: str | bytes,
    presented: str,
    *,
    record_use: bool = True,
    now: datetime | None = None,
) -> OperatorCredential | None:
    """The stored credential ``presented`` is, or None.

    Looked up by its keyed hash under the current secret and the previous ones, compared in
    constant time. With ``record_use`` (a sign-in; the caller commits) its ``last_used_at`` is
    set and one found under a previous secret is re-hashed under the current one; without
    (the admin API's bearer check, on every call) nothing is written.
    """
    if not presented.startswith(f"{CREDENTIAL_SCHEME}-"):
        return None
    candidates = {hash_key(s, presented): s for s in reversed(secrets_of(secret))}
    row = session.scalar(
        select(OperatorCredential).where(OperatorCredential.credential_hash.in_(list(candidates)))
    )
    if row is None:
        return None
    under = candidates.get(row.credential_hash)
    if under is None or not hashes_equal(row.credential_hash, hash_key(under, presented)):
        return None
    if not record_use:
        return row
    current = hash_key(secret, presented)
    if row.credential_hash != current:
        row.credential_hash = current
        row.secret_id = secret_id(secret)
    row.last_used_at = now or utcnow()
    return row


def _token_hash(secret: str | bytes, token: str) -> str:
    """Under the current secret only (see the module docstring)."""
    return hash_key(secret, token)


def start_session(
    session: Session,
    *,
    secret: str | bytes,
    operator: str,
    credential_id: int | None,
    client: str | None,
    now: datetime | None = None,
) -> StartedSession:
    """Sign ``operator`` in: a new session row, audited as ``signin`` by ``admin-ui:<operator>``."""
    now = now or utcnow()
    token = secrets.token_urlsafe(TOKEN_BYTES)
    row = OperatorSession(
        token_hash=_token_hash(secret, token),
        operator=operator,
        credential_id=credential_id,
        client=(client or "")[:64] or None,
        created_at=now,
        last_seen_at=now,
    )
    session.add(row)
    session.flush()
    audit(
        session,
        actor=f"admin-ui:{operator}",
        action="signin",
        entity=SESSION_ENTITY,
        before=None,
        after=_session_view(row),
    )
    return StartedSession(row=row, token=token)


def find_session(
    session: Session, secret: str | bytes, token: str, *, ttl_s: float, now: datetime | None = None
) -> OperatorSession | None:
    """The live session of ``token``, or None (unknown, or idle for ``ttl_s`` or longer)."""
    if not token or len(token) > 256:
        return None
    row = session.scalar(
        select(OperatorSession).where(OperatorSession.token_hash == _token_hash(secret, token))
    )
    now = now or utcnow()
    if row is None or row.last_seen_at + timedelta(seconds=ttl_s) <= now:
        return None
    return row


def touch_session(session: Session, session_id: int, *, now: datetime | None = None) -> None:
    """Move a session's idle expiry forward (one UPDATE; the caller commits)."""
    session.execute(
        update(OperatorSession)
        .where(OperatorSession.id == session_id)
        .values(last_seen_at=now or utcnow())
        .execution_options(synchronize_session=False)
    )


def end_session(session: Session, session_id: int) -> bool:
    """Sign out: delete the session, audited as ``signout``; False if it was already gone."""
    row = session.get(OperatorSession, session_id, with_for_update=True)
    if row is None:
        return False
    before = _session_view(row)
    session.delete(row)
    session.flush()
    actor = f"admin-ui:{row.operator}"
    audit(session, actor=actor, action="signout", entity=SESSION_ENTITY, before=before, after=None)
    return True


def purge_expired_sessions(session: Session, *, ttl_s: float, now: datetime | None = None) -> int:
    """Delete sessions idle for ``ttl_s`` or longer (they can no longer sign anything in)."""
    cutoff = (now or utcnow()) - timedelta(seconds=ttl_s)
    result = session.execute(
        delete(OperatorSession)
        .where(OperatorSession.last_seen_at <= cutoff)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)
