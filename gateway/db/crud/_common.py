"""Shared pieces of the CRUD modules: input checks, snapshots, and the audited mutations.

Every create, update and delete goes through :func:`add_audited` / :func:`add_named`,
:func:`update_named` / :func:`record_change` or :func:`delete_audited`, so the write and its
audit row always happen the same way, in the same transaction.

Validators take the *whole* prospective state of an entity (a mapping), so creation and partial
updates go through one set of rules and an invalid update never touches the ORM object.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.db.errors import AlreadyExists, InvalidInput, NotFound, is_unique_violation
from gateway.db.models import AuditLog, Base, utcnow

RowT = TypeVar("RowT", bound=Base)
View = Callable[[Any], dict[str, Any]]  # a row -> what the audit log records of it
Finder = Callable[[Session, str], object | None]  # a row by name, or None

NAME_PATTERN = re.compile(r"^(?:[A-Za-z][A-Za-z0-9._-]*|[0-9]+[A-Za-z._-][A-Za-z0-9._-]*)$")
"""1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, not digits only: a
reference made of digits is an id wherever a row is named by "id or name", so no name may be
one (no lookahead: pydantic's regex engine checks the same pattern; the length is separate)."""
NAME_MAX = 64
NAME_RULE = (
    "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, "
    "not digits only (a number is an id)"
)


def check_name(value: Any, entity: str, param: str = "name") -> str:
    if not isinstance(value, str) or len(value) > NAME_MAX or not NAME_PATTERN.fullmatch(value):
        raise InvalidInput(f"invalid {entity} name {value!r}: {NAME_RULE}", param=param)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_positive(value: Any, param: str, *, optional: bool = False) -> float | None:
    """A finite number > 0 (None allowed when ``optional``)."""
    if value is None and optional:
        return None
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise InvalidInput(f"{param} must be a positive finite number, got {value!r}", param=param)
    return float(value)


def check_limit(value: Any, param: str) -> int | None:
    """A rate or concurrency limit: an integer >= 1, or None for unlimited."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInput(
            f"{param} must be an integer >= 1 (or null for unlimited), got {value!r}", param=param
        )
    return value


def check_bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{param} must be true or false, got {value!r}", param=param)
    return value


def check_choice(value: Any, param: str, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if value not in options:
        raise InvalidInput(
            f"{param} must be one of {', '.join(options)}; got {value!r}", param=param
        )
    return str(value)


def check_optional_text(value: Any, param: str, max_length: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_length:
        raise InvalidInput(f"{param} must be text of at most {max_length} characters", param=param)
    return value


def check_aware(value: Any, param: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidInput(f"{param} must be a timezone-aware datetime, got {value!r}", param=param)
    return value


def check_fields(changes: Mapping[str, Any], allowed: Iterable[str], entity: str) -> None:
    """Reject updates of fields that do not exist or may not be changed."""
    allowed_set = set(allowed)
    unknown = sorted(set(changes) - allowed_set)
    if unknown:
        raise InvalidInput(
            f"cannot update {entity} field(s) {', '.join(unknown)}; "
            f"updatable: {', '.join(sorted(allowed_set))}",
            param=unknown[0],
        )


def find_named(session: Session, model: type[RowT], name: str) -> RowT | None:
    """The row of ``model`` with this unique ``name``, or None (a :data:`Finder`)."""
    return session.scalar(select(model).where(model.__table__.c.name == name))


def get_named(session: Session, model: type[RowT], ref: int | str, entity: str) -> RowT:
    """A row by id (int) or unique name (str); :class:`NotFound` naming ``entity`` otherwise.

    The id/name split is by type, not by looks: the admin API decides what a digit string means.
    """
    column = model.__table__.c.id if isinstance(ref, int) else model.__table__.c.name
    row = session.scalar(select(model).where(column == ref))
    if row is None:
        raise NotFound(f"{entity} {ref!r} does not exist", param=entity)
    return row


def lock(session: Session, row: RowT, entity: str) -> RowT:
    """``row`` re-read under a row lock held to the end of the transaction.

    Every change of an existing row takes it before it reads anything it decides on. A change
    reads, decides, then writes; on PostgreSQL (READ COMMITTED) a concurrent change could
    commit in between, and this one would then write over it with a stale audit ``before``, or
    delete a row already gone and answer success for it. ``SELECT ... FOR UPDATE`` makes the
    second change wait and then see the first one's result (a deleted row: :class:`NotFound`,
    as if they had run one after the other). SQLite ignores ``FOR UPDATE``: its write
    transactions hold the whole database already (:mod:`gateway.db.session`).
    """
    identity = inspect(row).identity
    fresh = session.get(type(row), identity, with_for_update=True, populate_existing=True)
    if fresh is None:
        raise NotFound(f"the {entity} was deleted by a concurrent change", param=entity)
    return fresh


def snapshot(obj: Base, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The row's column values as JSON-ready data (datetimes as ISO 8601) for the audit log."""
    skip = set(exclude)
    out: dict[str, Any] = {}
    for attr in inspect(obj).mapper.column_attrs:
        if attr.key in skip:
            continue
        value = getattr(obj, attr.key)
        out[attr.key] = value.isoformat() if isinstance(value, datetime) else value
    return out


def audit(
    session: Session,
    *,
    actor: str,
    action: str,
    entity: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> AuditLog:
    """Add the audit row of a mutation to the mutation's own session (same transaction).

    ``before``/``after`` are the entity's snapshots (None on create/delete); its id is read off
    whichever there is.
    """
    if not actor or not actor.strip():
        raise InvalidInput("an audited change needs an actor", param="actor")
    snap = after if after is not None else before
    assert snap is not None, "an audited change has a before or an after"
    row = AuditLog(
        actor=actor,
        action=action,
        entity_type=entity,
        entity_id=str(snap["id"]),
        before=before,
        after=after,
        at=utcnow(),
    )
    session.add(row)
    return row


def flush(session: Session, conflict_message: str) -> None:
    """Flush, turning a unique-constraint race (lost after our pre-check) into AlreadyExists.

    Other integrity errors (a foreign key whose row a concurrent change deleted) propagate:
    they are not a taken name, and the caller's error mapping words them
    (:func:`gateway.db.errors.classify`). After either, the session's transaction must be
    rolled back by the caller, which ``with factory.begin()`` does.
    """
    try:
        session.flush()
    except IntegrityError as exc:
        if not is_unique_violation(exc):
            raise
        raise AlreadyExists(conflict_message) from exc


def name_taken(entity: str, name: str) -> str:
    return f"{entity} {name!r} already exists"


def ensure_name_free(session: Session, find: Finder, entity: str, name: str) -> None:
    """Refuse a name another row of the entity already has (checked before any write)."""
    if find(session, name) is not None:
        raise AlreadyExists(name_taken(entity, name), param="name")


def add_audited(
    session: Session,
    row: RowT,
    *,
    actor: str,
    entity: str,
    conflict: str,
    view: View = snapshot,
) -> RowT:
    """Insert ``row`` and its ``create`` audit entry; ``conflict`` is the lost-race message."""
    session.add(row)
    flush(session, conflict)
    audit(session, actor=actor, action="create", entity=entity, before=None, after=view(row))
    return row


def add_named(
    session: Session,
    row: RowT,
    name: str,
    find: Finder,
    *,
    actor: str,
    entity: str,
) -> RowT:
    """:func:`add_audited` for a row with a unique ``name``, refused up front if it is taken."""
    ensure_name_free(session, find, entity, name)
    return add_audited(session, row, actor=actor, entity=entity, conflict=name_taken(entity, name))


def update_named(
    session: Session,
    row: Base,
    changes: Mapping[str, Any],
    *,
    validate: Callable[[Mapping[str, Any]], dict[str, Any]],
    find: Finder,
    actor: str,
    action: str,
    entity: str,
    on_change: Callable[[], None] | None = None,
) -> None:
    """Partially update a row with a unique ``name``: validate, name check, diff, write, audit.

    ``validate`` checks the whole prospective state (the row's snapshot with ``changes`` over
    it). Only fields that differ are set; a no-op writes nothing and no audit row.
    ``on_change`` runs after the fields are set and before the flush (e.g. to move a
    relationship).
    """
    before = snapshot(row)
    values = validate({**before, **changes})
    name = values["name"]
    if name != before["name"]:
        ensure_name_free(session, find, entity, name)
    changed = {k: v for k, v in values.items() if before.get(k) != v}
    if not changed:
        return
    for key, value in changed.items():
        setattr(row, key, value)
    if on_change is not None:
        on_change()
    flush(session, name_taken(entity, name))
    audit(session, actor=actor, action=action, entity=entity, before=before, after=snapshot(row))


def record_change(
    session: Session,
    before: dict[str, Any],
    after: dict[str, Any],
    *,
    actor: str,
    action: str,
    entity: str,
) -> None:
    """Flush an in-place change and audit it, unless it changed nothing the audit shows."""
    if after != before:
        session.flush()
        audit(session, actor=actor, action=action, entity=entity, before=before, after=after)


def delete_audited(
    session: Session, row: Base, *, actor: str, entity: str, view: View = snapshot
) -> None:
    """Delete ``row`` and add its ``delete`` audit entry (the entry keeps what was deleted)."""
    before = view(row)
    session.delete(row)
    session.flush()
    audit(session, actor=actor, action="delete", entity=entity, before=before, after=None)
