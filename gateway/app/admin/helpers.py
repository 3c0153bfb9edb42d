"""What the resource routers do alike: find a row by name or id, apply a PATCH, delete, drop
the cached identities a committed change made stale, and resolve the usage window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel
from sqlalchemy.orm import Session

from gateway.app.admin.roles import Principal
from gateway.app.admin.schemas import INT32_MAX, DeletedOut
from gateway.app.state import GatewayState
from gateway.db import crud
from gateway.db.errors import InvalidInput, NotFound
from gateway.db.models import ApiKey, Tenant, utcnow

DEFAULT_USAGE_HOURS = 24.0

RowT = TypeVar("RowT")
OutT = TypeVar("OutT")


class _Versioned(Protocol):
    """A row whose ``updated_at`` moves when a change is written (tiers, backends)."""

    @property
    def id(self) -> int: ...

    @property
    def updated_at(self) -> datetime: ...


VersionedT = TypeVar("VersionedT", bound=_Versioned)


def resolve(getter: Callable[[Session, int | str], RowT], session: Session, ref: int | str) -> RowT:
    """A row by id when ``ref`` is an id or made of digits only, else by name.

    One rule everywhere a row is named by "id or name": a number is an id. Names cannot be
    digits only (:data:`~gateway.db.crud._common.NAME_PATTERN`), so no name shadows an id; a
    row given such a name before the rule is reached by its id (and can be renamed).
    """
    if isinstance(ref, int):
        return getter(session, ref)
    if ref.isascii() and ref.isdigit() and 0 < int(ref) <= INT32_MAX:
        return getter(session, int(ref))
    return getter(session, ref)  # a name (or an id out of range: the getter's "not found")


def tenant_resolver(session: Session) -> Callable[[int | str], int]:
    """The id of a tenant named by id or name (404 if there is none)."""
    return lambda ref: resolve(crud.get_tenant, session, ref).id


class _Owned(Protocol):
    """A row of one tenant (a key, a budget; none: a budget of no tenant)."""

    @property
    def tenant_id(self) -> int | None: ...


OwnedT = TypeVar("OwnedT", bound=_Owned)


def scoped(who: Principal, param: str, find: Callable[[], OwnedT]) -> OwnedT:
    """The row ``find`` reads, if ``who`` may see it. A tenant admin gets 403 (naming
    ``param``) alike for another tenant's row and for one that does not exist: whether it
    exists elsewhere is not theirs to learn."""
    try:
        row = find()
    except NotFound:
        if who.tenant_bound:
            raise who.foreign(param) from None
        raise
    who.check_tenant(row.tenant_id, param)
    return row


def scoped_key(session: Session, who: Principal, prefix: str) -> ApiKey:
    """Key ``prefix``, if ``who`` may see it (:func:`scoped`)."""
    return scoped(who, "prefix", lambda: crud.get_key(session, prefix))


def reread(state: GatewayState, *names: str) -> None:
    """Mark the gateway's caches ``names`` (``"prices"``: the price book, ``"budgets"``: the
    budget guard) stale once a change is committed: the next request re-reads them. A state
    without one (an admin API mounted alone) has nothing to mark."""
    for name in names:
        cache = getattr(state, name, None)
        if cache is not None:
            cache.invalidate()


def changes_of(body: BaseModel) -> dict[str, Any]:
    """The fields a PATCH body actually sent (an explicit ``null`` included)."""
    return body.model_dump(exclude_unset=True)


def key_prefixes(tenant: Tenant) -> list[str]:
    return [key.prefix for key in tenant.api_keys]


def own_prefix(key: ApiKey) -> list[str]:
    return [key.prefix]


def invalidate(state: GatewayState, prefixes: Iterable[str] | None) -> None:
    """Drop cached identities: of these key prefixes, or all of them (``None``)."""
    if prefixes is None:
        state.auth.invalidate()
        return
    for prefix in prefixes:
        state.auth.invalidate(prefix)


def patch_row(
    s: Session,
    actor: str,
    ref: str,
    get: Callable[[Session, int | str], VersionedT],
    update: Callable[..., VersionedT],
    body: BaseModel,
) -> tuple[VersionedT, bool]:
    """Apply a PATCH body to the row ``ref`` names; the row, and whether anything was written."""
    row = resolve(get, s, ref)
    updated_at = row.updated_at
    row = update(s, row.id, changes_of(body), actor=actor)
    return row, row.updated_at != updated_at


def delete_row(
    s: Session, actor: str, delete: Callable[..., None], entity: str, row_id: int, name: str
) -> DeletedOut:
    """Delete a row through its crud function; the answer names what was deleted."""
    out = DeletedOut(object=entity, id=row_id, name=name)
    delete(s, row_id, actor=actor)
    return out


def change_and_invalidate(
    state: GatewayState,
    session: Session,
    change: Callable[[Session], RowT],
    present: Callable[[RowT], OutT],
    prefixes: Callable[[RowT], Iterable[str]],
) -> OutT:
    """Commit ``change``, then drop the cached identities of the keys it touched.

    The answer and the prefixes are read inside the transaction; the cache is dropped only
    once the change is committed, so no request can re-cache the old identity in between.
    """
    with session.begin():
        row = change(session)
        out, touched = present(row), list(prefixes(row))
    invalidate(state, touched)
    return out


def update_tenant(s: Session, ref: str, changes: dict[str, Any], actor: str) -> Tenant:
    """A tenant's partial update, where ``tier`` names a tier or its id (and cannot be null);
    the caller owns the transaction (the admin API's PATCH and the dashboard's edit form)."""
    tenant = resolve(crud.get_tenant, s, ref)
    if "tier" in changes:
        if changes["tier"] is None:
            raise InvalidInput("a tenant must have a tier; tier cannot be null", param="tier")
        changes["tier"] = resolve(crud.get_tier, s, changes["tier"]).id
    return crud.update_tenant(s, tenant.id, changes, actor=actor)


def set_tenant_status(s: Session, ref: str, actor: str, *, active: bool) -> Tenant:
    """Suspend (its keys stop authenticating) or activate the tenant ``ref`` names."""
    set_status = crud.activate_tenant if active else crud.suspend_tenant
    return set_status(s, resolve(crud.get_tenant, s, ref).id, actor=actor)


def usage_window(
    since: datetime | None, until: datetime | None, hours: float | None
) -> tuple[datetime, datetime | None]:
    """``[since, until)``; ``hours`` counts back from ``until`` (default: now), 24 h if unset."""
    if hours is not None and since is not None:
        raise InvalidInput("give either since or hours, not both", param="hours")
    if since is None:
        span = hours if hours is not None else DEFAULT_USAGE_HOURS
        try:
            since = (until or utcnow()) - timedelta(hours=span)
        except OverflowError:
            raise InvalidInput("the window starts before year 1", param="hours") from None
    if until is not None and since >= until:
        raise InvalidInput("since must be before until", param="since")
    return since, until
