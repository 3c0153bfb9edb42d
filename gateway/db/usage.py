"""Batched, off-request-path writing of usage records.

The request path only appends to an in-memory queue (:meth:`UsageWriter.submit` never blocks
and never touches the database). One background thread drains the queue and bulk-inserts in
batches of ``batch_size`` or whatever arrived within ``flush_interval_s``, so the database sees
a few multi-row INSERTs per second instead of one transaction per request.

One bad record must not cost the others theirs. A record is made storable when it is created
(:class:`UsageEvent`: its text has no NUL or lone surrogate and fits its column), and a batch the
database refuses for a value in it (a data or integrity error) is written in halves, down to
single rows, so every good record is written and only the refused ones are dropped, counted and
logged without their content. A batch refused for the database's state (busy, unreachable, a
missing table) is retried whole, then dropped.
"""

from __future__ import annotations

import logging
import math
import queue
import re
import threading
import time
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final

from sqlalchemy import String, insert
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.errors import DatabaseFailure, classify, describe
from gateway.db.models import USAGE_STATUSES, UsageRecord, utcnow

log = logging.getLogger(__name__)

MAX_TOKENS = 2**31 - 1
"""The token columns are 32-bit INTEGERs on PostgreSQL: a larger count would fail its batch."""

_TABLE = UsageRecord.metadata.tables[UsageRecord.__tablename__]
# A Core INSERT (executemany / insertmanyvalues): no ORM bookkeeping per row.
_INSERT = insert(_TABLE)

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

# dataclasses.asdict deep-copies recursively: ~20x slower than reading the flat fields.
_EVENT_FIELDS = tuple(f.name for f in fields(UsageEvent))


class _Flush:
    """A marker in the queue: everything submitted before it is written when ``done`` is set."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()


class UsageWriter:
    """Queue usage events and bulk-insert them from a background thread.

    ``close()`` writes everything submitted before it. A batch the database refuses for a value
    in it is written in halves down to single rows: only the rows refused on their own are
    dropped. One refused for the database's state is retried ``max_retries`` times with
    backoff, then dropped. Dropped rows are counted in ``dropped`` and logged (never their
    content).
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        batch_size: int = 500,
        flush_interval_s: float = 0.5,
        max_retries: int = 3,
        retry_backoff_s: float = 0.2,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be > 0")
        self._factory = session_factory
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._max_retries = max_retries
        self._backoff = retry_backoff_s
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders submit() against close(): nothing lands after STOP
        self._closed = False
        self._written = 0
        self._dropped = 0
        self._submitted = 0
        self._thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
        self._thread.start()

    @property
    def written(self) -> int:
        """Records inserted so far."""
        return self._written

    @property
    def dropped(self) -> int:
        """Records given up on: refused on their own, or in a batch the database refused
        ``max_retries`` times."""
        return self._dropped

    @property
    def submitted(self) -> int:
        return self._submitted

    def submit(self, event: UsageEvent) -> None:
        """Queue ``event`` for writing; O(1), never blocks on the database."""
        with self._lock:
            if self._closed:
                raise RuntimeError("UsageWriter is closed")
            self._submitted += 1
            self._queue.put(event)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything submitted before this call is written (or dropped)."""
        marker = _Flush()
        with self._lock:
            if self._closed:
                return not self._thread.is_alive()
            self._queue.put(marker)
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting events, write all queued ones, stop the thread. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._thread.join(timeout)

    def __enter__(self) -> UsageWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the background thread -------------------------------------------------------------

    def _run(self) -> None:
        batch: list[dict[str, Any]] = []
        deadline = 0.0  # when the oldest queued event has waited flush_interval_s
        while True:
            wait = max(0.0, deadline - time.monotonic()) if batch else self._interval
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = None
            if isinstance(item, UsageEvent):
                if not batch:
                    deadline = time.monotonic() + self._interval
                batch.append({name: getattr(item, name) for name in _EVENT_FIELDS})
                if len(batch) < self._batch_size and time.monotonic() < deadline:
                    continue
            elif item is None and not batch:
                continue
            self._write(batch)
            batch = []
            if isinstance(item, _Flush):
                item.done.set()
            elif item is _STOP:
                return

    def _write(self, batch: list[dict[str, Any]]) -> None:
        """Insert ``batch`` in one transaction; retry it whole while the database's state is at
        fault, isolate the refused rows when a value is (:func:`_refuses_a_value`)."""
        if not batch:
            return
        for attempt in range(self._max_retries + 1):
            try:
                self._insert(batch)
            except Exception as exc:  # the DB is down or refuses: never kill the thread
                if _refuses_a_value(exc):
                    self._isolate(batch, exc)
                    return
                if attempt == self._max_retries:
                    self._drop(len(batch), f"after {attempt + 1} attempts", exc)
                    return
                log.warning("usage batch insert failed (%s); retrying", _describe(exc))
                time.sleep(self._backoff * (2**attempt))
            else:
                self._written += len(batch)
                return

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        with self._factory.begin() as session:
            for start in range(0, len(rows), YIELD_EVERY_ROWS):
                session.execute(_INSERT, rows[start : start + YIELD_EVERY_ROWS])
                time.sleep(0)  # hand the GIL back to the event loop (YIELD_EVERY_ROWS)

    def _isolate(self, rows: list[dict[str, Any]], exc: Exception) -> None:
        """Write ``rows``, which the database refused for a value in one of them, in halves:
        each half is a batch of its own (retried, isolated further), so a bad row costs
        O(log n) transactions and only itself; a single row refused is dropped."""
        if len(rows) == 1:
            self._drop(1, "refused on its own", exc)
            return
        middle = len(rows) // 2
        self._write(rows[:middle])
        self._write(rows[middle:])

    def _drop(self, count: int, why: str, exc: Exception) -> None:
        """Count and log ``count`` records given up on: the error's kind, never its text (it
        names the values)."""
        self._dropped += count
        log.error("dropping %d usage record(s) %s: %s", count, why, _describe(exc))


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


def _describe(exc: Exception) -> str:
    return describe(exc) if isinstance(exc, SQLAlchemyError) else type(exc).__name__
