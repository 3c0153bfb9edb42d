"""``/ui/audit``: every change, by whom — filter by actor, entity type and id, time range;
each entry's before and after shown as the fields that changed, with the whole JSON beside.

Read through :func:`gateway.db.crud.list_audit` / ``count_audit`` (the admin API's reader).
Times are typed as UTC (``datetime-local``) or ISO 8601 with an offset; a time that is not
one is shown beside its field, 400, as the API would refuse it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gateway.app.ui.deps import OperatorDep, PageDep, SessionDep, UiRoute
from gateway.app.ui.render import pager, render
from gateway.db import crud
from gateway.db.models import AuditLog

router = APIRouter(route_class=UiRoute)

ENTITY_TYPES = (
    "tier",
    "tenant",
    "api_key",
    "backend",
    "profile",
    "operator_credential",
    "operator_session",
)
Filter = Annotated[str | None, Query(max_length=200)]


@dataclass(frozen=True, slots=True)
class Change:
    field: str
    before: str | None
    after: str | None


@dataclass(frozen=True, slots=True)
class Entry:
    row: AuditLog
    changes: list[Change]
    document: str


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def changes(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[Change]:
    """The fields that differ (an update), or every field (a create or a delete)."""
    old, new = before or {}, after or {}
    out = []
    for field in sorted(set(old) | set(new)):
        if field in ("updated_at",) and before is not None and after is not None:
            continue
        if before is not None and after is not None and old.get(field) == new.get(field):
            continue
        out.append(
            Change(
                field,
                _shown(old[field]) if field in old and before is not None else None,
                _shown(new[field]) if field in new and after is not None else None,
            )
        )
    return out


def parse_time(text: str | None, field: str) -> datetime | None:
    """A filter's time: ISO 8601; without an offset it is UTC (what the form says)."""
    if not text or not text.strip():
        return None
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{field}: not a date and time; use YYYY-MM-DDTHH:MM (UTC) or ISO 8601 with an offset"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def parse_window(
    since: str | None, until: str | None, errors: dict[str, str]
) -> dict[str, datetime | None]:
    """A page's ``since``/``until`` filters (:func:`parse_time`); what is wrong with them goes
    into ``errors`` by field, worded for the form."""
    window: dict[str, datetime | None] = {}
    for field, text in (("since", since), ("until", until)):
        try:
            window[field] = parse_time(text, field)
        except ValueError as exc:
            errors[field] = str(exc)
    if not errors and window["since"] and window["until"] and window["since"] >= window["until"]:
        errors["since"] = "since must be before until"
    return window


@router.get("/audit")
def audit_log(
    request: Request,
    operator: OperatorDep,
    session: SessionDep,
    page: PageDep,
    actor: Filter = None,
    operator_name: Annotated[str | None, Query(alias="operator", max_length=200)] = None,
    entity_type: Filter = None,
    entity_id: Filter = None,
    since: Filter = None,
    until: Filter = None,
) -> Response:
    filters = {
        "actor": actor or "",
        "operator": operator_name or "",
        "entity_type": entity_type or "",
        "entity_id": entity_id or "",
        "since": since or "",
        "until": until or "",
    }
    errors: dict[str, str] = {}
    window = parse_window(since, until, errors)
    context: dict[str, Any] = {
        "filters": filters,
        "entity_types": ENTITY_TYPES,
        "errors": errors,
        "filtered": any(filters.values()),
    }
    if errors:
        empty = pager(request, total=0, limit=page.limit, offset=page.offset, shown=0)
        return render(
            request,
            "audit.html",
            status_code=400,
            active="audit",
            title="Audit",
            entries=[],
            pager=empty,
            **context,
        )
    since_at, until_at = window["since"], window["until"]
    filters_in = {
        "actor": actor or None,
        "operator": operator_name or None,
        "entity_type": entity_type or None,
        "entity_id": entity_id or None,
    }
    rows = crud.list_audit(
        session,
        since=since_at,
        until=until_at,
        limit=page.limit,
        offset=page.offset,
        **filters_in,
    )
    total = crud.count_audit(session, since=since_at, until=until_at, **filters_in)
    entries = [
        Entry(
            r,
            changes(r.before, r.after),
            json.dumps({"before": r.before, "after": r.after}, indent=2, ensure_ascii=False),
        )
        for r in rows
    ]
    return render(
        request,
        "audit.html",
        active="audit",
        title="Audit",
        entries=entries,
        pager=pager(request, total=total, limit=page.limit, offset=page.offset, shown=len(rows)),
        **context,
    )
