"""``/ui/requests``: the request log — recent requests newest first, each with what its stages
knew (admission's verdict, predicted and measured TTFT, queue wait, TPOT, attempts) and why an
SLO was missed, in words; above them each tenant's SLO attainment over the last hour with its
misses by reason.

Read through the admin API's reader (:func:`gateway.app.admin.requests.filtered_page`), so a
tenant admin sees its own tenant's only, as the API enforces it. Pages run by keyset (an
"Older" link carries the cursor), never by offset: a page costs the same at a million rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gateway.app.accounting import MISS_WORDS
from gateway.app.admin.helpers import tenant_resolver
from gateway.app.admin.requests import MAX_CURSOR, filtered_page
from gateway.app.ui.audit import parse_window
from gateway.app.ui.deps import OperatorDep, SessionDep, UiRoute
from gateway.app.ui.render import page_url, render
from gateway.db.crud.request_log import Attainment, LogPage, attainment_by_tenant
from gateway.db.models import MISS_REASONS, USAGE_STATUSES, utcnow

router = APIRouter(route_class=UiRoute)

PAGE_ROWS = 50
SUMMARY_WINDOW = timedelta(hours=1)
"""The attainment summary's window: recent enough to be cheap at a million rows."""
Filter = Annotated[str | None, Query(max_length=200)]


@dataclass(frozen=True, slots=True)
class Summary:
    row: Attainment
    misses: list[tuple[str, int]]
    """(reason in words, count), most first."""


def _summary(rows: list[Attainment]) -> list[Summary]:
    return [
        Summary(r, sorted(((MISS_WORDS.get(k, k), n) for k, n in r.misses.items()), key=_most))
        for r in rows
    ]


def _most(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


@router.get("/requests")
def requests_page(
    request: Request,
    operator: OperatorDep,
    session: SessionDep,
    tenant: Filter = None,
    key: Filter = None,
    status: Filter = None,
    reason: Filter = None,
    missed: Filter = None,
    since: Filter = None,
    until: Filter = None,
    before: Filter = None,
) -> Response:
    who = operator.principal
    filters = {
        "tenant": tenant or "",
        "key": key or "",
        "status": status or "",
        "reason": reason or "",
        "missed": "1" if missed else "",
        "since": since or "",
        "until": until or "",
    }
    errors: dict[str, str] = {}
    if status and status not in USAGE_STATUSES:
        errors["status"] = f"status: one of {', '.join(USAGE_STATUSES)}"
    if reason and reason not in MISS_REASONS:
        errors["reason"] = f"reason: one of {', '.join(MISS_REASONS)}"
    cursor = None
    if before:
        if before.isascii() and before.isdigit() and 0 < int(before) <= MAX_CURSOR:
            cursor = int(before)
        else:
            errors["before"] = "before: a page cursor (a positive whole number)"
    window = parse_window(since, until, errors)
    context: dict[str, Any] = {
        "filters": filters,
        "statuses": USAGE_STATUSES,
        "reasons": [(r, MISS_WORDS[r]) for r in MISS_REASONS],
        "words": MISS_WORDS,
        "errors": errors,
        "filtered": any(filters.values()),
        "newest_url": page_url(request, before=None) if cursor else None,
    }
    if errors:
        return render(
            request,
            "requests.html",
            status_code=400,
            active="requests",
            title="Requests",
            entries=[],
            summary=[],
            older_url=None,
            **context,
        )
    page: LogPage = filtered_page(
        session,
        who,
        limit=PAGE_ROWS,
        before=cursor,
        tenant=tenant or None,
        key=key or None,
        status=status or None,
        missed=bool(missed),
        reason=reason or None,
        since=window["since"],
        until=window["until"],
    )
    scope = who.tenant_filter(tenant or None, tenant_resolver(session))
    summary = attainment_by_tenant(session, since=utcnow() - SUMMARY_WINDOW, tenant=scope)
    older = page_url(request, before=page.next_cursor) if page.next_cursor else None
    return render(
        request,
        "requests.html",
        active="requests",
        title="Requests",
        entries=page.entries,
        summary=_summary(summary),
        older_url=older,
        **context,
    )
