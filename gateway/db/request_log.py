"""The request log's rows: what each stage knew about a request, written beside its usage
record by :class:`~gateway.db.usage.UsageWriter` and trimmed by age and count.

A separate table, not columns on ``usage_records``: usage records are billing and are never
trimmed, while the log is an explanation kept for days (``TIERGATE_REQUEST_LOG_DAYS``) and a
number of rows (``TIERGATE_REQUEST_LOG_ROWS``). The request path only builds one
:class:`RequestExplain` from numbers the job already holds; the row is assembled, stored and
trimmed in the writer's thread. Its INSERT runs after its usage batch has committed, in a
transaction of its own: a log the database refuses (or a schema without the table) costs the
log rows, counted, never a usage record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Insert, delete, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.models import RequestLog, utcnow

log = logging.getLogger(__name__)

TABLE = RequestLog.metadata.tables[RequestLog.__tablename__]

SHARED = (
    "request_id",
    "tenant_id",
    "api_key_id",
    "tier",
    "model",
    "backend",
    "status",
    "reject_reason",
    "ttft_ms",
    "tpot_ms",
    "gain",
    "ideal_gain",
)
"""The usage record's columns the log row repeats."""

TRIM_BATCH = 10_000
"""Rows deleted per statement while trimming: short transactions, no long lock on the table."""


@dataclass(frozen=True, slots=True)
class RequestExplain:
    """What the usage record does not say about a request: built once, when it ends, from
    fields the job holds (milliseconds; None where the stage was not reached)."""

    arrival_unix: float
    http_status: int
    slo_met: bool | None
    miss_reason: str | None = None
    admission: str | None = None
    admission_ttft_ms: float | None = None
    predicted_ttft_ms: float | None = None
    queue_ms: float | None = None
    engine_ttft_ms: float | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    attempts: int = 0


def log_row(usage: dict[str, Any], explain: RequestExplain) -> dict[str, Any]:
    """The log row of a usage row and its explanation (in the writer's thread)."""
    row = {name: usage.get(name) for name in SHARED}
    try:
        arrived = datetime.fromtimestamp(explain.arrival_unix, UTC)
    except (OverflowError, OSError, ValueError):
        arrived = usage.get("created_at") or utcnow()
    row.update(
        created_at=arrived,
        http_status=explain.http_status,
        slo_met=explain.slo_met,
        miss_reason=explain.miss_reason,
        admission=explain.admission,
        admission_ttft_ms=_finite(explain.admission_ttft_ms),
        predicted_ttft_ms=_finite(explain.predicted_ttft_ms),
        queue_ms=_finite(explain.queue_ms),
        engine_ttft_ms=_finite(explain.engine_ttft_ms),
        slo_ttft_ms=_finite(explain.slo_ttft_ms),
        slo_tpot_ms=_finite(explain.slo_tpot_ms),
        attempts=explain.attempts,
    )
    return row


def _finite(value: float | None) -> float | None:
    """PostgreSQL stores infinity; JSON answers cannot carry it: an unbounded estimate is None."""
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return value


def insert_statement(dialect: str) -> Insert:
    """``ON CONFLICT (request_id) DO NOTHING`` where the dialect has it: a batch retried after
    a lost acknowledgement stores each request once."""
    if dialect == "postgresql":
        return postgresql.insert(TABLE).on_conflict_do_nothing(index_elements=["request_id"])
    if dialect == "sqlite":
        return sqlite.insert(TABLE).on_conflict_do_nothing(index_elements=["request_id"])
    return insert(TABLE)


def trim(
    factory: sessionmaker[Session],
    *,
    days: float | None,
    max_rows: int | None,
    now: datetime | None = None,
) -> int:
    """Delete rows older than ``days`` and, past ``max_rows``, the oldest; returns how many.

    Deleted in batches of :data:`TRIM_BATCH` (each its own transaction), so a first trim of a
    large backlog never holds one long lock. None: no bound of that kind.
    """
    deleted = 0
    if days is not None:
        cutoff = (now or utcnow()) - timedelta(days=days)
        deleted += _delete_batches(factory, RequestLog.created_at < cutoff)
    if max_rows is not None:
        with factory() as session:  # the id of the oldest row to keep
            keep_from = session.scalar(
                select(RequestLog.id).order_by(RequestLog.id.desc()).offset(max_rows).limit(1)
            )
        if keep_from is not None:
            deleted += _delete_batches(factory, RequestLog.id <= keep_from)
    return deleted


def _delete_batches(factory: sessionmaker[Session], condition: ColumnElement[bool]) -> int:
    """Delete the rows matching ``condition``, :data:`TRIM_BATCH` per transaction."""
    deleted = 0
    while True:
        with factory.begin() as session:
            batch = select(RequestLog.id).where(condition).limit(TRIM_BATCH).scalar_subquery()
            result = session.execute(delete(RequestLog).where(RequestLog.id.in_(batch)))
            count = int(getattr(result, "rowcount", 0) or 0)
        deleted += count
        if count < TRIM_BATCH:
            return deleted
