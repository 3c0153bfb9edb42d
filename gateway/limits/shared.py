"""Limits smaller than the number of workers, counted once for all of them (no Redis).

Without Redis each of N workers enforces ``limit // N`` of a tenant's limit
(:mod:`gateway.worker_limits`). A limit below N has no such share: 1 each would admit up to N
(a tenant with ``rpm_limit: 1`` got 2 a minute from 2 workers), 0 each would refuse everything.
Those limits are counted here instead, exactly, in a table every worker of one ``tiergate
serve`` maps (:mod:`gateway.app.shared_state`), each reservation one critical section under the
table's lock.

A tenant's row holds a few entries (``2 N``: every limit counted here is below N), one per
reservation it needs to remember: admission time and tokens while an RPM or TPM limit counted
here needs them (:data:`WINDOW_S`), a concurrency slot while a concurrency limit counted here is
held (with a lease, and freed by the supervisor when the holding worker exits). The same rules
as the in-process limiter (:mod:`gateway.limits.memory`): sliding logs, retry-after until the
oldest entry leaves the window, a request larger than the TPM limit refused outright. A
reservation that finds no free entry (only possible with requests of 0 tokens under a TPM limit
below N) or no row for its tenant (more than :data:`TENANT_WAYS` such tenants hashed to one
bucket) is refused, never admitted past the limit.

Times are ``time.monotonic()``, one clock for every process of a Linux host.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gateway.limits.base import (
    DEFAULT_CONCURRENCY_RETRY_AFTER_S,
    DEFAULT_SLOT_TTL_S,
    WINDOW_S,
    LimitExceeded,
    Limits,
    RejectReason,
    rejection,
    too_large_for_tpm,
)

if TYPE_CHECKING:
    from gateway.app.shared_state import SharedFile

TENANT_BUCKETS = 1024
TENANT_WAYS = 8
"""A tenant hashes to one bucket of this many rows (8,192 tenants with small limits per host)."""
RESERVED_AT, TOKENS, SLOT_EXPIRES, RID, WORKER, WINDOWED = range(6)
FIELDS = 6


def entries_per_tenant(workers: int) -> int:
    return 2 * max(1, workers)


def table_bytes(workers: int) -> int:
    rows = TENANT_BUCKETS * TENANT_WAYS
    return rows * 8 * (2 + entries_per_tenant(workers) * FIELDS)


def below(limits: Limits, workers: int) -> Limits:
    """The limits smaller than ``workers``: the ones this table counts, whole."""

    def small(value: int | None) -> int | None:
        return value if value is not None and value < workers else None

    return Limits(small(limits.rpm), small(limits.tpm), small(limits.max_concurrency))


class SharedLimitTable:
    """Reservations against the limits below N, seen by every worker (see the module)."""

    def __init__(
        self,
        table: SharedFile,
        workers: int,
        *,
        slot: int | None,
        window_s: float = WINDOW_S,
        slot_ttl_s: float = DEFAULT_SLOT_TTL_S,
        concurrency_retry_after_s: float = DEFAULT_CONCURRENCY_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self.workers = workers
        self.slot = -1.0 if slot is None else float(slot)
        self.window_s = window_s
        self.slot_ttl_s = slot_ttl_s
        self.concurrency_retry_after_s = concurrency_retry_after_s
        self._clock = clock
        entries = entries_per_tenant(workers)
        self._keys: np.ndarray = np.ndarray(
            (TENANT_BUCKETS, TENANT_WAYS, 2), dtype=np.int64, buffer=table.buffer
        )
        self._entries: np.ndarray = np.ndarray(
            (TENANT_BUCKETS, TENANT_WAYS, entries, FIELDS),
            dtype=np.float64,
            buffer=table.buffer,
            offset=TENANT_BUCKETS * TENANT_WAYS * 2 * 8,
        )

    # ---- the three operations ------------------------------------------------------------

    def reserve(self, tenant: str, limits: Limits, tokens: int) -> float:
        """Take one entry against ``limits`` (all below N) or raise :class:`LimitExceeded`;
        returns the entry's id for :meth:`release`."""
        if limits.tpm is not None and tokens > limits.tpm:
            raise too_large_for_tpm(tokens, limits.tpm)
        windowed = limits.rpm is not None or limits.tpm is not None
        with self.table.locked():
            now = self._clock()
            entries = self._row(tenant, now, create=True)
            if entries is None:
                raise self._full(limits, None)
            self._expire(entries, now)
            used = entries[:, RID] != 0
            counted = used & (entries[:, WINDOWED] == 1.0)
            times = np.sort(entries[counted, RESERVED_AT])
            if limits.rpm is not None and times.size >= limits.rpm:
                retry = float(times[times.size - limits.rpm]) + self.window_s - now
                raise rejection(RejectReason.RATE_LIMIT_RPM, retry, limits)
            if limits.tpm is not None:
                total = float(entries[counted, TOKENS].sum())
                if total + tokens > limits.tpm:
                    raise rejection(
                        RejectReason.RATE_LIMIT_TPM,
                        self._tpm_retry(entries[counted], total + tokens - limits.tpm, now),
                        limits,
                    )
            held = int(np.count_nonzero(used & (entries[:, SLOT_EXPIRES] > 0)))
            if limits.max_concurrency is not None and held >= limits.max_concurrency:
                raise rejection(RejectReason.CONCURRENCY, self.concurrency_retry_after_s, limits)
            free = np.flatnonzero(~used)
            if not free.size:
                raise self._full(limits, self._soonest_free(entries, now))
            rid = float(secrets.randbits(52) + 1)  # exact in a float64
            entry = entries[int(free[0])]
            expires = now + self.slot_ttl_s if limits.max_concurrency is not None else 0.0
            entry[[RESERVED_AT, TOKENS, SLOT_EXPIRES, WORKER, WINDOWED]] = (
                now,
                tokens,
                expires,
                self.slot,
                1.0 if windowed else 0.0,
            )
            entry[RID] = rid  # last: a half-written entry is not counted
        return rid

    def release(self, tenant: str, rid: float, tokens: int) -> None:
        """The request ended: its slot is free, and it counts ``tokens`` (what it used)."""
        with self.table.locked():
            entries = self._row(tenant, self._clock(), create=False)
            if entries is None:
                return
            found = np.flatnonzero(entries[:, RID] == rid)
            if not found.size:
                return
            entry = entries[int(found[0])]
            entry[SLOT_EXPIRES] = 0.0
            entry[TOKENS] = tokens
            if entry[WINDOWED] != 1.0:
                entry[RID] = 0.0

    def cancel(self, tenant: str, rid: float) -> None:
        """Take back an entry whose request was not admitted after all: it counts nowhere."""
        with self.table.locked():
            entries = self._row(tenant, self._clock(), create=False)
            if entries is not None:
                entries[entries[:, RID] == rid, RID] = 0.0

    def release_worker(self, slot: int) -> None:
        """Free the slots a worker that exited held (its admissions still count)."""
        with self.table.locked():
            mine = (self._entries[..., WORKER] == float(slot)) & (self._entries[..., RID] != 0)
            self._entries[..., SLOT_EXPIRES][mine] = 0.0
            gone = mine & (self._entries[..., WINDOWED] != 1.0)
            self._entries[..., RID][gone] = 0.0

    # ---- inside the lock --------------------------------------------------------------------

    def _row(self, tenant: str, now: float, *, create: bool) -> np.ndarray | None:
        """The tenant's entries (a view), claiming a row when ``create`` and none is held."""
        digest = hashlib.blake2b(tenant.encode(), digest_size=16).digest()
        high = int.from_bytes(digest[:8], "little", signed=True)
        low = int.from_bytes(digest[8:], "little", signed=True) or 1
        bucket = int.from_bytes(digest[:8], "little") % TENANT_BUCKETS
        keys, rows = self._keys[bucket], self._entries[bucket]
        found = np.flatnonzero((keys[:, 0] == high) & (keys[:, 1] == low))
        if found.size:
            return rows[int(found[0])]
        if not create:
            return None
        for way in range(TENANT_WAYS):
            self._expire(rows[way], now)
        idle = np.flatnonzero(~(rows[:, :, RID] != 0).any(axis=1))
        if not idle.size:
            return None
        way = int(idle[0])
        rows[way] = 0.0
        keys[way] = (high, low)
        return rows[way]

    def _expire(self, entries: np.ndarray, now: float) -> None:
        """Forget what no limit needs any more: out of the window and no slot held."""
        lapsed = (entries[:, SLOT_EXPIRES] > 0) & (entries[:, SLOT_EXPIRES] <= now)
        entries[lapsed, SLOT_EXPIRES] = 0.0
        old = (entries[:, WINDOWED] != 1.0) | (entries[:, RESERVED_AT] <= now - self.window_s)
        entries[old & (entries[:, SLOT_EXPIRES] == 0.0), RID] = 0.0

    def _tpm_retry(self, counted: np.ndarray, need: float, now: float) -> float:
        order = np.argsort(counted[:, RESERVED_AT])
        for i in order:
            need -= float(counted[i, TOKENS])
            if need <= 0:
                return float(counted[i, RESERVED_AT]) + self.window_s - now
        return self.window_s

    def _soonest_free(self, entries: np.ndarray, now: float) -> float:
        ends = np.maximum(
            np.where(entries[:, WINDOWED] == 1.0, entries[:, RESERVED_AT] + self.window_s, now),
            entries[:, SLOT_EXPIRES],
        )
        return max(0.0, float(ends.min()) - now)

    def _full(self, limits: Limits, retry_after_s: float | None) -> LimitExceeded:
        reason = (
            RejectReason.RATE_LIMIT_RPM
            if limits.rpm is not None
            else RejectReason.RATE_LIMIT_TPM
            if limits.tpm is not None
            else RejectReason.CONCURRENCY
        )
        return LimitExceeded(
            reason,
            retry_after_s if retry_after_s is not None else self.concurrency_retry_after_s,
            "the workers' shared table of small limits has no room for this request now",
        )
