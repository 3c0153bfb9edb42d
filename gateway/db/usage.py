"""Batched, off-request-path writing of usage records.

The request path only appends to an in-memory queue (:meth:`UsageWriter.submit` never blocks
and never touches the database). One background thread drains the queue and bulk-inserts in
batches of ``batch_size`` or whatever arrived within ``flush_interval_s``, so the database sees
a few multi-row INSERTs per second instead of one transaction per request.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.models import USAGE_STATUSES, UsageRecord, utcnow

log = logging.getLogger(__name__)

MAX_TOKENS = 2**31 - 1
"""The token columns are 32-bit INTEGERs on PostgreSQL: a larger count would fail its batch."""

# A Core INSERT (executemany / insertmanyvalues): no ORM bookkeeping per row.
_INSERT = insert(UsageRecord.metadata.tables[UsageRecord.__tablename__])


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

    ``close()`` writes everything submitted before it; a batch the database refuses is retried
    ``max_retries`` times with backoff, then dropped and counted in ``dropped`` (and logged).
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
        """Records given up on after the database refused them ``max_retries`` times."""
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
        if not batch:
            return
        for attempt in range(self._max_retries + 1):
            try:
                with self._factory.begin() as session:
                    for start in range(0, len(batch), YIELD_EVERY_ROWS):
                        session.execute(_INSERT, batch[start : start + YIELD_EVERY_ROWS])
                        time.sleep(0)  # hand the GIL back to the event loop (see below)
            except Exception as exc:  # the DB is down or refuses: retry, never kill the thread
                if attempt == self._max_retries:
                    self._dropped += len(batch)
                    log.error(
                        "dropping %d usage records after %d attempts: %s",
                        len(batch),
                        attempt + 1,
                        type(exc).__name__,
                    )
                    return
                log.warning("usage batch insert failed (%s); retrying", type(exc).__name__)
                time.sleep(self._backoff * (2**attempt))
            else:
                self._written += len(batch)
                return
