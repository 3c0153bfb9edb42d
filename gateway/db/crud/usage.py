"""Usage summaries per tenant and per tier over a time window (definitions: ``docs/usage.md``).

Each outcome is reported on its own and never mixed into another's numbers:

* ``requests`` counts every request; ``ok``, ``errors`` (failed), ``rejected`` and ``cancelled``
  split it by outcome.
* Tokens (``prompt_tokens``, ``completion_tokens``) are those of finished (``ok``) requests;
  what an engine spent on cancelled and failed ones is in ``cancelled_tokens`` and
  ``failed_tokens``. A rejected request consumed nothing and has no tokens.
* SLO attainment is ``slo_met / ok``: only a finished request is a sample. A tenant's own 429s
  and 4xx, a shed request, a failure or a cancellation are not misses; they are counted above.
* ``cost`` is what the records were charged (``usage_records.cost``, exact decimals; records of
  models without a price, and those before prices existed, add nothing).
* The TDG ratio is Σgain / Σideal gain over work an engine accepted (PROSERVE's normalised
  token-level deadline-aware gain), so a tier's ratio weighs long requests by their tokens.
  Rejected rows are left out of the sums even if an old row carries an ideal gain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, Select, case, func, select
from sqlalchemy.orm import Session

from gateway.db.crud.tenants import get_tenant
from gateway.db.errors import InvalidInput
from gateway.db.models import Tenant, UsageRecord
from gateway.db.money import MONEY_PLACES


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
    cancelled_tokens: int
    failed_tokens: int
    slo_met: int
    gain: float
    ideal_gain: float
    cost: Decimal = field(default_factory=Decimal)
    """What the group's records were charged (9 decimals)."""

    @property
    def slo_attainment(self) -> float | None:
        """Met SLOs over finished requests (None when none finished)."""
        return self.slo_met / self.ok if self.ok else None

    @property
    def tdg_ratio(self) -> float | None:
        return self.gain / self.ideal_gain if self.ideal_gain > 0 else None

    @property
    def total_tokens(self) -> int:
        """Tokens of finished requests (cancelled and failed ones are reported apart)."""
        return self.prompt_tokens + self.completion_tokens


def _sum_where(condition: ColumnElement[bool], value: Any, zero: Any = 0) -> ColumnElement[Any]:
    return func.coalesce(func.sum(case((condition, value), else_=zero)), zero)


def _count_status(status: str) -> ColumnElement[Any]:
    return _sum_where(UsageRecord.status == status, 1)


_OK = UsageRecord.status == "ok"
_ACCOUNTED = UsageRecord.status != "rejected"
_TOKENS = UsageRecord.prompt_tokens + UsageRecord.completion_tokens

_AGGREGATES = (
    func.count(UsageRecord.id),
    _count_status("ok"),
    _count_status("error"),
    _count_status("rejected"),
    _count_status("cancelled"),
    _sum_where(_OK, UsageRecord.prompt_tokens),
    _sum_where(_OK, UsageRecord.completion_tokens),
    _sum_where(UsageRecord.status == "cancelled", _TOKENS),
    _sum_where(UsageRecord.status == "error", _TOKENS),
    _sum_where(_OK & UsageRecord.slo_met.is_(True), 1),
    _sum_where(_ACCOUNTED, UsageRecord.gain, 0.0),
    _sum_where(_ACCOUNTED, UsageRecord.ideal_gain, 0.0),
    func.coalesce(func.sum(UsageRecord.cost), 0),
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
    n, ok, err, rej, canc, p_tok, c_tok, canc_tok, err_tok, met, gain, ideal, cost = values
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
        cancelled_tokens=int(canc_tok),
        failed_tokens=int(err_tok),
        slo_met=int(met),
        gain=float(gain),
        ideal_gain=float(ideal),
        cost=money(cost),
    )


def money(value: object) -> Decimal:
    """A summed cost as the database answers it (PostgreSQL: an exact NUMERIC; SQLite: a
    double) to nine decimals, so both read alike."""
    if value is None:
        return Decimal(0).quantize(MONEY_PLACES)
    return Decimal(str(value)).quantize(MONEY_PLACES)


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
