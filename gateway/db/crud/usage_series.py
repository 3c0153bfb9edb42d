"""Usage over time: per time bucket (and per tenant or tier), aggregated by the database.

The dashboard's usage charts and ``GET /admin/v1/usage/series`` read this. Every number
follows ``docs/usage.md`` and is computed by the same SQL aggregates as the usage summaries
(:data:`gateway.db.crud.usage._AGGREGATES`), so a chart never disagrees with
``tiergate usage``: requests by outcome, tokens of finished requests, Σgain / Σideal gain over
accepted work, SLO attainment = met / finished. On top of those, TTFT and TPOT percentiles
(p50/p95/p99) of *finished* requests — the same rows that are SLO samples.

Buckets are fixed widths (a minute, an hour, a day) counted from the Unix epoch, so they are
UTC-aligned and identical on every database: a record's bucket starts at
``floor(epoch(created_at) / width) * width``. PostgreSQL reads a series bucket by bucket
(``generate_series`` of those starts, each bucket's records by a range scan of
``ix_usage_records_created``: no sort of the whole window), or groups by ``date_trunc`` of the
UTC time; SQLite groups by ``strftime('%s')`` of the stored text cut to whole seconds (its own
parser would round ``…59.9996`` up into the next second).

Percentiles are ``percentile_cont`` (linear interpolation between the two closest ranks, as
PostgreSQL defines it). PostgreSQL computes them natively; SQLite has no ordered-set
aggregates, so there the same definition is computed from window functions: each value's rank
in its bucket (``row_number``) and the bucket's size (``count() over``) pick the two ranks
around ``p·(n−1)``, and the interpolation is done in the same query. Both give the same numbers
on the same rows (``tests/gateway/test_usage_series.py``).

Grouped by tenant, key or tier, only the ``top`` groups with the most requests in the window are
returned (10,000 tenants do not fit on a chart); records of deleted tenants form one group with
no name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Float,
    Integer,
    Select,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from gateway.db.crud.tenants import get_tenant
from gateway.db.crud.usage import _AGGREGATES, UsageSummary, _summary
from gateway.db.errors import InvalidInput
from gateway.db.models import ApiKey, Tenant, UsageRecord, utcnow
from gateway.db.security import display_prefix

BUCKETS: dict[str, int] = {"minute": 60, "hour": 3600, "day": 86400}
"""Bucket widths in seconds, by name."""
BucketName = Literal["auto", "minute", "hour", "day"]
GroupBy = Literal["none", "tenant", "key", "tier"]
GROUPINGS: tuple[str, ...] = ("none", "tenant", "key", "tier")
PERCENTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
MAX_BUCKETS = 50_000
"""Most buckets one window may span: a century of days, or five weeks of minutes."""
MAX_TOP = 50
AGGREGATE_WORK_MEM = "64MB"
"""PostgreSQL's ``work_mem`` for one aggregation (its sorts stay in memory)."""
DEFAULT_TOP = 10

_AUTO = ((timedelta(hours=6), "minute"), (timedelta(days=31), "hour"))
"""Widest window for each bucket of :func:`auto_bucket` (wider: days)."""


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One bucket of one group: the usage summary and the latency percentiles (ms) of its
    finished requests, in :data:`PERCENTILES` order (None where it has none)."""

    start: datetime
    summary: UsageSummary
    ttft_ms: tuple[float | None, ...]
    tpot_ms: tuple[float | None, ...]


@dataclass(frozen=True, slots=True)
class UsageSeries:
    """The answer: the window, the bucket, the groups (most requests first) and the points
    that have records (by time, then group)."""

    since: datetime
    until: datetime
    bucket: str
    bucket_s: int
    group_by: str
    groups: list[tuple[str | None, int | None]] = field(default_factory=list)
    points: list[SeriesPoint] = field(default_factory=list)

    def bucket_starts(self) -> list[datetime]:
        """Every bucket of the window, empty or not: the x axis of a chart."""
        first = _floor(self.since, self.bucket_s)
        count = math.ceil((self.until - first).total_seconds() / self.bucket_s)
        return [first + timedelta(seconds=i * self.bucket_s) for i in range(count)]


def auto_bucket(since: datetime, until: datetime) -> str:
    """Minutes up to 6 hours, hours up to 31 days, days beyond: a few hundred points."""
    span = until - since
    for widest, name in _AUTO:
        if span <= widest:
            return name
    return "day"


def _floor(moment: datetime, width: int) -> datetime:
    epoch = int(moment.timestamp() // width) * width
    return datetime.fromtimestamp(epoch, UTC)


def _sql(text: str) -> ColumnElement[Any]:
    """A constant written into the SQL rather than bound: PostgreSQL matches a selected
    expression to its GROUP BY twin only if they are the same text, and two bound parameters
    are two expressions (it also shares one sort between aggregates only when their arguments
    are identical)."""
    return literal_column(text)


_UNITS = {width: name for name, width in BUCKETS.items()}


def _bucket_expr(native: bool, width: int) -> ColumnElement[Any]:
    """Where a record's bucket starts, to ``GROUP BY``. PostgreSQL: ``date_trunc`` of the UTC
    wall time (for a minute, an hour or a day the same instant as the epoch floor, and far
    cheaper per row than ``numeric`` epoch arithmetic). SQLite: the epoch second, from the
    stored text cut to whole seconds (``strftime`` would round ``…59.9996`` up)."""
    if native:
        utc = func.timezone(_sql("'UTC'"), UsageRecord.created_at)
        return func.date_trunc(_sql(f"'{_UNITS[width]}'"), utc)
    w = _sql(str(int(width)))
    whole = func.strftime(_sql("'%s'"), func.substr(UsageRecord.created_at, 1, 19))
    return cast(whole, Integer) // w * w


def _bucket_start(value: Any) -> datetime:
    """A bucket key as read back: an epoch second (SQLite, or the totals' constant) or a UTC
    wall time (PostgreSQL's ``date_trunc``)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return datetime.fromtimestamp(int(value), UTC)


def _group_expr(group_by: str) -> ColumnElement[Any] | None:
    """The group key; None when ungrouped. A tenant's id, 0 for deleted tenants (a key the
    ``IN`` of the top tenants can match); a tier's name as recorded, the column itself so that
    PostgreSQL can read the window in tier order from ``ix_usage_records_tier_created``
    instead of sorting it (NULL: no tier)."""
    if group_by == "tenant":
        return func.coalesce(UsageRecord.tenant_id, _sql("0"))
    if group_by == "key":
        return func.coalesce(UsageRecord.api_key_id, _sql("0"))
    if group_by == "tier":
        return UsageRecord.tier.expression
    return None


def _check_aware(value: datetime, name: str) -> datetime:
    if value.tzinfo is None:
        raise InvalidInput(f"{name} must be timezone-aware", param=name)
    return value.astimezone(UTC)


def _bucket_width(bucket: str, since: datetime, until: datetime) -> tuple[str, int]:
    name = auto_bucket(since, until) if bucket == "auto" else bucket
    if name not in BUCKETS:
        raise InvalidInput(
            f"bucket must be one of auto, {', '.join(BUCKETS)}; got {bucket!r}", param="bucket"
        )
    width = BUCKETS[name]
    count = math.ceil((until - _floor(since, width)).total_seconds() / width)
    if count > MAX_BUCKETS:
        raise InvalidInput(
            f"the window spans {count:,} {name} buckets (at most {MAX_BUCKETS:,}): "
            "choose a wider bucket or a shorter window",
            param="bucket",
        )
    return name, width


@dataclass(frozen=True, slots=True)
class _Filters:
    since: datetime
    until: datetime
    tenant_id: int | None
    tier: str | None

    def apply(self, query: Select[Any]) -> Select[Any]:
        query = query.where(
            UsageRecord.created_at >= self.since, UsageRecord.created_at < self.until
        )
        if self.tenant_id is not None:
            query = query.where(UsageRecord.tenant_id == self.tenant_id)
        if self.tier is not None:
            query = query.where(UsageRecord.tier == self.tier)
        return query


@dataclass(frozen=True, slots=True)
class SeriesPlan:
    """A checked request for a series: the window, the bucket, the grouping and filters.
    Making one queries nothing but the tenant filter's id, so a caller can refuse a window
    (too many buckets to draw, say) before any aggregation runs."""

    filters: _Filters
    bucket: str
    bucket_s: int
    group_by: str
    top: int

    @property
    def since(self) -> datetime:
        return self.filters.since

    @property
    def until(self) -> datetime:
        return self.filters.until

    @property
    def buckets(self) -> int:
        """How many buckets the window spans."""
        first = _floor(self.since, self.bucket_s)
        return math.ceil((self.until - first).total_seconds() / self.bucket_s)


def plan_series(
    session: Session,
    *,
    since: datetime,
    until: datetime | None = None,
    bucket: str = "auto",
    group_by: str = "none",
    tenant: int | str | None = None,
    tier: str | None = None,
    top: int = DEFAULT_TOP,
) -> SeriesPlan:
    """Check a series request (see :func:`usage_series`); raises the data layer's errors."""
    since = _check_aware(since, "since")
    until = _check_aware(until, "until") if until is not None else utcnow()
    if since >= until:
        raise InvalidInput("since must be before until", param="since")
    if group_by not in GROUPINGS:
        raise InvalidInput(
            f"group_by must be one of {', '.join(GROUPINGS)}; got {group_by!r}", param="group_by"
        )
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= MAX_TOP:
        raise InvalidInput(f"top must be an integer from 1 to {MAX_TOP}, got {top!r}", param="top")
    name, width = _bucket_width(bucket, since, until)
    tenant_id = get_tenant(session, tenant).id if tenant is not None else None
    return SeriesPlan(_Filters(since, until, tenant_id, tier), name, width, group_by, top)


def usage_series(
    session: Session,
    *,
    since: datetime,
    until: datetime | None = None,
    bucket: str = "auto",
    group_by: str = "none",
    tenant: int | str | None = None,
    tier: str | None = None,
    top: int = DEFAULT_TOP,
) -> UsageSeries:
    """Usage in ``[since, until)`` (until: now) per bucket, and per tenant or tier.

    ``bucket`` is ``auto`` (:func:`auto_bucket`), ``minute``, ``hour`` or ``day``;
    ``group_by`` is ``none``, ``tenant`` or ``tier``; ``tenant`` and ``tier`` filter;
    ``top`` caps the groups (1-50) at those with the most requests in the window.
    """
    plan = plan_series(
        session,
        since=since,
        until=until,
        bucket=bucket,
        group_by=group_by,
        tenant=tenant,
        tier=tier,
        top=top,
    )
    return run_series(session, plan)


def run_series(session: Session, plan: SeriesPlan) -> UsageSeries:
    """The series of a checked plan."""
    rows = aggregate(
        session, plan.filters, width=plan.bucket_s, group_by=plan.group_by, top=plan.top
    )
    return UsageSeries(
        since=plan.since,
        until=plan.until,
        bucket=plan.bucket,
        bucket_s=plan.bucket_s,
        group_by=plan.group_by,
        groups=_groups_of(rows),
        points=rows,
    )


def usage_totals(
    session: Session,
    *,
    since: datetime,
    until: datetime | None = None,
    group_by: str = "none",
    tenant: int | str | None = None,
    tier: str | None = None,
    top: int = DEFAULT_TOP,
) -> list[SeriesPoint]:
    """The same numbers over the whole window (one point per group, at ``since``, most
    requests first): the table under the charts, percentiles included."""
    plan = plan_series(
        session,
        since=since,
        until=until,
        bucket="day",  # checked like a series; the totals themselves have one bucket
        group_by=group_by,
        tenant=tenant,
        tier=tier,
        top=top,
    )
    return run_totals(session, plan)


def run_totals(session: Session, plan: SeriesPlan) -> list[SeriesPoint]:
    """The totals of a checked plan (its bucket ignored)."""
    points = aggregate(session, plan.filters, width=None, group_by=plan.group_by, top=plan.top)
    return sorted(points, key=lambda p: (-p.summary.requests, p.summary.group is None))


def _groups_of(points: list[SeriesPoint]) -> list[tuple[str | None, int | None]]:
    """Groups by requests in the window, most first (then by name)."""
    totals: dict[tuple[str | None, int | None], int] = {}
    for p in points:
        key = (p.summary.group, p.summary.group_id)
        totals[key] = totals.get(key, 0) + p.summary.requests
    return sorted(totals, key=lambda g: (-totals[g], g[0] or "", g[1] or 0))


def aggregate(
    session: Session, filters: _Filters, *, width: int | None, group_by: str, top: int
) -> list[SeriesPoint]:
    """Run the aggregation (``width=None``: the whole window is one bucket).

    PostgreSQL: one query, percentiles included; a series over every record of the window
    reads each bucket's records through the ``created_at`` index (:func:`_per_bucket`), one
    of a few tenants ``GROUP BY`` the bucket. SQLite: one query for the sums
    (``GROUP BY`` the bucket), one per latency for the percentiles
    (:func:`_window_percentiles`)."""
    native = session.get_bind().dialect.name == "postgresql"
    grp = _group_expr(group_by)
    rank = _ranking(filters, group_by)
    scoped = _scope(filters, grp, top if rank == "first" else None)
    measures: list[ColumnElement[Any]] = [
        (grp if grp is not None else _sql("0")).label("grp"),
        *(c.label(f"a{i}") for i, c in enumerate(_AGGREGATES)),
    ]
    if native:
        fractions = _sql(f"ARRAY[{', '.join(repr(p) for p in PERCENTILES)}]")
        for metric in (UsageRecord.ttft_ms, UsageRecord.tpot_ms):
            finished = case((UsageRecord.status == _sql("'ok'"), metric))
            measures.append(
                func.percentile_cont(fractions, type_=ARRAY(Float))
                .within_group(finished)
                .label(f"p_{metric.key}")
            )
    bucket: ColumnElement[Any] | None = None
    # Per bucket when every record of the window is aggregated; a few tenants' records
    # (the top ones, or one) are fewer rows to sort than a scan of the whole window.
    whole_window = rank != "first" and filters.tenant_id is None
    if native and width is not None and whole_window:
        query = _per_bucket(filters, width, grp, scoped, measures)
    else:
        if width is not None:
            bucket = _bucket_expr(native, width)
        start = bucket if bucket is not None else _sql(str(int(filters.since.timestamp())))
        keys = [k for k in (bucket, grp) if k is not None]  # constants are never grouped by
        query = scoped(select(start.label("bucket"), *measures)).group_by(*keys)
    if rank == "after":
        # few groups (tiers): aggregate them all in one pass, then keep the top ones (by
        # requests, then name; NULL last on both databases), matched NULL-safely
        agg = query.cte("agg")
        sums = select(agg.c.grp, func.sum(agg.c.a0).label("n")).group_by(agg.c.grp).subquery()
        order = (sums.c.n.desc(), sums.c.grp.is_(None), sums.c.grp)
        ranked = select(sums.c.grp, func.row_number().over(order_by=order).label("r")).subquery()
        best = select(ranked.c.grp).where(ranked.c.r <= top).subquery()
        query = select(agg).join(best, agg.c.grp.is_not_distinct_from(best.c.grp))
    ordered = query.subquery()
    query = select(ordered).order_by(ordered.c.bucket, ordered.c.grp.is_(None), ordered.c.grp)
    if native:
        # Local to this read-only transaction. The percentiles sort each bucket's latencies
        # (the totals a whole window's): with the default 4 MB they spill to disk. And JIT
        # compilation, which the per-bucket plan's cost estimate triggers, took ~300 ms of a
        # ~1 s query to save nothing (EXPLAIN ANALYZE in docs/results.md).
        session.execute(text(f"SET LOCAL work_mem = '{AGGREGATE_WORK_MEM}'"))
        session.execute(text("SET LOCAL jit = off"))
    rows = session.execute(query).all()
    n_agg = len(_AGGREGATES)
    pct: dict[str, dict[tuple[Any, Any], tuple[float | None, ...]]] = {}
    if native:
        for i, metric_name in enumerate(("ttft", "tpot")):
            at = 2 + n_agg + i
            pct[metric_name] = {
                (r[0], r[1]): _floats(r[at] or (None,) * len(PERCENTILES)) for r in rows
            }
    else:
        start = bucket if bucket is not None else _sql(str(int(filters.since.timestamp())))
        keys = [start.label("bucket"), measures[0]]
        pct["ttft"] = _window_percentiles(session, scoped, keys, UsageRecord.ttft_ms)
        pct["tpot"] = _window_percentiles(session, scoped, keys, UsageRecord.tpot_ms)
    names = _group_names(session, group_by, {r[1] for r in rows})
    none = (None,) * len(PERCENTILES)
    points = []
    for r in rows:
        key = (r[0], r[1])
        name, group_id = names(r[1])
        points.append(
            SeriesPoint(
                start=_bucket_start(r[0]),
                summary=_summary(name, group_id, r[2 : 2 + n_agg]),
                ttft_ms=pct["ttft"].get(key, none),
                tpot_ms=pct["tpot"].get(key, none),
            )
        )
    return points


def _per_bucket(
    filters: _Filters,
    width: int,
    grp: ColumnElement[Any] | None,
    scoped: Scope,
    measures: list[ColumnElement[Any]],
) -> Select[Any]:
    """PostgreSQL's series: for each bucket start (``generate_series``, epoch-aligned), a
    LATERAL aggregate of that bucket's records, found by a range scan of
    ``ix_usage_records_created``.

    One ``GROUP BY`` over the window would sort every record of it by bucket (a month: a
    million rows, on disk) before the percentiles sort each bucket again; per bucket, the
    sorts are a bucket's size and stay in memory, and the table is read in time order, the
    order it is written in. ``EXPLAIN ANALYZE`` and timings: ``bench/admin_scale.py``,
    ``docs/results.md``.
    """
    step = _sql(f"interval '{int(width)} seconds'")  # seconds: no time zone, no DST
    first = bindparam("first", _floor(filters.since, width), type_=DateTime(timezone=True))
    last = bindparam("last", filters.until, type_=DateTime(timezone=True))
    starts = func.generate_series(first, last, step).table_valued("start").render_derived("b")
    inner = scoped(select(*measures)).where(
        UsageRecord.created_at >= starts.c.start, UsageRecord.created_at < starts.c.start + step
    )
    # ungrouped, an aggregate answers one row even for an empty bucket: HAVING drops it
    empty = func.count(UsageRecord.id) > 0
    inner = inner.group_by(grp) if grp is not None else inner.having(empty)
    per = inner.lateral("a")
    return select(starts.c.start.label("bucket"), *per.c).select_from(starts.join(per, true()))


def _floats(values: Any) -> tuple[float | None, ...]:
    return tuple(None if v is None else float(v) for v in values)


Scope = Callable[[Select[Any]], Select[Any]]


def _ranking(filters: _Filters, group_by: str) -> str | None:
    """How the ``top`` groups are chosen (in SQL, by requests in the window): ``first`` —
    rank, then aggregate only the top groups' records (tenants: thousands of groups, most of
    them small); ``after`` — aggregate every group, then keep the top ones (tiers: a handful,
    so one scan beats a ranking scan plus an aggregation scan); None — nothing to rank
    (ungrouped, or filtered to one group)."""
    if group_by == "tenant" and filters.tenant_id is None:
        return "first"
    if group_by == "key":  # a tenant's keys, or every key: many small groups
        return "first"
    if group_by == "tier" and filters.tier is None:
        return "after"
    return None


def _scope(filters: _Filters, grp: ColumnElement[Any] | None, top: int | None) -> Scope:
    """A function that restricts a query on usage records to the window, the filters and,
    with ``top``, the ``top`` groups (ranked in SQL by their requests in the window)."""
    top_groups = None
    if top is not None and grp is not None:
        top_groups = (
            filters.apply(select(grp))
            .group_by(grp)
            .order_by(func.count().desc(), grp)
            .limit(top)
            .scalar_subquery()
        )

    def scoped(query: Select[Any]) -> Select[Any]:
        query = filters.apply(query.select_from(UsageRecord))
        if top_groups is not None:
            query = query.where(grp.in_(top_groups))  # type: ignore[union-attr]
        return query

    return scoped


def _window_percentiles(
    session: Session,
    scoped: Scope,
    keys: list[ColumnElement[Any]],
    metric: Any,
) -> dict[tuple[Any, Any], tuple[float | None, ...]]:
    """``percentile_cont`` per (bucket, group) from window functions (SQLite): rank ``rn``
    (0-based) and size ``n`` of each finished request's value, then for each p the values at
    ranks ``floor(p·(n−1))`` and the next, interpolated by the fraction."""
    values = (
        scoped(select(*keys, metric.label("v")))
        .where(UsageRecord.status == _sql("'ok'"), metric.is_not(None))
        .subquery()
    )
    part = (values.c.bucket, values.c.grp)
    ranked = select(
        values.c.bucket,
        values.c.grp,
        values.c.v,
        (func.row_number().over(partition_by=part, order_by=values.c.v) - 1).label("rn"),
        func.count().over(partition_by=part).label("n"),
    ).subquery()
    columns: list[ColumnElement[Any]] = []
    for p in PERCENTILES:
        position = (ranked.c.n - 1) * _sql(repr(p))
        low = cast(position, Integer)
        columns.append(func.max(case((ranked.c.rn == low, ranked.c.v))).label(f"lo{p}"))
        columns.append(func.max(case((ranked.c.rn == low + 1, ranked.c.v))).label(f"hi{p}"))
        columns.append(func.max(position - low).label(f"frac{p}"))
    picked = (
        select(ranked.c.bucket, ranked.c.grp, *columns)
        .group_by(ranked.c.bucket, ranked.c.grp)
        .subquery()
    )
    outputs = []
    for p in PERCENTILES:
        lo, hi, frac = picked.c[f"lo{p}"], picked.c[f"hi{p}"], picked.c[f"frac{p}"]
        outputs.append(lo + (func.coalesce(hi, lo) - lo) * frac)
    rows = session.execute(select(picked.c.bucket, picked.c.grp, *outputs)).all()
    return {(r[0], r[1]): _floats(r[2:]) for r in rows}


def _group_names(
    session: Session, group_by: str, keys: set[Any]
) -> Any:  # Callable[[Any], tuple[str | None, int | None]]
    """How a group key reads: a tenant's (name, id) — names looked up for the listed ids
    only —, a tier's (name, None), or (None, None) ungrouped or for deleted tenants."""
    if group_by == "tenant":
        ids = [k for k in keys if k]
        found = dict(
            session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(ids))).all()
        )
        return lambda k: (found.get(k), k or None) if k else (None, None)
    if group_by == "key":
        ids = [k for k in keys if k]
        prefixes = dict(
            session.execute(select(ApiKey.id, ApiKey.prefix).where(ApiKey.id.in_(ids))).all()
        )
        return lambda k: (display_prefix(prefixes[k]) if k in prefixes else None, k or None)
    if group_by == "tier":
        return lambda k: (k or None, None)
    return lambda k: (None, None)
