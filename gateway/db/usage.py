"""Batched, off-request-path writing of usage records that no database outage loses.

The request path only appends to an in-memory queue (:meth:`UsageWriter.submit` never blocks
and never touches the database). One background thread drains the queue and bulk-inserts in
batches of ``batch_size`` or whatever arrived within ``flush_interval_s``, so the database sees
a few multi-row INSERTs per second instead of one transaction per request.

One bad record must not cost the others theirs. A record is made storable when it is created
(:class:`UsageEvent`: its text has no NUL or lone surrogate and fits its column), and a batch the
database refuses for a value in it (a data or integrity error) is written in halves, down to
single rows, so every good record is written and only the refused ones are dropped, counted and
logged without their content.

A batch refused for the database's state (unreachable, restarting, busy, a missing table) is
never dropped: the writer keeps it and retries with capped exponential backoff, while new
records keep arriving in memory, up to ``buffer_records``; past that they spill to an on-disk
spool (:mod:`gateway.db.spool`, bounded by ``spool_max_bytes``; only past both bounds is a record
dropped, counted and logged). When the database answers again the memory buffer is written,
then the spool replayed and deleted; the spool is also replayed at start-up. ``close()`` writes
what the database takes and spools the rest. Every INSERT is ``ON CONFLICT (request_id) DO
NOTHING``, so a batch retried after a commit whose acknowledgement was lost, or a spool
replayed twice, never stores a request twice. An error no classification recognises is
retried ``max_retries`` times, then treated as a refused value (halved), so that one poisonous
record cannot hold every later one back forever.

A record may carry its request's explanation (:class:`~gateway.db.request_log.RequestExplain`):
once its batch has committed, the writer stores the request-log rows in a transaction of their
own (a failure there drops them, counted, and never touches a usage record), keeps them beside
the records while the database is away, but never spools them; every
``trim_interval_s`` it trims the log to ``request_log_days`` and ``request_log_rows``.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal

from sqlalchemy import Insert, String, insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.errors import DatabaseFailure, classify, describe
from gateway.db.models import USAGE_STATUSES, UsageRecord, utcnow
from gateway.db.prices import PriceBook
from gateway.db.request_log import RequestExplain, log_row, trim
from gateway.db.request_log import insert_statement as log_insert_statement
from gateway.db.spool import UsageSpool

log = logging.getLogger(__name__)

MAX_TOKENS = 2**31 - 1
"""The token columns are 32-bit INTEGERs on PostgreSQL: a larger count would fail its batch."""

_TABLE = UsageRecord.metadata.tables[UsageRecord.__tablename__]

TEXT_LIMITS: Final = {
    column.name: column.type.length
    for column in _TABLE.columns
    if isinstance(column.type, String) and column.type.length is not None
}
"""Characters per text column (VARCHAR(n): PostgreSQL refuses a longer value, and its batch)."""
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""What no text column takes: NUL (PostgreSQL refuses it) and a lone surrogate (no UTF-8 encoder
takes it; in a ``str`` every surrogate is a lone one, a pair being one astral character)."""


def storable_text(text: str, limit: int) -> str:
    """``text`` as a text column of ``limit`` characters takes it: each NUL or lone surrogate
    replaced with U+FFFD (replaced, not removed, so ``"a\\x00b"`` never reads as a real
    ``"ab"`` in a report), then cut to ``limit``."""
    return _UNSTORABLE.sub("\ufffd", text)[:limit]


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """One request's outcome, as the gateway reports it (see :class:`UsageRecord`)."""

    request_id: str
    status: str
    tenant_id: int | None = None
    api_key_id: int | None = None
    tier: str | None = None
    model: str | None = None
    backend: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    gain: float = 0.0
    ideal_gain: float = 0.0
    slo_met: bool = False
    reject_reason: str | None = None
    created_at: datetime = field(default_factory=utcnow)
    cost: Decimal | None = None
    """What the request cost; None: the writer charges it at its model's price when it writes
    the record (:class:`~gateway.db.prices.PriceBook`)."""
    explain: RequestExplain | None = None
    """What the request log adds (:mod:`gateway.db.request_log`); None: no log row."""

    def __post_init__(self) -> None:
        if self.status not in USAGE_STATUSES:
            raise ValueError(f"status must be one of {USAGE_STATUSES}, got {self.status!r}")
        if self.created_at.tzinfo is None:
            raise ValueError("created_at must be timezone-aware")
        # one infinite or negative value would poison every report summing over it, for the
        # whole retention window: refuse it here rather than let it reach the table
        for name in ("gain", "ideal_gain"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("prompt_tokens", "completion_tokens"):
            value = getattr(self, name)
            if not 0 <= value <= MAX_TOKENS:
                raise ValueError(f"{name} must be within [0, {MAX_TOKENS}], got {value!r}")
        if self.cost is not None and not (self.cost.is_finite() and self.cost >= 0):
            raise ValueError(f"cost must be a finite amount >= 0, got {self.cost!r}")
        self._make_text_storable()

    def _make_text_storable(self) -> None:
        """Replace what no text column stores and cut to the column's length: the model name
        is the client's (``/v1`` records even a request refused for it), and one record the
        database refuses would cost its whole batch a retry cycle."""
        for name, limit in TEXT_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, str):
                storable = storable_text(value, limit)
                if storable != value:
                    object.__setattr__(self, name, storable)  # frozen: still being built


YIELD_EVERY_ROWS = 25
"""Rows per INSERT before the writer yields the GIL. Binding rows is Python work that holds the
GIL (~30 µs a row); an event loop that wakes up meanwhile waits for it until the interpreter's
switch interval (5 ms) forces a hand-over. Yielding every ~0.75 ms of work bounds that wait;
all chunks of a batch still go in one transaction."""

DEFAULT_BUFFER_RECORDS = 100_000
"""Records kept in memory while the database cannot take them (~0.4 KB each) before spilling."""
DEFAULT_SPOOL_MAX_BYTES = 1 << 30
"""On-disk spool bound (~3 million records of ~350 bytes)."""
MAX_BACKOFF_S = 2.0
"""Longest wait between two attempts while the database fails: also the longest a returning
database waits for the writer to notice it."""
SPOOL_RESCAN_S = 30.0
"""How often an idle writer looks for segments another (crashed) process left behind."""

# dataclasses.asdict deep-copies recursively: ~20x slower than reading the flat fields.
_EVENT_FIELDS = tuple(f.name for f in fields(UsageEvent) if f.name != "explain")
LOG_KEY = "_log"
"""A usage row's explanation, carried beside its columns until the row is stored (never
spooled: the log is an explanation, the usage record the thing kept through outages)."""
DEFAULT_TRIM_INTERVAL_S = 300.0
"""How often the writer trims the request log (its own thread, never the request path)."""

Row = dict[str, Any]
Failure = Literal["value", "state", "unknown"]


def _row(event: UsageEvent) -> Row:
    row = {name: getattr(event, name) for name in _EVENT_FIELDS}
    if event.explain is not None:
        row[LOG_KEY] = event.explain
    return row


def _columns(row: Row) -> Row:
    """``row`` without its explanation: the usage table's columns only."""
    if LOG_KEY not in row:
        return row
    return {k: v for k, v in row.items() if k != LOG_KEY}


def insert_statement(dialect: str) -> Insert:
    """The usage INSERT for ``dialect``: ``ON CONFLICT (request_id) DO NOTHING`` where the
    dialect has it (PostgreSQL, SQLite), so storing a record twice stores it once. A Core
    INSERT (executemany): no ORM bookkeeping per row."""
    if dialect == "postgresql":
        return postgresql.insert(_TABLE).on_conflict_do_nothing(index_elements=["request_id"])
    if dialect == "sqlite":
        return sqlite.insert(_TABLE).on_conflict_do_nothing(index_elements=["request_id"])
    return insert(_TABLE)  # a second copy is then an IntegrityError: isolated and dropped


class _Flush:
    """A marker in the queue: everything submitted before it is written when ``done`` is set."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class _DatabaseDown(Exception):
    """Internal: a write failed for the database's state; what it had is kept for a retry."""


_STOP = object()
_WAKE = object()
"""A marker in the queue: a batch's worth of events is pending (:meth:`UsageWriter.submit`)."""


class UsageWriter:
    """Queue usage events and bulk-insert them from a background thread; lose none to outages.

    ``close()`` writes everything submitted before it, or spools what the database will not
    take. A batch the database refuses for a value in it is written in halves down to single
    rows: only the rows refused on their own are dropped. One refused for the database's state
    is kept and retried, every ``retry_backoff_s`` doubling up to ``max_backoff_s``; meanwhile
    records buffer in memory (``buffer_records``), then in the spool under ``spool_dir``
    (``spool_max_bytes``; None: no spool). Dropped rows are counted in ``dropped`` and logged
    (never their content). ``clock`` is injectable for tests (monotonic seconds).

    Each record without a ``cost`` is charged when it is written, at its model's price in
    ``prices`` (read from the database every few seconds, in this thread), and ``on_priced``
    is told each charge (tier, cost): the spend counter.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        batch_size: int = 500,
        flush_interval_s: float = 0.5,
        max_retries: int = 3,
        retry_backoff_s: float = 0.2,
        max_backoff_s: float = MAX_BACKOFF_S,
        buffer_records: int = DEFAULT_BUFFER_RECORDS,
        spool_dir: Path | None = None,
        spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
        prices: PriceBook | None = None,
        on_priced: Callable[[str | None, Decimal], None] | None = None,
        request_log_days: float | None = None,
        request_log_rows: int | None = None,
        trim_interval_s: float = DEFAULT_TRIM_INTERVAL_S,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be > 0")
        if buffer_records < 1:
            raise ValueError("buffer_records must be >= 1")
        self._factory = session_factory
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._max_retries = max_retries
        self._min_backoff = retry_backoff_s
        self._max_backoff = max(max_backoff_s, retry_backoff_s)
        self._buffer_records = buffer_records
        self._clock = clock
        self.prices = prices if prices is not None else PriceBook(session_factory)
        self.on_priced = on_priced
        self._spool = UsageSpool(spool_dir, spool_max_bytes) if spool_dir is not None else None
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders submit() against close(): nothing lands after STOP
        self._closed = False
        # submitted events, taken by the writer when it wakes: a submit does not wake it (a
        # thread wake-up and GIL hand-off per request cost the event loop more than the rest
        # of accounting), except when a batch is full; the writer takes them at least every
        # ``flush_interval_s`` and counts their age from the first one's submit time
        self._pending: list[UsageEvent] = []
        self._pending_since = 0.0
        self._wake_sent = False
        # the writer thread's own state
        self._backlog: collections.deque[UsageEvent] = collections.deque()
        self._retry: list[Row] = []  # a batch a state failure interrupted, retried first
        self._retry_recount = False
        self._oldest = 0.0  # when the oldest buffered event arrived in an empty buffer
        self._flushes: list[_Flush] = []
        self._stopping = False
        self._spool_pending = self._spool is not None and self._spool.has_segments()
        self._next_scan = clock() + SPOOL_RESCAN_S
        self._next_attempt = 0.0
        self._backoff = retry_backoff_s
        self._failing_since: float | None = None
        self._unknown_streak = 0
        self._last_error: Exception | None = None
        self._last_failure: Failure = "state"
        self._insert_for: dict[str, Insert] = {}
        self._log_insert_for: dict[str, Insert] = {}
        self.request_log_days = request_log_days
        self.request_log_rows = request_log_rows
        self._trim_interval = trim_interval_s
        self._next_trim = clock() + min(trim_interval_s, 10.0)  # soon after start, then regularly
        self._log_written = 0
        self._log_dropped = 0
        self._trimmed = 0
        # counters (read by other threads; each written by one thread only)
        self._submitted = 0
        self._written = 0
        self._duplicates = 0
        self._dropped = 0
        self._spilled = 0
        self._replayed = 0
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
        self._thread.start()

    # -- what it has done (for tests, metrics and readiness) ------------------------------

    @property
    def submitted(self) -> int:
        return self._submitted

    @property
    def written(self) -> int:
        """Records this writer inserted (a record found already stored is a duplicate)."""
        return self._written

    @property
    def duplicates(self) -> int:
        """Records found already stored: a retried batch whose commit had gone through, or a
        spool segment replayed again. Not written twice: counted here instead."""
        return self._duplicates

    @property
    def dropped(self) -> int:
        """Records given up on: refused on their own, or past both the memory and disk bounds."""
        return self._dropped

    @property
    def buffered(self) -> int:
        """Records in memory not written yet (queued, buffered, or in a batch to retry)."""
        return len(self._pending) + len(self._backlog) + len(self._retry)

    @property
    def spooled(self) -> int:
        """Records this writer spooled to disk that are not replayed yet."""
        return self._spool.pending_records if self._spool is not None else 0

    @property
    def spool_bytes(self) -> int:
        """Bytes in the spool directory (every process's segments), now."""
        return self._spool.current_bytes() if self._spool is not None else 0

    @property
    def spilled(self) -> int:
        """Records spilled to the spool so far (total)."""
        return self._spilled

    @property
    def replayed(self) -> int:
        """Records read back from the spool and stored (or found stored) so far (total)."""
        return self._replayed

    @property
    def log_written(self) -> int:
        """Request-log rows stored so far (total)."""
        return self._log_written

    @property
    def log_dropped(self) -> int:
        """Request-log rows given up on (the database refused them, or they were spooled)."""
        return self._log_dropped

    @property
    def trimmed(self) -> int:
        """Request-log rows trimmed (by age or count) so far (total)."""
        return self._trimmed

    @property
    def failing(self) -> bool:
        """Whether the last attempt failed for the database's state (records are kept)."""
        return self._failing_since is not None

    @property
    def failures(self) -> int:
        """Write attempts failed for the database's state so far (total)."""
        return self._failures

    # -- the request path's side ----------------------------------------------------------

    def submit(self, event: UsageEvent) -> None:
        """Queue ``event`` for writing; O(1), never blocks on the database."""
        with self._lock:
            if self._closed:
                raise RuntimeError("UsageWriter is closed")
            self._submitted += 1
            pending = self._pending
            if not pending:
                self._pending_since = self._clock()
            pending.append(event)
            if not self._wake_sent and len(pending) + len(self._backlog) >= self._batch_size:
                self._wake_sent = True
                self._queue.put(_WAKE)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything submitted before this call is in the database (or dropped).

        While the database is down this waits for it to return (or ``timeout``: False).
        """
        marker = _Flush()
        with self._lock:
            if self._closed:
                return not self._thread.is_alive()
            self._queue.put(marker)
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting events; write the queued ones, spooling what the database does not
        take (one attempt: a shutdown does not wait for a database to return). Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._thread.join(timeout)

    def __enter__(self) -> UsageWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the background thread: the loop ---------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                self._take(self._wait_s())
                if self._stopping:
                    self._shutdown()
                    return
                if self._due():
                    self._cycle()
                self._settle()
                self._trim_if_due()
            except Exception:  # a bug here must not stop usage from being written
                log.exception("usage writer loop failed; continuing")
                self._fail_later()

    def _wait_s(self) -> float:
        """How long to wait for the next event before there is work to do."""
        now = self._clock()
        if self._stopping:
            return 0.0
        if self._failing_since is not None:
            return max(0.0, self._next_attempt - now)
        if self._retry or self._flushes or self._spool_pending:
            return 0.0
        if self._backlog:
            if len(self._backlog) >= self._batch_size:
                return 0.0
            return max(0.0, self._oldest + self._interval - now)
        if self._pending:  # unlocked: a submit racing this read waits at most one interval
            return max(0.0, self._pending_since + self._interval - now)
        return self._interval

    def _take(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for a queued marker, then take it, all others queued and the
        pending events."""
        try:
            item = self._queue.get(timeout=wait_s) if wait_s > 0 else self._queue.get_nowait()
        except queue.Empty:
            pass
        else:
            self._accept(item)
        self._drain()

    def _drain(self) -> None:
        """Take everything queued and submitted now, without waiting."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            self._accept(item)
        with self._lock:
            events, self._pending = self._pending, []
            since, self._wake_sent = self._pending_since, False
        for event in events:
            if not self._backlog:
                self._oldest = since
            self._backlog.append(event)
            if len(self._backlog) + len(self._retry) > self._buffer_records:
                self._spill_newest()

    def _accept(self, item: object) -> None:
        if isinstance(item, _Flush):
            self._flushes.append(item)
        elif item is _STOP:
            self._stopping = True

    def _due(self) -> bool:
        now = self._clock()
        if self._failing_since is not None and now < self._next_attempt:
            return False
        if self._spool is not None and now >= self._next_scan:  # segments a crash left
            self._next_scan = now + SPOOL_RESCAN_S
            self._spool_pending = self._spool_pending or self._spool.has_segments()
        if self._retry or self._spool_pending:
            return True
        if self._backlog:
            return (
                bool(self._flushes)
                or len(self._backlog) >= self._batch_size
                or now >= self._oldest + self._interval
            )
        return False

    def _settle(self) -> None:
        """Release the flush markers once nothing submitted is left outside the database."""
        if self._flushes and not (self._backlog or self._retry or self._spool_pending):
            for marker in self._flushes:
                marker.done.set()
            self._flushes.clear()

    # -- the request log ---------------------------------------------------------------------

    def _trim_if_due(self) -> None:
        """Trim the request log every ``trim_interval_s`` (not while the database fails)."""
        if self.request_log_days is None and self.request_log_rows is None:
            return
        now = self._clock()
        if now < self._next_trim or self._failing_since is not None:
            return
        self._next_trim = now + self._trim_interval
        self.trim_request_log()

    def trim_request_log(self) -> int:
        """Trim the request log to its bounds now; returns the rows deleted (0 on a failure,
        logged without its values)."""
        try:
            deleted = trim(
                self._factory, days=self.request_log_days, max_rows=self.request_log_rows
            )
        except Exception as exc:
            log.warning("could not trim the request log: %s", _describe(exc))
            return 0
        self._trimmed += deleted
        return deleted

    def _write_log(self, rows: list[Row]) -> None:
        """Store the explanations of usage rows just committed, in a transaction of their own:
        a failure costs the log rows (counted, logged), never a usage record."""
        logged = [log_row(r, r[LOG_KEY]) for r in rows if r.get(LOG_KEY) is not None]
        if not logged:
            return
        try:
            with self._factory.begin() as session:
                dialect = session.get_bind().dialect.name
                statement = self._log_insert_for.get(dialect)
                if statement is None:
                    statement = self._log_insert_for.setdefault(
                        dialect, log_insert_statement(dialect)
                    )
                for start in range(0, len(logged), YIELD_EVERY_ROWS):
                    session.execute(statement, logged[start : start + YIELD_EVERY_ROWS])
                    time.sleep(0)  # hand the GIL back to the event loop (YIELD_EVERY_ROWS)
        except Exception as exc:
            self._log_dropped += len(logged)
            log.warning(
                "dropping %d request-log row(s): %s (their usage records are stored)",
                len(logged),
                _describe(exc),
            )
            return
        self._log_written += len(logged)

    # -- writing ----------------------------------------------------------------------------

    def _cycle(self) -> None:
        try:
            self._write_buffered()
            if self._spool_pending:
                self._replay()
        except _DatabaseDown:
            self._on_failure()
        else:
            self._on_success()

    def _write_buffered(self) -> None:
        """Write the batch to retry, then the backlog as it stands, a batch at a time; events
        arriving meanwhile wait for the next cycle (so they still batch). Raises
        :class:`_DatabaseDown` with the unwritten rows kept in ``_retry``."""
        if self._retry:
            rows, self._retry = self._retry, []
            self._commit(rows, recount=self._retry_recount)
        remaining = len(self._backlog)
        while remaining > 0 and self._backlog:
            take = min(self._batch_size, remaining, len(self._backlog))
            remaining -= take
            rows = [_row(self._backlog.popleft()) for _ in range(take)]
            self._commit(rows, recount=False)
            self._drain()
        if self._backlog:
            self._oldest = self._clock()

    def _commit(self, rows: list[Row], *, recount: bool) -> None:
        left = self._store(rows, recount=recount)
        if left:
            self._retry, self._retry_recount = left, True  # its commit may have gone through
            raise _DatabaseDown

    def _store(self, rows: list[Row], *, recount: bool) -> list[Row]:
        """Insert ``rows`` in one transaction, isolating refused values (and, after
        ``max_retries`` failures, unrecognised errors); returns the rows a state failure left
        unwritten (empty when all are written or dropped)."""
        self._price(rows)
        try:
            inserted = self._insert(rows, recount=recount)
        except Exception as exc:  # the DB is down or refuses: never kill the thread
            kind = _failure_kind(exc)
            isolate = kind == "value" or (
                kind == "unknown" and self._unknown_streak >= self._max_retries
            )
            if isolate:
                return self._isolate(rows, exc, recount=recount)
            self._last_error, self._last_failure = exc, kind
            return rows
        self._written += inserted
        self._duplicates += len(rows) - inserted
        self._write_log(rows)
        return []

    def _price(self, rows: list[Row]) -> None:
        """Charge each row that has no cost yet at its model's price now (a row whose model
        has no price stays NULL; one written while the prices could not be read yet is charged
        when it is retried)."""
        book = self.prices
        book.refresh_if_stale()
        for row in rows:
            if row.setdefault("cost", None) is not None or not book.loaded:
                continue  # (a row spooled before costs existed has no "cost" at all)
            cost = book.cost(row.get("model"), row["prompt_tokens"], row["completion_tokens"])
            if cost is None:
                continue
            row["cost"] = cost
            if self.on_priced is not None and cost > 0:
                try:
                    self.on_priced(row.get("tier"), cost)
                except Exception:  # a metric must never cost a record
                    log.exception("spend hook failed")

    def _isolate(self, rows: list[Row], exc: Exception, *, recount: bool) -> list[Row]:
        """Write ``rows``, which the database refused for a value in one of them, in halves:
        each half is a batch of its own (isolated further), so a bad row costs O(log n)
        transactions and only itself; a single row refused is dropped."""
        if len(rows) == 1:
            orphan = _orphaned(rows[0]) if isinstance(exc, IntegrityError) else None
            if orphan is not None:
                return self._store([orphan], recount=recount)
            self._drop(1, "refused on its own", exc)
            return []
        middle = len(rows) // 2
        left = self._store(rows[:middle], recount=recount)
        if left:
            return left + rows[middle:]
        return self._store(rows[middle:], recount=recount)

    def _insert(self, rows: list[Row], *, recount: bool) -> int:
        """Insert in one transaction; returns how many rows were new. Only a batch that may
        have been stored before (``recount``) pays for counting on PostgreSQL (RETURNING);
        SQLite's row count is free."""
        inserted = 0
        with self._factory.begin() as session:
            dialect = session.get_bind().dialect.name
            statement = self._insert_for.get(dialect)
            if statement is None:
                statement = self._insert_for.setdefault(dialect, insert_statement(dialect))
            counted = statement.returning(_TABLE.c.id) if recount and dialect != "sqlite" else None
            for start in range(0, len(rows), YIELD_EVERY_ROWS):
                chunk = [_columns(r) for r in rows[start : start + YIELD_EVERY_ROWS]]
                if counted is not None:
                    inserted += len(session.execute(counted, chunk).all())
                else:
                    result = session.execute(statement, chunk)
                    inserted += result.rowcount if dialect == "sqlite" else len(chunk)  # type: ignore[attr-defined]
                time.sleep(0)  # hand the GIL back to the event loop (YIELD_EVERY_ROWS)
        return inserted

    # -- the spool --------------------------------------------------------------------------

    def _spill_newest(self) -> None:
        """Move the newest buffered events (a batch) to the spool: memory stays bounded."""
        count = min(len(self._backlog), max(1, self._batch_size))
        events = [self._backlog.pop() for _ in range(count)]
        events.reverse()
        self._spill([_row(e) for e in events], "the memory buffer is full")

    def _spill(self, rows: list[Row], why: str) -> None:
        if not rows:
            return
        explained = sum(1 for r in rows if LOG_KEY in r)
        if explained:  # the spool keeps usage records; their explanations are let go
            self._log_dropped += explained
            rows = [_columns(r) for r in rows]
        taken = 0
        if self._spool is not None:
            try:
                taken = self._spool.append(rows)
            except OSError as exc:
                log.error("could not write the usage spool: %s", type(exc).__name__)
        if taken:
            self._spilled += taken
            self._spool_pending = True
        if taken < len(rows):
            self._drop(len(rows) - taken, f"({why}, and the spool cannot take them)", None)

    def _replay(self) -> None:
        """Store every segment of the spool no other process holds, then delete it. Raises
        :class:`_DatabaseDown` (the segment stays) when the database fails meanwhile."""
        assert self._spool is not None
        self._spool.rotate()
        started = self._replayed
        for segment in self._spool.claim():
            try:
                for rows in segment.batches(self._batch_size):
                    left = self._store(rows, recount=True)
                    if left:
                        raise _DatabaseDown
                    self._replayed += len(rows)
                    self._drain()
                if segment.torn:
                    self._drop(segment.torn, "in the spool, torn by a crash mid-write", None)
                segment.remove()
                self._spool.forget(segment)
            finally:
                segment.release()
        self._spool_pending = False
        if self._replayed > started:
            log.warning("replayed %d usage record(s) from the spool", self._replayed - started)

    # -- outcomes ---------------------------------------------------------------------------

    def _on_failure(self) -> None:
        now = self._clock()
        self._failures += 1
        self._unknown_streak = self._unknown_streak + 1 if self._last_failure == "unknown" else 0
        if self._failing_since is None:
            self._failing_since = now
            self._backoff = self._min_backoff
            log.error(
                "usage records cannot be written (%s): keeping them (%d in memory) and retrying",
                _describe(self._last_error),
                self.buffered,
            )
        self._next_attempt = now + self._backoff
        self._backoff = min(self._backoff * 2, self._max_backoff)

    def _fail_later(self) -> None:
        self._failing_since = self._failing_since or self._clock()
        self._next_attempt = self._clock() + self._max_backoff

    def _on_success(self) -> None:
        self._unknown_streak = 0
        if self._failing_since is not None:
            log.warning(
                "usage records are written again after %.1f s of failures",
                self._clock() - self._failing_since,
            )
            self._failing_since = None

    def _shutdown(self) -> None:
        """Write what is buffered (one attempt); spool what the database does not take."""
        self._drain()
        try:
            self._write_buffered()
        except _DatabaseDown:
            rows, self._retry = self._retry, []
            rows += [_row(e) for e in self._backlog]
            self._backlog.clear()
            self._spill(rows, "the database is unavailable at shutdown")
            log.error(
                "usage writer closed with the database unavailable (%s): %d record(s) spooled "
                "for replay at the next start",
                _describe(self._last_error),
                len(rows),
            )
        if self._spool is not None:
            self._spool.close()
        self._spool_pending = False
        for marker in self._flushes:
            marker.done.set()
        self._flushes.clear()

    def _drop(self, count: int, why: str, exc: Exception | None) -> None:
        """Count and log ``count`` records given up on: the error's kind, never its text (it
        names the values)."""
        self._dropped += count
        cause = f": {_describe(exc)}" if exc is not None else ""
        log.error("dropping %d usage record(s) %s%s", count, why, cause)


def _orphaned(row: Row) -> Row | None:
    """``row`` as ``ON DELETE SET NULL`` would have left it had it been written before its key
    (then its tenant) was deleted, or None when there is nothing left to clear.

    A record buffered while its tenant or key is deleted is refused by the foreign key; its
    tokens were still served, so it is kept with the deleted tenants' records rather than
    lost. Clearing only the key first keeps the tenant when only the key went away; a record
    refused for any other reason is refused again once both are clear, and dropped.
    """
    if row.get("api_key_id") is not None:
        return {**row, "api_key_id": None}
    if row.get("tenant_id") is not None:
        return {**row, "tenant_id": None}
    return None


def _failure_kind(exc: Exception) -> Failure:
    """``value`` if ``exc`` refuses a value of the rows (:func:`_refuses_a_value`), ``state``
    if it is the database's state (:func:`classify`: unavailable, busy, schema, a lost race),
    ``unknown`` otherwise."""
    if _refuses_a_value(exc):
        return "value"
    if isinstance(exc, SQLAlchemyError) and classify(exc) is not DatabaseFailure.INTERNAL:
        return "state"
    return "unknown"


def _refuses_a_value(exc: Exception) -> bool:
    """Whether ``exc`` refuses a value of the rows rather than the database's state: a data or
    integrity error (:func:`classify`'s ``invalid``, e.g. a NUL or a string too long, or a
    foreign key gone), or a value the driver could not bind (a ``ValueError`` such as
    ``UnicodeEncodeError``). Retrying the same rows would fail the same way; a split of them
    writes the good ones. Anything else (busy, unreachable, a missing table) is the state's."""
    if isinstance(exc, SQLAlchemyError):
        by_value = isinstance(exc, DataError | IntegrityError)
        return by_value or classify(exc) is DatabaseFailure.INVALID
    return isinstance(exc, ValueError | TypeError | OverflowError)


def _describe(exc: Exception | None) -> str:
    if exc is None:
        return "unknown error"
    return describe(exc) if isinstance(exc, SQLAlchemyError) else type(exc).__name__
