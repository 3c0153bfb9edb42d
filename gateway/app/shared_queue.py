"""Each backend's queued prefills, shared between the workers of ``tiergate serve --workers N``.

Every worker routes with its own GoRouting state. Without this module a worker knows only the
prefills *it* dispatched and sees the others' as the engine's scraped running/waiting count,
i.e. as decoding work, up to a scrape interval late. Here each worker publishes, per backend,
the summary GoRouting's ``phi`` needs of its queued prefills
(:class:`~priority.routing.ExternalPrefills`: count, prompt tokens, raw work, chunks, smallest
TPOT SLO, earliest deadline, update time), and every worker's router adds the other workers'
summaries to its view of that backend (:meth:`PrefillTable.others`).

The table is one ``multiprocessing.shared_memory`` block the supervisor creates: a row per
(worker slot, backend slot) of float64 fields, and per worker a pid and a heartbeat.

* **Single writer per row.** A worker writes only its own rows (its slot's), from its event loop.
  Backends are matched by a key (a hash of the backend's name, URL and profile), not by
  position, so workers that configured their backends in different orders agree.
* **Seqlock per row.** The writer makes the row's version odd, writes the fields, makes it even
  again; a reader copies version, fields, version, and keeps a row only if both versions are
  equal and even (else it retries a few times, then skips the row): never a torn row.
* **Stale rows ignored.** A worker refreshes its heartbeat on every publish and a few times a
  second (the pool's health loop); rows of a worker whose heartbeat is older than
  :data:`STALE_S` are ignored (a frozen or killed worker), and the supervisor zeroes a worker's
  rows when it exits, before its slot is started again.

Cost: publishing is one summary of the worker's queue and one row write per queue change;
reading is a few numpy copies of the table per routing decision (about 6 and 14 µs on the
2-core development VM: docs/operations/workers.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from multiprocessing import shared_memory

import numpy as np

from priority.routing import ExternalPrefills

STALE_S = 2.0
"""A worker whose heartbeat is older than this is ignored (its loop is stuck or it is gone)."""
BACKEND_SLOTS = 64
"""Backends one worker can publish (more are routed without sharing, with a warning once)."""
READ_RETRIES = 3

# row fields
VERSION, KEY, COUNT, PROMPT, RAW, CHUNKS, MIN_TPOT, DEADLINE, UPDATED = range(9)
FIELDS = 9
# worker header fields
PID, HEARTBEAT = range(2)
HEADER = 2


def backend_key(name: str, base_url: str, profile: str) -> float:
    """A non-zero key for a backend, exact in a float64 (48 bits)."""
    digest = hashlib.blake2b(f"{name}\0{base_url}\0{profile}".encode(), digest_size=6).digest()
    return float(int.from_bytes(digest, "big") or 1)


class PrefillTable:
    """The shared block: ``workers`` x :data:`BACKEND_SLOTS` rows and a header per worker."""

    def __init__(self, shm: shared_memory.SharedMemory, workers: int, *, owner: bool) -> None:
        self._shm = shm
        self.workers = workers
        self.owner = owner
        rows = workers * BACKEND_SLOTS * FIELDS
        buf = shm.buf
        self.rows: np.ndarray = np.ndarray(
            (workers, BACKEND_SLOTS, FIELDS), dtype=np.float64, buffer=buf
        )
        self.header: np.ndarray = np.ndarray(
            (workers, HEADER), dtype=np.float64, buffer=buf, offset=rows * 8
        )

    @classmethod
    def create(cls, workers: int) -> PrefillTable:
        """A zeroed block (the supervisor's; it unlinks it on :meth:`close`)."""
        size = 8 * workers * (BACKEND_SLOTS * FIELDS + HEADER)
        table = cls(shared_memory.SharedMemory(create=True, size=size), workers, owner=True)
        table.rows.fill(0.0)
        table.header.fill(0.0)
        return table

    @classmethod
    def attach(cls, name: str, workers: int) -> PrefillTable:
        return cls(shared_memory.SharedMemory(name=name), workers, owner=False)

    @property
    def name(self) -> str:
        return self._shm.name

    def close(self) -> None:
        # the numpy views hold exports of the buffer: drop them before closing it
        del self.rows, self.header
        with contextlib.suppress(BufferError):
            self._shm.close()
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()

    def clear_worker(self, worker: int) -> None:
        """Forget a worker that exited (the supervisor: it no longer writes these rows)."""
        self.header[worker, HEARTBEAT] = 0.0
        self.rows[worker, :, 1:] = 0.0
        self.rows[worker, :, VERSION] = 0.0

    # ---- writing (one worker, its own rows) ------------------------------------------------

    def write(self, worker: int, slot: int, key: float, summary: ExternalPrefills | None) -> None:
        """Seqlock write of one row (``summary`` None: empty)."""
        row = self.rows[worker, slot]
        version = row[VERSION]
        row[VERSION] = version + 1.0
        if summary is None or summary.count == 0:
            row[KEY:] = (key, 0.0, 0.0, 0.0, 0.0, math.inf, math.inf, 0.0)
        else:
            row[KEY:] = (
                key,
                summary.count,
                summary.prompt_tokens,
                summary.raw_work,
                summary.chunks,
                summary.min_tpot_s,
                summary.earliest_deadline_s,
                summary.updated_s,
            )
        row[VERSION] = version + 2.0

    def beat(self, worker: int, pid: int, now: float) -> None:
        self.header[worker, PID] = pid
        self.header[worker, HEARTBEAT] = now

    # ---- reading ---------------------------------------------------------------------------

    def others(self, worker: int | None, now: float) -> dict[float, ExternalPrefills]:
        """The summed queued prefills of every live worker but ``worker``, by backend key."""
        fresh = now - self.header[:, HEARTBEAT] <= STALE_S
        if worker is not None:
            fresh[worker] = False
        if not fresh.any():
            return {}
        workers = np.flatnonzero(fresh)
        before = self.rows[workers, :, VERSION]  # fancy indexing: each of these is a copy
        data = self.rows[workers]
        after = self.rows[workers, :, VERSION]
        ok = (before == after) & (before % 2.0 == 0.0)
        used = ok & (data[:, :, COUNT] > 0)
        rows = [data[w, s] for w, s in zip(*np.nonzero(used), strict=True)]
        if not ok.all():  # a write was under way: those rows alone, again
            for w, s in zip(*np.nonzero(~ok), strict=True):
                row = self._read_row(int(workers[w]), int(s))
                if row is not None and row[COUNT] > 0:
                    rows.append(row)
        return _sum_by_key(rows)

    def _read_row(self, worker: int, slot: int) -> np.ndarray | None:
        """One row, retried while a write is under way; None if it never settles."""
        live = self.rows[worker, slot]
        for _ in range(READ_RETRIES):
            before = live[VERSION]
            copy = live.copy()
            if before % 2.0 == 0.0 and live[VERSION] == before == copy[VERSION]:
                return copy
        return None


def _sum_by_key(rows: list[np.ndarray]) -> dict[float, ExternalPrefills]:
    merged: dict[float, ExternalPrefills] = {}
    for row in rows:
        key = float(row[KEY])
        part = ExternalPrefills(
            int(row[COUNT]),
            int(row[PROMPT]),
            float(row[RAW]),
            int(row[CHUNKS]),
            float(row[MIN_TPOT]),
            float(row[DEADLINE]),
            float(row[UPDATED]),
        )
        seen = merged.get(key)
        merged[key] = part if seen is None else _add(seen, part)
    return merged


def _add(a: ExternalPrefills, b: ExternalPrefills) -> ExternalPrefills:
    return ExternalPrefills(
        a.count + b.count,
        a.prompt_tokens + b.prompt_tokens,
        a.raw_work + b.raw_work,
        a.chunks + b.chunks,
        min(a.min_tpot_s, b.min_tpot_s),
        min(a.earliest_deadline_s, b.earliest_deadline_s),
        max(a.updated_s, b.updated_s),
    )


class Publisher:
    """One worker's side of the table: its rows, by backend key."""

    def __init__(self, table: PrefillTable, worker: int, pid: int) -> None:
        self.table = table
        self.worker = worker
        self.pid = pid
        self._slots: dict[float, int] = {}
        self.overflow = False
        """True once a backend found no free row (more than BACKEND_SLOTS configured)."""

    def publish(self, key: float, summary: ExternalPrefills | None, now: float) -> None:
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= BACKEND_SLOTS:
                self.overflow = True
                return
            slot = self._slots[key] = len(self._slots)
        self.table.write(self.worker, slot, key, summary)
        self.table.beat(self.worker, self.pid, now)

    def beat(self, now: float) -> None:
        self.table.beat(self.worker, self.pid, now)

    def reset(self) -> None:
        """Empty every row this worker wrote (a reconfiguration starts from empty queues)."""
        for key, slot in self._slots.items():
            self.table.write(self.worker, slot, key, None)
        self._slots.clear()

    def others(self, now: float) -> dict[float, ExternalPrefills]:
        return self.table.others(self.worker, now)


_joined: Publisher | None = None


def join(name: str, workers: int, worker: int, pid: int) -> Publisher:
    """Attach this worker process to the supervisor's table as ``worker`` (its slot)."""
    global _joined
    table = PrefillTable.attach(name, workers)
    table.clear_worker(worker)
    _joined = Publisher(table, worker, pid)
    return _joined


def joined() -> Publisher | None:
    """This process's publisher, or None (a single-process gateway: nothing is shared)."""
    return _joined
