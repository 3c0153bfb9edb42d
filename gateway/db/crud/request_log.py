"""Reading the request log: a page of requests newest first (keyset: ``id < cursor``), one
request, and SLO attainment per tenant with the misses by reason.

A page is found through an index whatever the filters: ``(tenant_id, id)`` for a tenant's (a
key's too: the key's tenant is its filter as well), ``id`` (the primary key) for everyone's,
and the partial indexes of the misses only for ``missed``. A page never counts the rows behind
it (a count is a scan of the table at a million rows); it says whether there is a next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from gateway.db.errors import NotFound
from gateway.db.models import ApiKey, RequestLog, Tenant

__all__ = [
    "Attainment",
    "LogEntry",
    "LogPage",
    "attainment_by_tenant",
    "get_request",
    "list_requests",
]


@dataclass(frozen=True, slots=True)
class LogEntry:
    """A request-log row with the names of its tenant and key as they are now (None: deleted)."""

    row: RequestLog
    tenant: str | None
    key_prefix: str | None


@dataclass(frozen=True, slots=True)
class LogPage:
    entries: list[LogEntry]
    next_cursor: int | None
    """The ``before`` of the next page (None: this is the last)."""


@dataclass(frozen=True, slots=True)
class Attainment:
    """A tenant's finished requests (the attainment samples), how many met their SLO, and the
    misses (and hopeless refusals) by reason, over a window."""

    tenant_id: int | None
    tenant: str | None
    requests: int
    samples: int
    met: int
    misses: dict[str, int]

    @property
    def attainment(self) -> float | None:
        return self.met / self.samples if self.samples else None


def _entries(session: Session, query: Select[RequestLog]) -> list[LogEntry]:
    rows = list(session.scalars(query))
    tenant_ids = {r.tenant_id for r in rows if r.tenant_id is not None}
    key_ids = {r.api_key_id for r in rows if r.api_key_id is not None}
    tenants: dict[int, str] = {}
    keys: dict[int, str] = {}
    if tenant_ids:
        found = session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(tenant_ids)))
        tenants = {i: n for i, n in found.all()}
    if key_ids:
        found = session.execute(select(ApiKey.id, ApiKey.prefix).where(ApiKey.id.in_(key_ids)))
        keys = {i: p for i, p in found.all()}
    return [
        LogEntry(
            r,
            tenants.get(r.tenant_id) if r.tenant_id is not None else None,
            keys.get(r.api_key_id) if r.api_key_id is not None else None,
        )
        for r in rows
    ]


def list_requests(
    session: Session,
    *,
    limit: int,
    before: int | None = None,
    tenant: int | None = None,
    key: int | None = None,
    status: str | None = None,
    missed: bool = False,
    reason: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> LogPage:
    """Requests newest first (by id), those with an id below ``before``; ``key`` is an API
    key's id (pass its tenant as ``tenant`` too: the tenant's index then finds the page)."""
    query = select(RequestLog)
    if before is not None:
        query = query.where(RequestLog.id < before)
    if tenant is not None:
        query = query.where(RequestLog.tenant_id == tenant)
    if key is not None:
        query = query.where(RequestLog.api_key_id == key)
    if status is not None:
        query = query.where(RequestLog.status == status)
    if reason is not None:
        query = query.where(RequestLog.miss_reason == reason)
    elif missed:
        query = query.where(RequestLog.miss_reason.is_not(None))
    if since is not None:
        query = query.where(RequestLog.created_at >= since)
    if until is not None:
        query = query.where(RequestLog.created_at < until)
    query = query.order_by(RequestLog.id.desc()).limit(limit + 1)
    entries = _entries(session, query)
    more = len(entries) > limit
    entries = entries[:limit]
    return LogPage(entries, entries[-1].row.id if more and entries else None)


def get_request(session: Session, ref: int | str) -> LogEntry:
    """One request by its log id or its request id (``chatcmpl-...``); NotFound otherwise."""
    query = select(RequestLog)
    if isinstance(ref, int):
        query = query.where(RequestLog.id == ref)
    else:
        query = query.where(RequestLog.request_id == ref)
    entries = _entries(session, query)
    if not entries:
        raise NotFound(f"no request {ref!r} in the request log")
    return entries[0]


def attainment_by_tenant(
    session: Session, *, since: datetime, tenant: int | None = None
) -> list[Attainment]:
    """Per tenant since ``since``: requests, attainment samples (finished), met, misses by
    reason; most requests first."""
    sampled = RequestLog.slo_met.is_not(None)
    grouped = (
        select(
            RequestLog.tenant_id,
            RequestLog.miss_reason,
            func.count(),
            func.sum(case((sampled, 1), else_=0)),
            func.sum(case((RequestLog.slo_met.is_(True), 1), else_=0)),
        )
        .where(RequestLog.created_at >= since)
        .group_by(RequestLog.tenant_id, RequestLog.miss_reason)
    )
    if tenant is not None:
        grouped = grouped.where(RequestLog.tenant_id == tenant)
    totals: dict[int | None, list[int]] = {}
    misses: dict[int | None, dict[str, int]] = {}
    for tenant_id, why, count, samples, met in session.execute(grouped).all():
        total = totals.setdefault(tenant_id, [0, 0, 0])
        total[0] += int(count)
        total[1] += int(samples or 0)
        total[2] += int(met or 0)
        if why is not None:
            misses.setdefault(tenant_id, {})[why] = int(count)
    ids = [t for t in totals if t is not None]
    names: dict[int, str] = {}
    if ids:
        found = session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(ids)))
        names = {i: n for i, n in found.all()}
    out = [
        Attainment(
            t,
            names.get(t) if t is not None else None,
            requests=v[0],
            samples=v[1],
            met=v[2],
            misses=misses.get(t, {}),
        )
        for t, v in totals.items()
    ]
    return sorted(out, key=lambda a: (-a.requests, a.tenant or ""))
