"""Usage summaries per tenant and per tier over a time window.

SLO attainment counts every request, rejected and failed ones included: a request that was shed
or failed did not get its SLO. The TDG ratio is Σgain / Σideal gain (PROSERVE's normalised
token-level deadline-aware gain), so a tier's ratio weighs long requests by their tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, case, func, select
from sqlalchemy.orm import Session

from gateway.db.crud.tenants import get_tenant
from gateway.db.errors import InvalidInput
from gateway.db.models import Tenant, UsageRecord


@dataclass(frozen=True, slots=True)
class UsageSummary:
    """Totals of one group (a tenant or a tier) in the window."""

    group: str | None  # tenant or tier name; None for records of deleted tenants
    group_id: int | None  # tenant id when grouped by tenant
    requests: int
    ok: int
    errors: int
    rejected: int
    cancelled: int
    prompt_tokens: int
    completion_tokens: int
    slo_met: int
    gain: float
    ideal_gain: float

    @property
    def slo_attainment(self) -> float | None:
        return self.slo_met / self.requests if self.requests else None

    @property
    def tdg_ratio(self) -> float | None:
        return self.gain / self.ideal_gain if self.ideal_gain > 0 else None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _count_status(status: str) -> ColumnElement[Any]:
    return func.coalesce(func.sum(case((UsageRecord.status == status, 1), else_=0)), 0)


_AGGREGATES = (
    func.count(UsageRecord.id),
    _count_status("ok"),
    _count_status("error"),
    _count_status("rejected"),
    _count_status("cancelled"),
    func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
    func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
    func.coalesce(func.sum(case((UsageRecord.slo_met.is_(True), 1), else_=0)), 0),
    func.coalesce(func.sum(UsageRecord.gain), 0.0),
    func.coalesce(func.sum(UsageRecord.ideal_gain), 0.0),
)


def _window(query: Select[Any], since: datetime | None, until: datetime | None) -> Select[Any]:
    for value, name in ((since, "since"), (until, "until")):
        if value is not None and value.tzinfo is None:
            raise InvalidInput(f"{name} must be timezone-aware", param=name)
    if since is not None:
        query = query.where(UsageRecord.created_at >= since)
    if until is not None:
        query = query.where(UsageRecord.created_at < until)
    return query


def _summary(group: str | None, group_id: int | None, values: Any) -> UsageSummary:
    n, ok, err, rej, canc, p_tok, c_tok, met, gain, ideal = values
    return UsageSummary(
        group=group,
        group_id=group_id,
        requests=int(n),
        ok=int(ok),
        errors=int(err),
        rejected=int(rej),
        cancelled=int(canc),
        prompt_tokens=int(p_tok),
        completion_tokens=int(c_tok),
        slo_met=int(met),
        gain=float(gain),
        ideal_gain=float(ideal),
    )


def usage_by_tenant(
    session: Session,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant: int | str | None = None,
) -> list[UsageSummary]:
    """One summary per tenant with records in ``[since, until)``, by tenant name."""
    query = (
        select(UsageRecord.tenant_id, Tenant.name, *_AGGREGATES)
        .outerjoin(Tenant, UsageRecord.tenant_id == Tenant.id)
        .group_by(UsageRecord.tenant_id, Tenant.name)
        .order_by(Tenant.name)
    )
    if tenant is not None:
        query = query.where(UsageRecord.tenant_id == get_tenant(session, tenant).id)
    rows = session.execute(_window(query, since, until)).all()
    return [_summary(row[1], row[0], row[2:]) for row in rows]


def usage_by_tier(
    session: Session,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    tier: str | None = None,
) -> list[UsageSummary]:
    """One summary per tier name (as recorded at request time) in ``[since, until)``."""
    query = (
        select(UsageRecord.tier, *_AGGREGATES).group_by(UsageRecord.tier).order_by(UsageRecord.tier)
    )
    if tier is not None:
        query = query.where(UsageRecord.tier == tier)
    rows = session.execute(_window(query, since, until)).all()
    return [_summary(row[0], None, row[1:]) for row in rows]
