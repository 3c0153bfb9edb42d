"""``/requests``: the request log — each recent request as every stage saw it (admission's
verdict and predicted TTFT, the router's prediction, queue wait, measured engine TTFT, TTFT,
TPOT, gain, attempts) and why an SLO was missed (``miss_reason``). Never the prompt or the
output.

Newest first, a page at a time by keyset (``before``: the ``next_cursor`` of the page before),
so a page costs the same at a million rows as at ten. A tenant admin reads its own tenant's
only: another tenant, by id or name, another tenant's key, or another tenant's request is 403
``other_tenant`` (alike whether it exists or not). Rows are kept for
``TIERGATE_REQUEST_LOG_DAYS`` days and ``TIERGATE_REQUEST_LOG_ROWS`` rows at most.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel
from sqlalchemy.orm import Session

from gateway.app.accounting import MISS_WORDS
from gateway.app.admin.deps import AdminRoute, PrincipalDep, SessionDep
from gateway.app.admin.helpers import scoped_key, tenant_resolver
from gateway.app.admin.roles import Principal
from gateway.app.admin.schemas import MAX_PAGE, Since, Until
from gateway.db.crud import request_log
from gateway.db.crud.request_log import LogEntry
from gateway.db.errors import InvalidInput, NotFound
from gateway.db.models import MISS_REASONS, USAGE_STATUSES

router = APIRouter(route_class=AdminRoute, tags=["requests"])

DEFAULT_PAGE = 50
MAX_CURSOR = 2**63 - 1

Status = Literal["ok", "error", "rejected", "cancelled"]
Reason = Literal["hopeless", "demoted", "queued", "failover", "engine_slow", "stalled", "unknown"]
assert set(Status.__args__) == set(USAGE_STATUSES)  # type: ignore[attr-defined]
assert set(Reason.__args__) == set(MISS_REASONS)  # type: ignore[attr-defined]


class RequestOut(BaseModel):
    """One request as the stages saw it (times in milliseconds; None: the stage was not
    reached, or had no estimate)."""

    object: Literal["request"] = "request"
    id: int
    request_id: str
    created_at: datetime
    """When it arrived (UTC)."""
    tenant: str | None
    tenant_id: int | None
    key_prefix: str | None
    tier: str | None
    model: str | None
    backend: str | None
    status: str
    http_status: int | None
    reject_reason: str | None
    admission: str | None
    """Admission's verdict: admit, demote or shed (None: refused before it judged)."""
    admission_ttft_ms: float | None
    """The TTFT admission predicted, queue wait included."""
    predicted_ttft_ms: float | None
    """The router's predicted dispatch-to-first-token time on the backend that served it."""
    queue_ms: float | None
    engine_ttft_ms: float | None
    """Measured dispatch-to-first-token time."""
    ttft_ms: float | None
    tpot_ms: float | None
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    attempts: int
    gain: float
    ideal_gain: float
    slo_met: bool | None
    """None: no attainment sample (it did not finish)."""
    miss_reason: str | None
    miss: str | None
    """The miss reason in words."""

    @classmethod
    def of(cls, entry: LogEntry) -> RequestOut:
        r = entry.row
        return cls(
            id=r.id,
            request_id=r.request_id,
            created_at=r.created_at,
            tenant=entry.tenant,
            tenant_id=r.tenant_id,
            key_prefix=entry.key_prefix,
            tier=r.tier,
            model=r.model,
            backend=r.backend,
            status=r.status,
            http_status=r.http_status,
            reject_reason=r.reject_reason,
            admission=r.admission,
            admission_ttft_ms=r.admission_ttft_ms,
            predicted_ttft_ms=r.predicted_ttft_ms,
            queue_ms=r.queue_ms,
            engine_ttft_ms=r.engine_ttft_ms,
            ttft_ms=r.ttft_ms,
            tpot_ms=r.tpot_ms,
            slo_ttft_ms=r.slo_ttft_ms,
            slo_tpot_ms=r.slo_tpot_ms,
            attempts=r.attempts,
            gain=r.gain,
            ideal_gain=r.ideal_gain,
            slo_met=r.slo_met,
            miss_reason=r.miss_reason,
            miss=MISS_WORDS.get(r.miss_reason) if r.miss_reason else None,
        )


class RequestPageOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[RequestOut]
    next_cursor: int | None
    """Pass as ``before`` for the next (older) page; None: this page is the last."""


def filtered_page(
    session: Session,
    who: Principal,
    *,
    limit: int,
    before: int | None,
    tenant: str | None,
    key: str | None,
    status: str | None,
    missed: bool,
    reason: str | None,
    since: datetime | None,
    until: datetime | None,
) -> request_log.LogPage:
    """A page of the log as ``who`` may see it (the dashboard's reader too)."""
    if since is not None and until is not None and since >= until:
        raise InvalidInput("since must be before until", param="since")
    tenant_id = who.tenant_filter(tenant, tenant_resolver(session))
    key_id = None
    if key is not None:
        found = scoped_key(session, who, key)
        key_id = found.id
        if tenant_id is None:
            tenant_id = found.tenant_id  # the tenant's index finds the key's rows
        elif tenant_id != found.tenant_id:
            return request_log.LogPage([], None)
    return request_log.list_requests(
        session,
        limit=limit,
        before=before,
        tenant=tenant_id,
        key=key_id,
        status=status,
        missed=missed,
        reason=reason,
        since=since,
        until=until,
    )


@router.get("/requests")
def list_requests(
    session: SessionDep,
    who: PrincipalDep,
    tenant: Annotated[str | None, Query(max_length=200, description="tenant name or id")] = None,
    key: Annotated[str | None, Query(max_length=64, description="API key prefix")] = None,
    status: Annotated[Status | None, Query(description="the outcome")] = None,
    missed: Annotated[bool, Query(description="only requests that missed their SLO")] = False,
    reason: Annotated[Reason | None, Query(description="only misses for this reason")] = None,
    since: Since = None,
    until: Until = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_CURSOR, description="next_cursor of the page before")
    ] = None,
) -> RequestPageOut:
    """Recent requests, newest first (a tenant admin's: its tenant's), with why each SLO was
    missed; ``next_cursor`` pages on."""
    page = filtered_page(
        session,
        who,
        limit=limit,
        before=before,
        tenant=tenant,
        key=key,
        status=status,
        missed=missed,
        reason=reason,
        since=since,
        until=until,
    )
    data = [RequestOut.of(e) for e in page.entries]
    return RequestPageOut(data=data, next_cursor=page.next_cursor)


def scoped_request(session: Session, who: Principal, ref: str) -> LogEntry:
    """Request ``ref`` (its log id, or its request id), if ``who`` may see it: a tenant admin
    gets 403 alike for another tenant's and for none."""
    text = ref.strip()
    key: int | str = text
    if text.isascii() and text.isdigit():
        key = int(text) if 0 < int(text) <= MAX_CURSOR else 0
    try:
        if key == 0:
            raise NotFound(f"no request {ref!r} in the request log")
        entry = request_log.get_request(session, key)
    except NotFound:
        if who.tenant_bound:
            raise who.foreign("ref") from None
        raise
    who.check_tenant(entry.row.tenant_id, "ref")
    return entry


@router.get("/requests/{ref}")
def get_request(
    session: SessionDep,
    who: PrincipalDep,
    ref: Annotated[str, Path(max_length=128, description="the log id, or the request id")],
) -> RequestOut:
    """One request from the log, by its id or its request id (``chatcmpl-...``)."""
    return RequestOut.of(scoped_request(session, who, ref))


__all__ = ["RequestOut", "RequestPageOut", "filtered_page", "router"]
