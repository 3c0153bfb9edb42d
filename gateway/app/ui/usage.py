"""``/ui/usage``: usage per tenant and per tier over time — requests, tokens, TDG ratio, SLO
attainment, rejections, TTFT/TPOT percentiles — as charts, a table and a CSV export.

Every number is the database's (:func:`gateway.db.crud.usage_series` and
:func:`~gateway.db.crud.usage_totals`, the same aggregation as ``/admin/v1/usage/series``);
this module only reads the filters and lays the answer out. The page renders the filters and
the table; ``usage.js`` fetches ``/ui/usage/series.json`` (the same filters) and draws it with
uPlot (vendored, ``admin_ui/static/vendor/uplot``); ``/ui/usage.csv`` is the series as CSV.

A window is a preset (last hour … last 90 days) or ``from``/``to`` (ISO 8601; without an offset
the time is UTC, as every time on the dashboard). Bad filters are shown beside their field,
status 400, never a 500 page. A tenant admin's filters always name its own tenant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.orm import Session

from gateway.app.admin.usage import csv_response
from gateway.app.ui.deps import Operator, OperatorDep, SessionDep, UiRoute
from gateway.app.ui.render import render
from gateway.app.usage_csv import series_csv
from gateway.db import crud
from gateway.db.crud.usage_series import (
    BUCKETS,
    DEFAULT_TOP,
    GROUPINGS,
    MAX_TOP,
    PERCENTILES,
    SeriesPlan,
    SeriesPoint,
    UsageSeries,
    plan_series,
    run_series,
    run_totals,
)
from gateway.db.errors import DomainError
from gateway.db.models import utcnow
from gateway.errors import bad_request, domain_error

router = APIRouter(route_class=UiRoute)

PRESETS: tuple[tuple[str, str, timedelta], ...] = (
    ("1h", "Last hour", timedelta(hours=1)),
    ("6h", "Last 6 hours", timedelta(hours=6)),
    ("24h", "Last 24 hours", timedelta(hours=24)),
    ("7d", "Last 7 days", timedelta(days=7)),
    ("30d", "Last 30 days", timedelta(days=30)),
    ("90d", "Last 90 days", timedelta(days=90)),
)
DEFAULT_PRESET = "24h"
DEFAULT_GROUP = "tier"
MAX_POINTS = 5_000
"""Most buckets a chart draws: a wider bucket is asked for beyond it (the API allows more)."""
GROUP_LABELS = {"none": "Everything", "tenant": "Tenant", "key": "API key", "tier": "Tier"}
_FIELDS = ("range", "from", "to", "tenant", "tier", "group_by", "bucket", "top")
_ALIASES = {"window": "range"}
"""Other names of a filter: ``window`` is what the page calls the range."""


@dataclass
class UsageFilters:
    """The page's filters as typed (to show them again) and as understood."""

    values: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)
    since: datetime | None = None
    until: datetime | None = None
    group_by: str = DEFAULT_GROUP
    bucket: str = "auto"
    top: int = DEFAULT_TOP
    status: int = 400
    """The answer's status when there are errors (404: a tenant that does not exist)."""

    @property
    def query(self) -> str:
        """The filters as a query string (for the chart data and CSV links)."""
        return urlencode({k: v for k, v in self.values.items() if v})

    def plan(self, session: Session) -> SeriesPlan:
        assert self.since is not None
        return plan_series(
            session,
            since=self.since,
            until=self.until,
            bucket=self.bucket,
            group_by=self.group_by,
            tenant=self.values.get("tenant") or None,
            tier=self.values.get("tier") or None,
            top=self.top,
        )


def _moment(text: str) -> datetime:
    """ISO 8601 (``2030-01-01T12:00``, a ``Z`` or an offset allowed); UTC when none."""
    moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def read_filters(request: Request) -> UsageFilters:
    """The query's filters, checked; problems go to ``errors`` by field name. ``window`` is
    another name of ``range``; any other parameter is refused, never ignored (a filter
    misspelt would otherwise show a different window than the one asked for)."""
    query = request.query_params
    values = {name: query.get(name, "").strip() for name in _FIELDS}
    found = UsageFilters(values)
    errors = found.errors
    for name in query:
        if name not in _FIELDS and name not in _ALIASES:
            errors[name] = f"unknown parameter {name!r}: the filters are {', '.join(_FIELDS)}"
    for alias, name in _ALIASES.items():
        if alias in query:
            if name in query:
                errors[alias] = f"give {name} or {alias} (the same filter), not both"
            values[name] = query[alias].strip()
    for name, value in values.items():
        if "\x00" in value:
            errors[name] = f"{name} must not contain a NUL character"
            values[name] = ""
    now = utcnow()
    if values["from"] or values["to"] or values["range"] == "custom":
        values["range"] = "custom"
        for name in ("from", "to"):
            if not values[name]:
                continue
            try:
                setattr(found, "since" if name == "from" else "until", _moment(values[name]))
            except ValueError:
                errors[name] = f"{name} must be a date and time such as 2030-01-31T18:00 (UTC)"
        if not values["from"]:
            errors.setdefault("from", "give the start of the window (from)")
        if found.until is None and "to" not in errors:
            found.until = now
        if (
            found.since is not None
            and found.until is not None
            and found.since >= found.until
            and not errors
        ):
            errors["from"] = "from must be before to"
    else:
        preset = values["range"] or DEFAULT_PRESET
        spans = {key: span for key, _, span in PRESETS}
        if preset not in spans:
            errors["range"] = f"range must be one of {', '.join(spans)}; got {preset!r}"
            preset = DEFAULT_PRESET
        values["range"] = preset
        found.since, found.until = now - spans[preset], now
    group_by = values["group_by"] or DEFAULT_GROUP
    if group_by not in GROUPINGS:
        errors["group_by"] = f"group by must be one of {', '.join(GROUPINGS)}; got {group_by!r}"
        group_by = DEFAULT_GROUP
    found.group_by = values["group_by"] = group_by
    bucket = values["bucket"] or "auto"
    if bucket != "auto" and bucket not in BUCKETS:
        errors["bucket"] = f"bucket must be one of auto, {', '.join(BUCKETS)}; got {bucket!r}"
        bucket = "auto"
    found.bucket = bucket
    if values["top"]:
        try:
            found.top = int(values["top"])
        except ValueError:
            found.top = 0
        if not 1 <= found.top <= MAX_TOP:
            errors["top"] = f"top must be a whole number from 1 to {MAX_TOP}"
            found.top = DEFAULT_TOP
    _scope(request, values)
    return found


def _scope(request: Request, values: dict[str, str]) -> None:
    """A tenant admin's filters name its own tenant, always: another tenant is 403 (never
    looked up), and no tenant means its own."""
    operator = getattr(request.state, "operator", None)
    if not isinstance(operator, Operator) or not operator.principal.tenant_bound:
        return
    who = operator.principal
    if values["tenant"] and not who.owns_ref(values["tenant"]):
        raise who.foreign()
    values["tenant"] = who.tenant_name or ""


def _plan(found: UsageFilters, session: Session) -> SeriesPlan | None:
    """The checked series request, or None with the refusal beside the field it names (the
    data layer's, or too many buckets to draw) — before any aggregation runs."""
    if found.errors:
        return None
    try:
        plan = found.plan(session)
    except DomainError as exc:
        error = domain_error(exc)
        found.errors[exc.param or "range"] = error.message
        found.status = error.status
        return None
    if plan.buckets > MAX_POINTS:
        found.errors["bucket"] = (
            f"{plan.buckets:,} {plan.bucket} buckets are too many to draw "
            f"(at most {MAX_POINTS:,}): choose a wider bucket or a shorter window"
        )
        return None
    return plan


@router.get("/usage")
def usage_page(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    """The filters, the charts' place (drawn by ``usage.js``) and the table of totals."""
    found = read_filters(request)
    plan = _plan(found, session)
    totals: list[SeriesPoint] = run_totals(session, plan) if plan is not None else []
    tiers = [t.name for t in crud.list_tiers(session)]
    return render(
        request,
        "usage.html",
        status_code=found.status if found.errors else 200,
        active="usage",
        title="Usage",
        filters=found,
        values=found.values,
        errors=found.errors,
        presets=[(key, label) for key, label, _ in PRESETS],
        groupings=[(g, GROUP_LABELS[g]) for g in GROUPINGS],
        buckets=[("auto", "Automatic"), *((b, b.capitalize()) for b in BUCKETS)],
        tier_options=[(t, t) for t in tiers],
        plan=plan,
        totals=totals,
        group_label=GROUP_LABELS[found.group_by],
    )


def _error_json(found: UsageFilters) -> JSONResponse:
    name, message = next(iter(found.errors.items()))
    error = bad_request(message, param=name)
    error.status = found.status
    return error.response()


@router.get("/usage/series.json")
def usage_series_json(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    """The charts' data: one x axis (every bucket's start, epoch seconds) and per chart one
    line per group (or per percentile, ungrouped latency), aligned on it."""
    found = read_filters(request)
    plan = _plan(found, session)
    if plan is None:
        return _error_json(found)
    return JSONResponse(chart_data(run_series(session, plan)))


@router.get("/usage.csv")
def usage_csv(request: Request, operator: OperatorDep, session: SessionDep) -> Response:
    """The series as CSV: one row per bucket and group (``gateway.app.usage_csv``)."""
    found = read_filters(request)
    plan = _plan(found, session)
    if plan is None:
        return _error_json(found)
    series = run_series(session, plan)
    stamp = f"{series.since:%Y%m%dT%H%M}-{series.until:%Y%m%dT%H%M}"
    return csv_response(series_csv(series.points), f"tiergate-usage-{stamp}.csv")


# ---- chart data ---------------------------------------------------------------------------


def _group_label(group_by: str, name: str | None) -> str:
    if group_by == "none":
        return "all"
    if name is None:
        return {"tenant": "deleted tenants", "key": "deleted keys"}.get(group_by, "no tier")
    return name


def chart_data(series: UsageSeries) -> dict[str, Any]:
    """Dense, aligned arrays for uPlot: counts are 0 in an empty bucket, ratios and
    percentiles null (nothing to divide, nothing finished)."""
    starts = series.bucket_starts()
    index = {start: i for i, start in enumerate(starts)}
    groups = series.groups
    by_group: dict[tuple[str | None, int | None], dict[int, SeriesPoint]] = {g: {} for g in groups}
    for point in series.points:
        key = (point.summary.group, point.summary.group_id)
        by_group.setdefault(key, {})[index[point.start]] = point

    def line(group: tuple[str | None, int | None], value: Any, empty: Any) -> list[Any]:
        points = by_group[group]
        return [value(points[i]) if i in points else empty for i in range(len(starts))]

    def per_group(value: Any, empty: Any) -> list[dict[str, Any]]:
        return [
            {"label": _group_label(series.group_by, g[0]), "data": line(g, value, empty)}
            for g in groups
        ]

    def latency(which: str) -> list[dict[str, Any]]:
        if series.group_by == "none" and groups:
            return [
                {
                    "label": f"p{round(p * 100)}",
                    "data": line(groups[0], lambda pt, i=i: getattr(pt, which)[i], None),
                }
                for i, p in enumerate(PERCENTILES)
            ]
        return per_group(lambda pt: getattr(pt, which)[1], None)  # p95 per group

    charts = [
        ("requests", "Requests", "requests", per_group(lambda p: p.summary.requests, 0)),
        (
            "tokens",
            "Tokens (finished requests)",
            "tokens",
            per_group(lambda p: p.summary.total_tokens, 0),
        ),
        ("spend", "Spend", "cost", per_group(lambda p: float(p.summary.cost), 0)),
        ("tdg", "TDG ratio", "ratio", per_group(lambda p: p.summary.tdg_ratio, None)),
        ("slo", "SLO attainment", "ratio", per_group(lambda p: p.summary.slo_attainment, None)),
        ("rejections", "Rejections", "requests", per_group(lambda p: p.summary.rejected, 0)),
        (
            "ttft",
            "TTFT (ms)" + (", p95" if series.group_by != "none" else ""),
            "ms",
            latency("ttft_ms"),
        ),
        (
            "tpot",
            "TPOT (ms)" + (", p95" if series.group_by != "none" else ""),
            "ms",
            latency("tpot_ms"),
        ),
    ]
    return {
        "since": series.since.isoformat(),
        "until": series.until.isoformat(),
        "bucket": series.bucket,
        "bucket_seconds": series.bucket_s,
        "group_by": series.group_by,
        "x": [int(start.timestamp()) for start in starts],
        "requests": sum(p.summary.requests for p in series.points),
        "charts": [
            {"id": key, "title": title, "unit": unit, "series": lines}
            for key, title, unit, lines in charts
        ],
    }
