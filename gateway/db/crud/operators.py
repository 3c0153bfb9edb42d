"""The dashboard's operators: their sign-in credential and their server-side sessions.

A credential is ``tgop-<random>`` (never a tenant key's ``tg-<prefix>-<secret>`` shape, so
neither is taken for the other) and is stored, like an API key, only as ``HMAC-SHA256(server
secret, credential)`` with the ``secret_id`` of the secret that made it; a credential hashed
under a ``TIERGATE_SECRET_PREVIOUS`` secret still signs in and is re-hashed on use. A session's
token lives in the browser's cookie; its row keeps the token's keyed hash, so a leaked
database signs nobody in. Session hashes are under the current secret only: rotating the
server secret signs every browser out, which is what a rotation is for.

Each credential is a named operator with a role (``owner | operator | viewer | tenant_admin``,
migration 0012; :mod:`gateway.app.admin.roles` says what each may do) and, for a tenant admin,
its tenant. The last owner credential cannot be deleted or demoted (nobody could then manage
operators but ``TIERGATE_ADMIN_KEY`` or ``tiergate admin reset-credential``).

Creating, changing, resetting and deleting a credential, signing in and signing out are audited
(entity types ``operator_credential`` and ``operator_session``); no hash or token is ever in an
audit row.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from gateway.db.crud._common import (
    add_audited,
    audit,
    check_choice,
    check_name,
    delete_audited,
    lock,
    record_change,
    snapshot,
)
from gateway.db.errors import Conflict, InvalidInput, NotFound
from gateway.db.models import OPERATOR_ROLES, OperatorCredential, OperatorSession, Tenant, utcnow
from gateway.db.security import hash_key, hashes_equal, secret_id, secrets_of

CREDENTIAL_ENTITY = "operator_credential"
SESSION_ENTITY = "operator_session"
DEFAULT_OPERATOR = "operator"
OWNER = "owner"
TENANT_ADMIN = "tenant_admin"
CREDENTIAL_SCHEME = "tgop"
TOKEN_BYTES = 32
_FORM_TOKEN_LABEL = "tiergate operator form v1:"
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
    return snapshot(row, exclude=("credential_hash", "last_used_at", "form_token_hash"))


def _session_view(row: OperatorSession) -> dict[str, Any]:
    return snapshot(row, exclude=("token_hash", "last_seen_at"))


def generate_credential() -> str:
    return f"{CREDENTIAL_SCHEME}-{secrets.token_urlsafe(TOKEN_BYTES)}"


def has_credential(session: Session) -> bool:
    """Whether any operator credential is stored (the admin API is then on)."""
    return session.scalar(select(func.count()).select_from(OperatorCredential)) != 0


def _check_role(session: Session, role: str, tenant: int | None) -> tuple[str, int | None]:
    """A known role, with a tenant that exists for a tenant admin and none for the others."""
    role = check_choice(role, "role", OPERATOR_ROLES)
    if role != TENANT_ADMIN:
        if tenant is not None:
            raise InvalidInput(f"a {role} is not bound to a tenant; omit tenant", param="tenant")
        return role, None
    if tenant is None:
        raise InvalidInput("a tenant_admin needs the tenant it administers", param="tenant")
    if session.get(Tenant, tenant) is None:
        raise NotFound(f"tenant {tenant!r} does not exist", param="tenant")
    return role, tenant


def create_credential(
    session: Session,
    *,
    actor: str,
    secret: str | bytes,
    name: str = DEFAULT_OPERATOR,
    role: str = OWNER,
    tenant: int | None = None,
    form_token: str | None = None,
) -> IssuedCredential:
    """Issue a credential for operator ``name`` with ``role`` (a tenant admin: of tenant id
    ``tenant``); a name already taken: 409. ``form_token``: the dashboard form's one-time
    token; a form that already issued a credential is refused (:func:`find_by_form_token`
    names the operator)."""
    check_name(name, "operator")
    role, tenant = _check_role(session, role, tenant)
    token_hash = _unused_form_token(session, secret, form_token)
    plaintext = generate_credential()
    row = OperatorCredential(
        name=name,
        credential_hash=hash_key(secret, plaintext),
        secret_id=secret_id(secret),
        role=role,
        tenant_id=tenant,
        form_token_hash=token_hash,
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


def form_token_hash(secret: str | bytes, token: str) -> str:
    """``HMAC(server secret, label + token)``: what a credential keeps of the dashboard form
    that issued it (the label keeps it from ever equalling a credential's own hash)."""
    return hash_key(secret, _FORM_TOKEN_LABEL + token)


def find_by_form_token(
    session: Session, secret: str | bytes, token: str
) -> OperatorCredential | None:
    """The credential the dashboard form with ``token`` issued, if any."""
    digest = form_token_hash(secret, token)
    query = select(OperatorCredential).where(OperatorCredential.form_token_hash == digest)
    return session.scalar(query)


def _unused_form_token(session: Session, secret: str | bytes, token: str | None) -> str | None:
    """The hash to keep for ``token`` (None: no token), or 409 if that form issued already."""
    if token is None:
        return None
    earlier = find_by_form_token(session, secret, token)
    if earlier is not None:
        raise Conflict(
            f"this form already issued the credential of operator {earlier.name!r}; it was "
            "shown once and is not shown again (reset it if it was lost)",
            param="form_token",
        )
    return form_token_hash(secret, token)


def reset_credential(
    session: Session,
    *,
    actor: str,
    secret: str | bytes,
    name: str = DEFAULT_OPERATOR,
    form_token: str | None = None,
) -> IssuedCredential:
    """Replace operator ``name``'s credential (or issue its first, an owner's): the old one
    stops working at once and every session it signed in is ended; the role and tenant stay."""
    old = session.scalar(select(OperatorCredential).where(OperatorCredential.name == name))
    role, tenant = OWNER, None
    _unused_form_token(session, secret, form_token)  # refused before anything is deleted
    if old is not None:
        role, tenant = old.role, old.tenant_id
        _end_sessions(session, old.id)
        delete_audited(session, old, actor=actor, entity=CREDENTIAL_ENTITY, view=_credential_view)
    return create_credential(
        session,
        actor=actor,
        secret=secret,
        name=name,
        role=role,
        tenant=tenant,
        form_token=form_token,
    )


def _end_sessions(session: Session, credential_id: int) -> None:
    session.execute(delete(OperatorSession).where(OperatorSession.credential_id == credential_id))


def list_operators(session: Session) -> list[OperatorCredential]:
    """Every named operator, by name."""
    return list(session.scalars(select(OperatorCredential).order_by(OperatorCredential.name)))


def get_operator(session: Session, name: str) -> OperatorCredential:
    """Operator ``name`` (404 if there is none)."""
    row = session.scalar(select(OperatorCredential).where(OperatorCredential.name == name))
    if row is None:
        raise NotFound(f"operator {name!r} does not exist", param="operator")
    return row


def _other_owners(session: Session, row: OperatorCredential) -> int:
    query = select(func.count()).where(
        OperatorCredential.role == OWNER, OperatorCredential.id != row.id
    )
    return int(session.scalar(query.select_from(OperatorCredential)) or 0)


def _keep_an_owner(session: Session, row: OperatorCredential, doing: str) -> None:
    if row.role == OWNER and _other_owners(session, row) == 0:
        raise Conflict(
            f"cannot {doing} operator {row.name!r}: it is the last owner (make another "
            "operator an owner first)",
            param="role",
        )


def set_role(
    session: Session, name: str, *, actor: str, role: str, tenant: int | None = None
) -> OperatorCredential:
    """Give operator ``name`` a new role (and tenant). Takes effect on its next request: a
    session reads its credential's role every time."""
    row = lock(session, get_operator(session, name), "operator")
    role, tenant = _check_role(session, role, tenant)
    if role != row.role:
        _keep_an_owner(session, row, "demote")
    before = _credential_view(row)
    row.role, row.tenant_id = role, tenant
    record_change(
        session,
        before,
        _credential_view(row),
        actor=actor,
        action="update",
        entity=CREDENTIAL_ENTITY,
    )
    return row


def delete_tenant_admins(session: Session, tenant: int, *, actor: str) -> None:
    """Delete tenant ``tenant``'s admins and their sessions, audited (before the tenant goes;
    the foreign key would cascade, unaudited)."""
    query = select(OperatorCredential).where(OperatorCredential.tenant_id == tenant)
    for row in session.scalars(query).all():
        _end_sessions(session, row.id)
        delete_audited(session, row, actor=actor, entity=CREDENTIAL_ENTITY, view=_credential_view)


def delete_operator(session: Session, name: str, *, actor: str) -> OperatorCredential:
    """Delete operator ``name``: its credential stops working and its sessions end."""
    row = lock(session, get_operator(session, name), "operator")
    _keep_an_owner(session, row, "delete")
    _end_sessions(session, row.id)
    delete_audited(session, row, actor=actor, entity=CREDENTIAL_ENTITY, view=_credential_view)
    return row


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
