"""Who may administer the gateway: ``TIERGATE_ADMIN_KEY`` (an owner), or a stored operator
credential (with its role, :mod:`gateway.app.admin.roles`).

Shared by the admin API's bearer check (:func:`gateway.app.admin.deps.check_admin_key`) and the
dashboard's sign-in (:mod:`gateway.app.ui.auth`), so both accept exactly the same secrets. The
admin key is compared by fixed-length digests in constant time (even its length stays out of
the timing); a credential is looked up by its keyed hash (:mod:`gateway.db.crud.operators`).
The functions that touch the database are synchronous: callers run them in a thread.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from sqlalchemy.orm import Session

from gateway.app.admin.roles import OWNER_KEY, Principal, Role
from gateway.app.state import GatewayState
from gateway.db.crud import operators
from gateway.db.models import OperatorCredential
from gateway.settings import Settings

ADMIN_KEY_OPERATOR = "admin-key"
"""The operator name of a dashboard session signed in with ``TIERGATE_ADMIN_KEY``."""


@dataclass(frozen=True, slots=True)
class Administrator:
    """Who a presented secret proved to be: the admin key's holder (an owner), or a stored
    operator with its role."""

    name: str
    credential_id: int | None  # None: TIERGATE_ADMIN_KEY
    principal: Principal = OWNER_KEY


def principal_of(row: OperatorCredential) -> Principal:
    """The principal a stored credential signs in as (its role and, a tenant admin's, tenant)."""
    tenant = row.tenant.name if row.tenant is not None else None
    return Principal(row.name, Role(row.role), row.tenant_id, tenant)


def _administrator(row: OperatorCredential | None) -> Administrator | None:
    return Administrator(row.name, row.id, principal_of(row)) if row is not None else None


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def admin_key_configured(settings: Settings) -> bool:
    return settings.admin_key is not None and bool(settings.admin_key.get_secret_value())


def is_admin_key(settings: Settings, presented: str) -> bool:
    """Whether ``presented`` is ``TIERGATE_ADMIN_KEY`` (False when none is configured)."""
    if not admin_key_configured(settings) or settings.admin_key is None:
        return False
    expected = settings.admin_key.get_secret_value()
    return hmac.compare_digest(_digest(presented), _digest(expected))


def looks_like_credential(presented: str) -> bool:
    return presented.startswith(f"{operators.CREDENTIAL_SCHEME}-")


def identify(state: GatewayState, presented: str, *, record_use: bool) -> Administrator | None:
    """The administrator ``presented`` proves, or None. With ``record_use`` (a sign-in) the
    credential's use is written; the admin API's check on every call writes nothing."""
    if is_admin_key(state.settings, presented):
        return Administrator(ADMIN_KEY_OPERATOR, None)
    if not looks_like_credential(presented):
        return None
    if record_use:
        with state.session_factory.begin() as session:
            return _administrator(operators.find_credential(session, state.secret, presented))
    with state.session_factory() as session:
        row = operators.find_credential(session, state.secret, presented, record_use=False)
        return _administrator(row)


def session_principal(session: Session, credential_id: int | None, name: str) -> Principal | None:
    """The principal of a dashboard session, read from its credential on every request (a
    role changed takes effect at once); a session of ``TIERGATE_ADMIN_KEY`` is an owner; None
    if the credential is gone (the session ends with it)."""
    if credential_id is None:
        return Principal(name, Role.OWNER)
    row = session.get(OperatorCredential, credential_id)
    return principal_of(row) if row is not None else None


def credential_exists(state: GatewayState) -> bool:
    with state.session_factory() as session:
        return operators.has_credential(session)
