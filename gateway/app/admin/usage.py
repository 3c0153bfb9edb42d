"""``/usage``: requests, tokens, SLO attainment and TDG ratio per tenant or tier over a window."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.app.admin.deps import AdminRoute, SessionDep
from gateway.app.admin.helpers import resolve, usage_window
from gateway.app.admin.schemas import (
    Hours,
    Since,
    TenantUsageOut,
    TierUsageOut,
    Until,
    UsageOut,
    UsageReportOut,
)
from gateway.db import crud

router = APIRouter(route_class=AdminRoute, tags=["usage"])


@router.get("/usage/tenants")
def usage_by_tenant(
    session: SessionDep,
    since: Since = None,
    until: Until = None,
    hours: Hours = None,
    tenant: Annotated[str | None, Query(description="tenant name or id")] = None,
) -> UsageReportOut[TenantUsageOut]:
    """Requests, tokens, SLO attainment and TDG ratio per tenant (default: last 24 h)."""
    start, end = usage_window(since, until, hours)
    tenant_id = resolve(crud.get_tenant, session, tenant).id if tenant is not None else None
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
