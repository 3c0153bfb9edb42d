"""The admin dashboard and API at scale: list pages and usage charts on a big PostgreSQL.

    python bench/admin_scale.py [--tenants 10000] [--keys 50000] [--usage 1000000] [--days 30]
        [--requests 1000000] [--only TEXT] [--repeats 7] [--explain] [--json]
        [--server-url postgresql+psycopg://…/postgres]

A scratch database (``tiergate_bench_<random>``) is created on the server, migrated to head
(so the indexes are the migrations' own), loaded, and dropped at the end whatever happens:

* 4 tiers and 3 backends through the crud layer; ``--tenants`` tenants, ``--keys`` API keys
  (spread over the tenants, created over ``--days``), one audit row per tenant and key, and
  ``--usage`` usage records over the last ``--days`` days (tenants Zipf-skewed, outcomes and
  latencies drawn like a busy fleet's), and ``--requests`` request-log rows over the last
  ``min(--days, 7)`` days (the log's default retention; the same skew, each stage's numbers,
  a miss reason on the misses) — all with ``COPY``, then ``VACUUM (ANALYZE)``.

Then the real app (``create_app``, in process through ``TestClient``: routing, auth, the crud
layer, templates, JSON) is asked for every list route's first page and a deep page (the last
one), the usage series over the whole window (JSON: ungrouped, by tier, by tenant) and the CSV
export — through the admin API (admin key) and the dashboard (signed in with the admin key).
Each is timed ``--repeats`` times after one warm-up; the table gives p50/p95 (ms) and the
target (< 300 ms a list page, < 1 s a 30-day chart). Every answer is checked too (status,
page sizes, totals, the series' request count against the rows loaded): ``checks`` in the
report, all true or the run exits 1. ``--explain`` prints ``EXPLAIN (ANALYZE, BUFFERS)`` of
the slowest SQL statement of each route over its target (or of every route with
``--explain-all``). ``--only`` times the cases whose name holds the text (``requests``: the
request log's pages).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.db import crud, migrate  # noqa: E402
from gateway.db.session import make_engine, make_session_factory  # noqa: E402
from priority.profiles import available_profiles  # noqa: E402

DEFAULT_SERVER_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ADMIN_KEY = "bench-admin-key-" + "k" * 24
LIST_TARGET_MS = 300.0
CHART_TARGET_MS = 1000.0
PAGE = 50
TIERS = (("premium", 4.0, 300.0, 30.0), ("standard", 2.0, 800.0, 60.0))
TIERS += (("batch", 1.0, 5000.0, 200.0), ("free", 0.5, 10000.0, 400.0))
OUTCOMES = (("ok", 0.85), ("rejected", 0.08), ("error", 0.03), ("cancelled", 0.04))
REASONS = ("rpm_limit", "tpm_limit", "queue_full", "slo_unattainable")


@dataclass(frozen=True)
class Scale:
    tenants: int = 10_000
    keys: int = 50_000
    usage: int = 1_000_000
    days: float = 30.0
    seed: int = 7
    requests: int | None = None
    """Request-log rows (None: as many as usage records)."""


@dataclass
class Loaded:
    """What was put in the database, for the checks."""

    end: datetime
    tenants: int
    keys: int
    usage: int
    audit: int
    usage_by_tier: dict[str, int]
    last_tenant: str
    load_s: float = 0.0
    requests: int = 0
    first_tenant: str = ""
    deep_cursor: int = 0


# ---- the scratch database -------------------------------------------------------------------


@contextlib.contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A new database on the server for this run, dropped afterwards (even on failure)."""
    name = f"tiergate_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _copy(
    engine: Engine, table: str, columns: tuple[str, ...], rows: Iterator[tuple[Any, ...]]
) -> None:
    """``COPY table (columns) FROM STDIN`` through psycopg, one transaction."""
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
        with cursor.copy(statement) as copy:  # type: ignore[attr-defined]
            for row in rows:
                copy.write_row(row)
        raw.commit()
    finally:
        raw.close()


def load(url: str, scale: Scale) -> Loaded:
    """Migrate, then fill the database (see the module docstring)."""
    started = time.perf_counter()
    n_requests = scale.usage if scale.requests is None else scale.requests
    migrate.upgrade(url)
    engine = make_engine(url)
    rng = random.Random(scale.seed)
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    # one hour short of the window: a "last N days" chart asked minutes later still sees all
    span_s = scale.days * 86400 - 3600
    try:
        factory = make_session_factory(engine)
        with factory.begin() as s:
            for name, weight, ttft, tpot in TIERS:
                crud.create_tier(
                    s, actor="bench", name=name, weight=weight, ttft_ms=ttft, tpot_ms=tpot
                )
            for i in range(3):
                crud.create_backend(
                    s,
                    actor="bench",
                    name=f"engine-{i}",
                    base_url=f"http://127.0.0.1:9/{i}",  # the discard port: probes fail fast
                    model="qwen2-7b",
                    profile=available_profiles()[0],
                    enabled=False,  # the bench times the dashboard, not routing
                )
        with engine.connect() as conn:
            tier_ids = dict(conn.execute(text("SELECT name, id FROM tiers")).all())
        tier_names = [t[0] for t in TIERS]
        width = len(str(scale.tenants))

        def tenant_name(i: int) -> str:
            return f"tenant-{i:0{width}d}"

        def moment() -> datetime:
            return end - timedelta(seconds=rng.random() * span_s)

        _copy(
            engine,
            "tenants",
            ("name", "tier_id", "status", "created_at", "updated_at"),
            (
                (tenant_name(i), tier_ids[tier_names[i % 4]], "active", end, end)
                for i in range(scale.tenants)
            ),
        )
        with engine.connect() as conn:
            tenant_ids = [r[0] for r in conn.execute(text("SELECT id FROM tenants ORDER BY name"))]
        _copy(
            engine,
            "api_keys",
            ("tenant_id", "name", "prefix", "key_hash", "secret_id", "created_at"),
            (
                (
                    tenant_ids[k % scale.tenants],
                    f"key {k}",
                    f"{k:08x}",
                    f"{uuid.UUID(int=rng.getrandbits(128)).hex}{k:032x}",
                    "0" * 16,
                    moment(),
                )
                for k in range(scale.keys)
            ),
        )
        with engine.connect() as conn:
            key_ids = [r[0] for r in conn.execute(text("SELECT id FROM api_keys ORDER BY prefix"))]
        audit = scale.tenants + scale.keys
        _copy(
            engine,
            "audit_log",
            ("actor", "action", "entity_type", "entity_id", "before", "after", "at"),
            (
                (
                    "admin-api:10.0.0.7",
                    "create",
                    "tenant" if i < scale.tenants else "api_key",
                    str(i + 1),
                    None,
                    json.dumps({"name": f"row {i}"}),
                    moment(),
                )
                for i in range(audit)
            ),
        )
        by_tier = dict.fromkeys(tier_names, 0)
        _copy(
            engine,
            "usage_records",
            USAGE_COLUMNS,
            _usage_rows(scale, rng, end, span_s, tenant_ids, key_ids, by_tier),
        )
        log_span_s = min(span_s, 7 * 86400 - 3600)
        _copy(
            engine,
            "request_log",
            REQUEST_LOG_COLUMNS,
            _request_rows(scale, rng, end, log_span_s, tenant_ids, key_ids),
        )
        # as autovacuum leaves a table in service (statistics, visibility map), and so that
        # it does not start on the fresh rows in the middle of the timings
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM (ANALYZE)"))
    finally:
        engine.dispose()
    return Loaded(
        end=end,
        tenants=scale.tenants,
        keys=scale.keys,
        usage=scale.usage,
        audit=audit,
        usage_by_tier=by_tier,
        last_tenant=tenant_name(scale.tenants - 1),
        load_s=time.perf_counter() - started,
        requests=n_requests,
        first_tenant=tenant_name(0),
        deep_cursor=max(2, n_requests // 2),
    )


REQUEST_LOG_COLUMNS = (
    "request_id",
    "created_at",
    "tenant_id",
    "api_key_id",
    "tier",
    "model",
    "backend",
    "status",
    "http_status",
    "reject_reason",
    "admission",
    "admission_ttft_ms",
    "predicted_ttft_ms",
    "queue_ms",
    "engine_ttft_ms",
    "ttft_ms",
    "tpot_ms",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "attempts",
    "gain",
    "ideal_gain",
    "slo_met",
    "miss_reason",
)
MISSES = (("queued", 3), ("engine_slow", 3), ("stalled", 2), ("failover", 1), ("unknown", 1))


def _request_rows(
    scale: Scale,
    rng: random.Random,
    end: datetime,
    span_s: float,
    tenant_ids: list[int],
    key_ids: list[int],
) -> Iterator[tuple[Any, ...]]:
    """Request-log rows, oldest first as the writer appends them: the usage records' tenant
    skew and outcomes, each stage's numbers, a reason on each miss (and on shed requests)."""
    n = scale.usage if scale.requests is None else scale.requests
    ages = sorted((rng.random() * span_s for _ in range(n)), reverse=True)
    weights = [1.0 / (rank + 1) ** 0.9 for rank in range(scale.tenants)]
    tenants = rng.choices(range(scale.tenants), weights=weights, k=n)
    statuses = rng.choices([o for o, _ in OUTCOMES], weights=[w for _, w in OUTCOMES], k=n)
    reasons = [m for m, _ in MISSES]
    reason_weights = [w for _, w in MISSES]
    keys_per_tenant = max(1, scale.keys // scale.tenants)
    for i in range(n):
        t = tenants[i]
        tier, _, ttft_slo, tpot_slo = TIERS[t % 4]
        status = statuses[i]
        key = key_ids[(t + scale.tenants * rng.randrange(keys_per_tenant)) % len(key_ids)]
        at = end - timedelta(seconds=ages[i])
        predicted = rng.lognormvariate(math.log(ttft_slo * 0.3), 0.5)
        if status == "rejected":
            reject = rng.choice(REASONS)
            why = "hopeless" if reject == "slo_unattainable" else None
            stage: tuple[Any, ...] = (503, reject, "shed" if why else None, predicted * 3)
            measured: tuple[Any, ...] = (None, None, None, None, None, 0, 0.0, 0.0, None, why)
        else:
            queue = rng.lognormvariate(math.log(ttft_slo * 0.1), 1.0)
            engine = predicted * rng.lognormvariate(0.0, 0.4)
            ttft, tpot = queue + engine, rng.lognormvariate(math.log(tpot_slo * 0.5), 0.4)
            met = None if status != "ok" else ttft < ttft_slo and tpot < tpot_slo
            why = rng.choices(reasons, weights=reason_weights)[0] if met is False else None
            ideal = rng.randint(1, 800) * 1.0
            gain = ideal if met else ideal * rng.random()
            stage = (200 if status == "ok" else 503, None, "admit", predicted + queue)
            measured = (predicted, queue, engine, ttft, tpot, 1, gain, ideal, met, why)
        http, reject, admission, admission_ttft = stage
        pred, queue_ms, engine_ms, ttft_ms, tpot_ms, attempts, gain, ideal, met, why = measured
        yield (
            f"chatcmpl-bench-{i}",
            at,
            tenant_ids[t],
            key,
            tier,
            "qwen2-7b",
            f"engine-{i % 3}",
            status,
            http,
            reject,
            admission,
            admission_ttft,
            pred,
            queue_ms,
            engine_ms,
            ttft_ms,
            tpot_ms,
            ttft_slo,
            tpot_slo,
            attempts,
            gain,
            ideal,
            met,
            why,
        )


USAGE_COLUMNS = (
    "request_id",
    "tenant_id",
    "api_key_id",
    "tier",
    "model",
    "backend",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "tpot_ms",
    "gain",
    "ideal_gain",
    "slo_met",
    "status",
    "reject_reason",
    "created_at",
)


def _usage_rows(
    scale: Scale,
    rng: random.Random,
    end: datetime,
    span_s: float,
    tenant_ids: list[int],
    key_ids: list[int],
    by_tier: dict[str, int],
) -> Iterator[tuple[Any, ...]]:
    """Usage records: Zipf-skewed tenants (a few big, a long tail), the tier of the tenant,
    one of its keys, outcomes and log-normal latencies — oldest first, as the usage writer
    appends them (the table's physical order follows time, as in production)."""
    ages = sorted((rng.random() * span_s for _ in range(scale.usage)), reverse=True)
    weights = [1.0 / (rank + 1) ** 0.9 for rank in range(scale.tenants)]
    tenants = rng.choices(range(scale.tenants), weights=weights, k=scale.usage)
    statuses = rng.choices(
        [o for o, _ in OUTCOMES], weights=[w for _, w in OUTCOMES], k=scale.usage
    )
    keys_per_tenant = max(1, scale.keys // scale.tenants)
    for i in range(scale.usage):
        t = tenants[i]
        tier, _, ttft_slo, tpot_slo = TIERS[t % 4]
        by_tier[tier] += 1
        status = statuses[i]
        key = key_ids[(t + scale.tenants * rng.randrange(keys_per_tenant)) % len(key_ids)]
        at = end - timedelta(seconds=ages[i])
        if status == "rejected":
            row = (0, 0, None, None, 0.0, 0.0, False, rng.choice(REASONS))
        else:
            ttft = rng.lognormvariate(math.log(ttft_slo * 0.5), 0.6)
            tpot = rng.lognormvariate(math.log(tpot_slo * 0.5), 0.4)
            completion = rng.randint(1, 800) if status != "error" else rng.randint(0, 50)
            ideal = completion * 1.0
            gain = ideal * (1.0 if ttft < ttft_slo and tpot < tpot_slo else rng.random())
            met = status == "ok" and ttft < ttft_slo and tpot < tpot_slo
            row = (rng.randint(10, 2000), completion, ttft, tpot, gain, ideal, met, None)
        prompt, completion, ttft, tpot, gain, ideal, met, reason = row
        yield (
            f"bench-{i}",
            tenant_ids[t],
            key,
            tier,
            "qwen2-7b",
            f"engine-{i % 3}",
            prompt,
            completion,
            ttft,
            tpot,
            gain,
            ideal,
            met,
            status,
            reason,
            at,
        )


# ---- timing through the app -----------------------------------------------------------------


class StatementLog:
    """The SQL statements (with parameters and durations) run while it records: for EXPLAIN."""

    def __init__(self) -> None:
        self.recording = False
        self.statements: list[tuple[float, str, Any]] = []
        self._local = threading.local()

    def install(self) -> None:
        event.listen(Engine, "before_cursor_execute", self._before)
        event.listen(Engine, "after_cursor_execute", self._after)

    def remove(self) -> None:
        event.remove(Engine, "before_cursor_execute", self._before)
        event.remove(Engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        self._local.started = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if self.recording:
            elapsed = time.perf_counter() - getattr(self._local, "started", time.perf_counter())
            self.statements.append((elapsed, statement, params))


@dataclass
class Timing:
    name: str
    path: str
    target_ms: float
    samples_ms: list[float] = field(default_factory=list)
    status: int = 0
    check: bool = False
    note: str = ""
    explain: str | None = None

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p95(self) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]

    @property
    def ok(self) -> bool:
        return self.p95 < self.target_ms

    def row(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "status": self.status,
            "p50_ms": round(self.p50, 1),
            "p95_ms": round(self.p95, 1),
            "target_ms": self.target_ms,
            "within_target": self.ok,
            "check": self.check,
            "note": self.note,
        }


Check = Callable[[Any], tuple[bool, str]]


def _json_rows(expect_rows: int, total: int | None = None) -> Check:
    def check(response: Any) -> tuple[bool, str]:
        rows = len(response.json()["data"])
        header = response.headers.get("x-total-count")
        good = rows == expect_rows and (total is None or header == str(total))
        return good, f"{rows} rows, total {header}"

    return check


def _html_total(total: int, needle: str | None = None) -> Check:
    def check(response: Any) -> tuple[bool, str]:
        body = response.text
        shown = f"of {total:,}" in body
        found = needle is None or needle in body
        return shown and found, f"'of {total:,}' {'shown' if shown else 'missing'}"

    return check


def _series_requests(expected: int, key: str = "requests") -> Check:
    def check(response: Any) -> tuple[bool, str]:
        body = response.json()
        got = body[key] if key in body else sum(p["requests"] for p in body["data"])
        return got == expected, f"{got:,} requests of {expected:,}"

    return check


def _csv_rows(expected_requests: int) -> Check:
    def check(response: Any) -> tuple[bool, str]:
        lines = response.text.strip().splitlines()
        header = lines[0].split(",")
        at = header.index("requests")
        got = sum(int(line.split(",")[at]) for line in lines[1:])
        return got == expected_requests, f"{len(lines) - 1} CSV rows, {got:,} requests"

    return check


def _tier_requests(by_tier: dict[str, int]) -> Check:
    def check(response: Any) -> tuple[bool, str]:
        totals: dict[str, int] = {}
        for point in response.json()["data"]:
            totals[point["group"]] = totals.get(point["group"], 0) + point["requests"]
        return totals == by_tier, f"per tier {totals}"

    return check


def cases(loaded: Loaded, days: float) -> list[tuple[str, str, dict[str, Any], float, Check]]:
    """(name, path, params, target ms, check) of every timed request."""
    n_t, n_k, n_a = loaded.tenants, loaded.keys, loaded.audit
    deep = {"tenants": max(0, n_t - PAGE), "keys": max(0, n_k - PAGE), "audit": max(0, n_a - PAGE)}
    since = (loaded.end - timedelta(days=days)).isoformat()
    until = (loaded.end + timedelta(minutes=1)).isoformat()
    window = {"since": since, "until": until}
    preset = "30d" if days == 30 else None
    ui_window = {"range": preset} if preset else {"from": since, "to": until}
    lst, chart = LIST_TARGET_MS, CHART_TARGET_MS
    return [
        ("API tiers", "/admin/v1/tiers", {"limit": PAGE}, lst, _json_rows(4, 4)),
        (
            "API tenants, page 1",
            "/admin/v1/tenants",
            {"limit": PAGE},
            lst,
            _json_rows(min(PAGE, n_t), n_t),
        ),
        (
            "API tenants, last page",
            "/admin/v1/tenants",
            {"limit": PAGE, "offset": deep["tenants"]},
            lst,
            _json_rows(min(PAGE, n_t), n_t),
        ),
        (
            "API keys, page 1",
            "/admin/v1/keys",
            {"limit": PAGE},
            lst,
            _json_rows(min(PAGE, n_k), n_k),
        ),
        (
            "API keys, last page",
            "/admin/v1/keys",
            {"limit": PAGE, "offset": deep["keys"]},
            lst,
            _json_rows(min(PAGE, n_k), n_k),
        ),
        (
            "API audit, page 1",
            "/admin/v1/audit",
            {"limit": PAGE},
            lst,
            _json_rows(min(PAGE, n_a), n_a),
        ),
        (
            "API audit, last page",
            "/admin/v1/audit",
            {"limit": PAGE, "offset": deep["audit"]},
            lst,
            _json_rows(min(PAGE, n_a), n_a),
        ),
        ("API backends", "/admin/v1/backends", {"limit": PAGE}, lst, _json_rows(3, 3)),
        ("UI tiers", "/ui/tiers", {}, lst, _html_total(4)),
        ("UI tenants, page 1", "/ui/tenants", {}, lst, _html_total(n_t)),
        (
            "UI tenants, last page",
            "/ui/tenants",
            {"offset": deep["tenants"]},
            lst,
            _html_total(n_t, loaded.last_tenant),
        ),
        (
            "UI tenants, name search",
            "/ui/tenants",
            {"q": "99"},
            lst,
            lambda r: (r.status_code == 200, "search"),
        ),
        ("UI keys, page 1", "/ui/keys", {}, lst, _html_total(n_k)),
        ("UI keys, last page", "/ui/keys", {"offset": deep["keys"]}, lst, _html_total(n_k)),
        ("UI audit, page 1", "/ui/audit", {}, lst, _html_total(n_a)),
        ("UI audit, last page", "/ui/audit", {"offset": deep["audit"]}, lst, _html_total(n_a)),
        (
            "UI backends",
            "/ui/backends",
            {},
            lst,
            lambda r: ("engine-0" in r.text, "engine-0 listed"),
        ),
        (
            f"API series {days:g} d, all",
            "/admin/v1/usage/series",
            {**window},
            chart,
            _series_requests(loaded.usage),
        ),
        (
            f"API series {days:g} d, by tier",
            "/admin/v1/usage/series",
            {**window, "group_by": "tier"},
            chart,
            _tier_requests(loaded.usage_by_tier),
        ),
        (
            f"API series {days:g} d, top 10 tenants",
            "/admin/v1/usage/series",
            {**window, "group_by": "tenant"},
            chart,
            lambda r: (
                len(r.json()["groups"]) == min(10, n_t),
                f"{len(r.json()['groups'])} groups",
            ),
        ),
        (
            f"UI chart data {days:g} d, all",
            "/ui/usage/series.json",
            {**ui_window, "group_by": "none"},
            chart,
            _series_requests(loaded.usage),
        ),
        (
            f"UI chart data {days:g} d, by tier",
            "/ui/usage/series.json",
            {**ui_window, "group_by": "tier"},
            chart,
            _series_requests(loaded.usage),
        ),
        (
            f"UI usage page {days:g} d (totals table)",
            "/ui/usage",
            {**ui_window, "group_by": "tier"},
            chart,
            lambda r: ('id="usage-table"' in r.text, "table shown"),
        ),
        (
            f"API series CSV {days:g} d",
            "/admin/v1/usage/series",
            {**window, "format": "csv"},
            chart,
            _csv_rows(loaded.usage),
        ),
        (
            f"UI CSV export {days:g} d",
            "/ui/usage.csv",
            {**ui_window, "group_by": "none"},
            chart,
            _csv_rows(loaded.usage),
        ),
        *request_cases(loaded),
    ]


def _page_of(rows: int) -> Check:
    def check(response: Any) -> tuple[bool, str]:
        data = response.json()["data"]
        return len(data) == rows, f"{len(data)} rows"

    return check


def request_cases(loaded: Loaded) -> list[tuple[str, str, dict[str, Any], float, Check]]:
    """The request log's pages: everyone's, the biggest and the smallest tenant's, the misses,
    one reason, a page deep in the log, the last hour, and the dashboard's page."""
    if not loaded.requests:
        return []
    lst, big, small = LIST_TARGET_MS, loaded.first_tenant, loaded.last_tenant
    hour = (loaded.end - timedelta(hours=1)).isoformat()
    full = _page_of(min(PAGE, loaded.requests))
    any_rows: Check = lambda r: (r.status_code == 200, f"{len(r.json()['data'])} rows")  # noqa: E731
    html: Check = lambda r: ('id="requests-table"' in r.text, "table shown")  # noqa: E731
    api = "/admin/v1/requests"
    return [
        ("API requests, page 1", api, {"limit": PAGE}, lst, full),
        ("API requests, deep page", api, {"limit": PAGE, "before": loaded.deep_cursor}, lst, full),
        ("API requests, biggest tenant", api, {"limit": PAGE, "tenant": big}, lst, any_rows),
        ("API requests, smallest tenant", api, {"limit": PAGE, "tenant": small}, lst, any_rows),
        ("API requests, missed only", api, {"limit": PAGE, "missed": "true"}, lst, any_rows),
        (
            "API requests, a tenant's misses",
            api,
            {"limit": PAGE, "tenant": big, "missed": "true"},
            lst,
            any_rows,
        ),
        ("API requests, reason stalled", api, {"limit": PAGE, "reason": "stalled"}, lst, any_rows),
        ("API requests, last hour", api, {"limit": PAGE, "since": hour}, lst, any_rows),
        ("UI requests page", "/ui/requests", {}, lst, html),
        (
            "UI requests, a tenant's misses",
            "/ui/requests",
            {"tenant": big, "missed": "1"},
            lst,
            html,
        ),
    ]


def _explain(url: str, statements: list[tuple[float, str, Any]]) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the slowest recorded statement, with its parameters and
    after the ``SET LOCAL`` settings the request made before it (``work_mem``, ``jit``)."""
    slowest = max(range(len(statements)), key=lambda i: statements[i][0])
    elapsed, statement, params = statements[slowest]
    settings = [s for _, s, _ in statements[:slowest] if s.upper().startswith("SET LOCAL")]
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for setting in settings:
                conn.exec_driver_sql(setting)
            plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, params).all()
    finally:
        engine.dispose()
    lines = "\n".join(r[0] for r in plan)
    return f"-- slowest statement ({elapsed * 1000:.1f} ms in the request):\n{statement}\n{lines}"


def time_app(
    url: str, loaded: Loaded, scale: Scale, repeats: int, explain: str, only: str = ""
) -> list[Timing]:
    """Time every case through the real app; see the module docstring."""
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from gateway.app import create_app
    from gateway.settings import Settings

    log = StatementLog()
    log.install()
    results = []
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            database_url=url,
            secret=SecretStr("bench-secret-" + "s" * 32),
            admin_key=SecretStr(ADMIN_KEY),
            data_dir=Path(data_dir),
            redis_url=None,
        )
        try:
            with TestClient(create_app(settings), follow_redirects=False) as client:
                signed = client.post("/ui/login", data={"credential": ADMIN_KEY, "next": "/ui/"})
                if signed.status_code != 303:
                    raise RuntimeError(f"sign-in failed: {signed.status_code} {signed.text[:200]}")
                api = {"authorization": f"Bearer {ADMIN_KEY}"}
                # the crud-made tiers and backends and this sign-in are audited too
                counter = create_engine(url)
                with counter.connect() as conn:
                    loaded.audit = conn.execute(text("SELECT count(*) FROM audit_log")).scalar_one()
                counter.dispose()
                for name, path, params, target, check in cases(loaded, scale.days):
                    if only and only not in name:
                        continue
                    timing = Timing(name, path, target)
                    headers = api if path.startswith("/admin/") else {}
                    first = client.get(path, params=params, headers=headers)  # warm-up
                    timing.status = first.status_code
                    if first.status_code == 200:
                        timing.check, timing.note = check(first)
                    else:
                        timing.note = first.text[:160]
                    for _ in range(repeats):
                        log.statements = []
                        log.recording = True
                        started = time.perf_counter()
                        client.get(path, params=params, headers=headers)
                        timing.samples_ms.append((time.perf_counter() - started) * 1000)
                        log.recording = False
                    if log.statements and (
                        explain == "all" or (explain == "slow" and not timing.ok)
                    ):
                        timing.explain = _explain(url, log.statements)
                    results.append(timing)
        finally:
            log.remove()
    return results


# ---- report ---------------------------------------------------------------------------------


def table(results: list[Timing]) -> str:
    lines = [
        "| request | p50 ms | p95 ms | target | within | answer checked |",
        "| --- | ---: | ---: | ---: | :---: | --- |",
    ]
    for t in results:
        lines.append(
            f"| {t.name} | {t.p50:.1f} | {t.p95:.1f} | < {t.target_ms:.0f} ms | "
            f"{'yes' if t.ok else 'NO'} | {'ok' if t.check else 'FAILED'}: {t.note} |"
        )
    return "\n".join(lines)


def run(
    server_url: str, scale: Scale, repeats: int, explain: str, only: str = ""
) -> dict[str, Any]:
    with scratch_database(server_url) as url:
        loaded = load(url, scale)
        results = time_app(url, loaded, scale, repeats, explain, only)
    return {
        "scale": scale.__dict__,
        "loaded": {
            "tenants": loaded.tenants,
            "keys": loaded.keys,
            "usage": loaded.usage,
            "requests": loaded.requests,
            "audit": loaded.audit,
            "usage_by_tier": loaded.usage_by_tier,
            "load_s": round(loaded.load_s, 1),
        },
        "repeats": repeats,
        "results": [t.row() for t in results],
        "explain": {t.name: t.explain for t in results if t.explain},
        "all_checks": all(t.check for t in results),
        "all_within_target": all(t.ok for t in results),
        "_table": table(results),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Scale()
    parser.add_argument("--tenants", type=int, default=defaults.tenants)
    parser.add_argument("--keys", type=int, default=defaults.keys)
    parser.add_argument("--usage", type=int, default=defaults.usage)
    parser.add_argument("--days", type=float, default=defaults.days)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--requests", type=int, default=None, help="request-log rows (default: --usage)"
    )
    parser.add_argument("--only", default="", help="time only the cases whose name holds this")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--explain", action="store_true", help="EXPLAIN the routes over target")
    parser.add_argument("--explain-all", action="store_true", help="EXPLAIN every route")
    parser.add_argument(
        "--server-url",
        default=os.environ.get("TIERGATE_TEST_POSTGRES_URL", DEFAULT_SERVER_URL),
        help="a PostgreSQL server (any database on it): the scratch database is created there",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if min(args.tenants, args.keys, args.usage) < 1 or args.days <= 0 or args.repeats < 1:
        parser.error("counts, days and repeats must be positive")
    if args.requests is not None and args.requests < 0:
        parser.error("--requests must be >= 0")
    scale = Scale(args.tenants, args.keys, args.usage, args.days, args.seed, args.requests)
    explain = "all" if args.explain_all else "slow" if args.explain else "none"
    report = run(args.server_url, scale, args.repeats, explain, args.only)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if not k.startswith("_")}, indent=2))
    else:
        loaded = report["loaded"]
        print(
            f"loaded {loaded['tenants']:,} tenants, {loaded['keys']:,} keys, "
            f"{loaded['audit']:,} audit rows, {loaded['usage']:,} usage records, "
            f"{loaded['requests']:,} request-log rows over {scale.days:g} days "
            f"in {loaded['load_s']:.1f} s; {args.repeats} repeats each\n"
        )
        print(report["_table"])
        for name, plan in report["explain"].items():
            print(f"\n### {name}\n{plan}")
    return 0 if report["all_checks"] else 1


if __name__ == "__main__":
    sys.exit(main())
