"""``/usage``: requests, tokens, SLO attainment and TDG ratio per tenant or tier over a window,
and the same over time (``/usage/series``: per bucket, with TTFT/TPOT percentiles; JSON or
CSV)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response

from gateway.app.admin.deps import AdminRoute, PrincipalDep, SessionDep
from gateway.app.admin.helpers import tenant_resolver, usage_window
from gateway.app.admin.schemas import (
    Hours,
    SeriesGroupOut,
    SeriesPointOut,
    Since,
    TenantUsageOut,
    TierUsageOut,
    Until,
    UsageOut,
    UsageReportOut,
    UsageSeriesOut,
)
from gateway.app.usage_csv import MEDIA_TYPE, series_csv
from gateway.db import crud
from gateway.db.crud.usage_series import DEFAULT_TOP, MAX_TOP

router = APIRouter(route_class=AdminRoute, tags=["usage"])


@router.get("/usage/tenants")
def usage_by_tenant(
    session: SessionDep,
    who: PrincipalDep,
    since: Since = None,
    until: Until = None,
    hours: Hours = None,
    tenant: Annotated[str | None, Query(description="tenant name or id")] = None,
) -> UsageReportOut[TenantUsageOut]:
    """Requests, tokens, SLO attainment and TDG ratio per tenant (default: last 24 h; a tenant
    admin's: its tenant only)."""
    start, end = usage_window(since, until, hours)
    tenant_id = who.tenant_filter(tenant, tenant_resolver(session))
    rows = crud.usage_by_tenant(session, since=start, until=end, tenant=tenant_id)
    data = [
        TenantUsageOut(tenant=r.group, tenant_id=r.group_id, **UsageOut.fields_of(r)) for r in rows
    ]
    return UsageReportOut(since=start, until=end, data=data)


@router.get("/usage/tiers")
def usage_by_tier(
    session: SessionDep,
    since: Since = None,
    until: Until = None,
    hours: Hours = None,
    tier: Annotated[str | None, Query(description="tier name as recorded")] = None,
) -> UsageReportOut[TierUsageOut]:
    """The same summary per tier name as recorded at request time (default: last 24 h)."""
    start, end = usage_window(since, until, hours)
    rows = crud.usage_by_tier(session, since=start, until=end, tier=tier)
    data = [TierUsageOut(tier=r.group, **UsageOut.fields_of(r)) for r in rows]
    return UsageReportOut(since=start, until=end, data=data)


CSV_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the series (JSON), or with `format=csv` or `Accept: text/csv` one CSV "
        "row per bucket and group",
        "content": {"text/csv": {"schema": {"type": "string"}}},
    }
}


def wants_csv(request: Request, fmt: str | None) -> bool:
    """``format`` decides; without it, an ``Accept`` naming ``text/csv`` does."""
    if fmt is not None:
        return fmt == "csv"
    return "text/csv" in request.headers.get("accept", "").lower()


def csv_response(text: str, filename: str) -> Response:
    return Response(
        text,
        media_type=MEDIA_TYPE,
        headers={"content-disposition": f'attachment; filename="{filename}"'},
    )


@router.get("/usage/series", response_model=UsageSeriesOut, responses=CSV_RESPONSE)
def usage_series(
    request: Request,
    session: SessionDep,
    who: PrincipalDep,
    since: Since = None,
    until: Until = None,
    hours: Hours = None,
    bucket: Annotated[
        Literal["auto", "minute", "hour", "day"],
        Query(description="bucket width; auto: minutes up to 6 h, hours up to 31 days, days"),
    ] = "auto",
    group_by: Annotated[
        Literal["none", "tenant", "key", "tier"],
        Query(description="key: per API key (a tenant admin's: its tenant's keys)"),
    ] = "none",
    tenant: Annotated[str | None, Query(description="tenant name or id")] = None,
    tier: Annotated[str | None, Query(description="tier name as recorded")] = None,
    top: Annotated[
        int, Query(ge=1, le=MAX_TOP, description="grouped: the groups with most requests")
    ] = DEFAULT_TOP,
    fmt: Annotated[Literal["json", "csv"] | None, Query(alias="format")] = None,
) -> Any:
    """Usage and spend per time bucket (UTC-aligned) and per tenant, key or tier (default: last
    24 h): requests by outcome, tokens, cost, SLO attainment, TDG ratio and TTFT/TPOT p50/p95/p99 of
    finished requests, aggregated by the database (a tenant admin's: its tenant only)."""
    start, end = usage_window(since, until, hours)
    tenant_id = who.tenant_filter(tenant, tenant_resolver(session))
    series = crud.usage_series(
        session,
        since=start,
        until=end,
        bucket=bucket,
        group_by=group_by,
        tenant=tenant_id,
        tier=tier,
        top=top,
    )
    if wants_csv(request, fmt):
        return csv_response(series_csv(series.points), "usage-series.csv")
    return UsageSeriesOut(
        since=series.since,
        until=series.until,
        bucket=series.bucket,  # type: ignore[arg-type]
        bucket_seconds=series.bucket_s,
        group_by=series.group_by,  # type: ignore[arg-type]
        groups=[SeriesGroupOut(group=g, group_id=i) for g, i in series.groups],
        data=[SeriesPointOut.of(p) for p in series.points],
    )
