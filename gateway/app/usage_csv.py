"""Usage series as CSV: one row per bucket and group, the admin API's and the dashboard's
export (``/admin/v1/usage/series?format=csv``, ``/ui/usage.csv``).

Plain numbers (no thousands separators, ``.`` decimals; ``cost`` exact, fixed-point), empty
cells for "none" (a ratio with nothing to divide, a percentile with no finished request),
times in ISO 8601 UTC. A cell that a spreadsheet would read as a formula (``=``, ``+``, ``-``,
``@`` first) is quoted with ``'``: tier and tenant names cannot start so today, but the file
must stay inert whatever a name becomes.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable

from gateway.db.crud.usage_series import PERCENTILES, SeriesPoint
from gateway.db.money import plain

MEDIA_TYPE = "text/csv; charset=utf-8"


def _pct_name(p: float) -> str:
    return f"p{round(p * 100):d}"


COLUMNS: tuple[str, ...] = (
    "start",
    "group",
    "group_id",
    "requests",
    "ok",
    "errors",
    "rejected",
    "cancelled",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cancelled_tokens",
    "failed_tokens",
    "slo_met",
    "slo_attainment",
    "gain",
    "ideal_gain",
    "tdg_ratio",
    "cost",
    *(f"ttft_{_pct_name(p)}_ms" for p in PERCENTILES),
    *(f"tpot_{_pct_name(p)}_ms" for p in PERCENTILES),
)

_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def point_values(point: SeriesPoint) -> list[object]:
    """A point's values in :data:`COLUMNS` order (None: no value)."""
    s = point.summary
    return [
        point.start.isoformat().replace("+00:00", "Z"),
        s.group,
        s.group_id,
        s.requests,
        s.ok,
        s.errors,
        s.rejected,
        s.cancelled,
        s.prompt_tokens,
        s.completion_tokens,
        s.total_tokens,
        s.cancelled_tokens,
        s.failed_tokens,
        s.slo_met,
        s.slo_attainment,
        s.gain,
        s.ideal_gain,
        s.tdg_ratio,
        plain(s.cost),
        *point.ttft_ms,
        *point.tpot_ms,
    ]


def series_csv(points: Iterable[SeriesPoint]) -> str:
    """The CSV text: a header row, then one row per point."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    for point in points:
        writer.writerow([_cell(v) for v in point_values(point)])
    return out.getvalue()
