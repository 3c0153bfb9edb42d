"""Who may administer the gateway: ``TIERGATE_ADMIN_KEY``, or a stored operator credential.

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

from gateway.app.state import GatewayState
from gateway.db.crud import operators
from gateway.settings import Settings

ADMIN_KEY_OPERATOR = "admin-key"
"""The operator name of a dashboard session signed in with ``TIERGATE_ADMIN_KEY``."""


@dataclass(frozen=True, slots=True)
class Administrator:
    """Who a presented secret proved to be: the admin key's holder, or a stored operator."""

    name: str
    credential_id: int | None  # None: TIERGATE_ADMIN_KEY


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
            row = operators.find_credential(session, state.secret, presented)
            return Administrator(row.name, row.id) if row is not None else None
    with state.session_factory() as session:
        row = operators.find_credential(session, state.secret, presented, record_use=False)
        return Administrator(row.name, row.id) if row is not None else None


def credential_exists(state: GatewayState) -> bool:
    with state.session_factory() as session:
        return operators.has_credential(session)
