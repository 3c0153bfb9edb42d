"""Shared pieces of the CRUD modules: input checks, snapshots, the audit row, flushing.

Validators take the *whole* prospective state of an entity (a mapping), so creation and partial
updates go through one set of rules and an invalid update never touches the ORM object.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.db.errors import AlreadyExists, InvalidInput
from gateway.db.models import AuditLog, Base, utcnow

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_name(value: Any, entity: str, param: str = "name") -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise InvalidInput(
            f"invalid {entity} name {value!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            param=param,
        )
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
    entity_type: str,
    entity_id: object,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> AuditLog:
    """Add the audit row of a mutation to the mutation's own session (same transaction)."""
    if not actor or not actor.strip():
        raise InvalidInput("an audited change needs an actor", param="actor")
    row = AuditLog(
        actor=actor,
        action=action,
        entity_type=entity_type,
        entity_id=str(entity_id),
        before=before,
        after=after,
        at=utcnow(),
    )
    session.add(row)
    return row


def flush(session: Session, conflict_message: str) -> None:
    """Flush, turning a unique-constraint race (lost after our pre-check) into AlreadyExists.

    After a domain error the session's transaction must be rolled back by the caller, which
    ``with factory.begin()`` does.
    """
    try:
        session.flush()
    except IntegrityError as exc:
        raise AlreadyExists(conflict_message) from exc
