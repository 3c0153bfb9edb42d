"""In-process rate limiter: exact sliding logs per tenant, for a single gateway process.

Every operation is a short synchronous critical section that never awaits, so under asyncio it
is atomic by construction; the ``threading.Lock`` around it also makes the limiter safe to share
with threads (sync handlers, a metrics exporter). Use :mod:`gateway.limits.redis` when several
gateway processes must share one budget.

:class:`~gateway.limits.failover.FailoverRateLimiter` also keeps one of these beside Redis, as a
mirror of what this process admitted (:meth:`InMemoryRateLimiter.record`): it enforces this
process's share while Redis is away and re-seeds Redis from it (:meth:`snapshot`) when it returns.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.limits.base import (
    Limits,
    RateLimiter,
    RejectReason,
    Reservation,
    Usage,
    check_tokens,
    rejection,
    too_large_for_tpm,
)


@dataclass(frozen=True, slots=True)
class LocalEntry:
    """One reservation this process holds or admitted within the window, as Redis needs it back.

    ``age_s`` is ``None`` for a slot whose request has left the window (it ran longer than
    ``window_s``): only its lease is still held.
    """

    reservation_id: str
    age_s: float | None
    tokens: int
    held: bool


@dataclass(slots=True)
class _TenantState:
    log: deque[tuple[float, str]] = field(default_factory=deque)  # (reserved_at, id), oldest first
    tokens: dict[str, int] = field(default_factory=dict)  # id -> tokens counted, for logged ids
    token_total: int = 0
    slots: dict[str, float] = field(default_factory=dict)  # id -> slot expiry

    def trim(self, now: float, window_s: float) -> None:
        """Forget log entries at least ``window_s`` old and slots whose lease ran out."""
        cutoff = now - window_s
        while self.log and self.log[0][0] <= cutoff:
            _, rid = self.log.popleft()
            self.token_total -= self.tokens.pop(rid)
        for rid in [rid for rid, expiry in self.slots.items() if expiry <= now]:
            del self.slots[rid]

    def tpm_retry_after(self, tokens: int, tpm: int, now: float, window_s: float) -> float:
        """Time until enough of the oldest entries leave the window for ``tokens`` to fit."""
        need = self.token_total + tokens - tpm
        for reserved_at, rid in self.log:
            need -= self.tokens[rid]
            if need <= 0:
                return reserved_at + window_s - now
        return window_s  # unreachable while tokens <= tpm: an empty log always fits


class InMemoryRateLimiter(RateLimiter):
    """Exact per-tenant sliding-log limits held in this process."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, **options: float) -> None:
        super().__init__(**options)
        self._clock = clock
        self._lock = threading.Lock()
        self._tenants: dict[str, _TenantState] = {}

    async def reserve(
        self, tenant: str, limits: Limits, tokens: int, *, reservation_id: str | None = None
    ) -> Reservation:
        """:meth:`RateLimiter.reserve`; ``reservation_id``: the id to use (else a new one)."""
        check_tokens(tokens)
        if limits.tpm is not None and tokens > limits.tpm:
            raise too_large_for_tpm(tokens, limits.tpm)
        with self._lock:
            now = self._clock()
            state = self._tenants.setdefault(tenant, _TenantState())
            state.trim(now, self.window_s)
            if limits.rpm is not None and len(state.log) >= limits.rpm:
                # The (n - rpm)-th oldest entry is the last that must leave for one more to fit.
                reserved_at = state.log[len(state.log) - limits.rpm][0]
                retry = reserved_at + self.window_s - now
                raise rejection(RejectReason.RATE_LIMIT_RPM, retry, limits)
            if limits.tpm is not None and state.token_total + tokens > limits.tpm:
                retry = state.tpm_retry_after(tokens, limits.tpm, now, self.window_s)
                raise rejection(RejectReason.RATE_LIMIT_TPM, retry, limits)
            if limits.max_concurrency is not None and len(state.slots) >= limits.max_concurrency:
                raise rejection(RejectReason.CONCURRENCY, self.concurrency_retry_after_s, limits)
            rid = reservation_id or uuid.uuid4().hex
            state.log.append((now, rid))
            state.tokens[rid] = tokens
            state.token_total += tokens
            expires = now + self.slot_ttl_s
            state.slots[rid] = expires
        return Reservation(rid, tenant, tokens, now, expires)

    def record(self, tenant: str, reservation_id: str, tokens: int) -> None:
        """Log an admission decided elsewhere (by Redis), unchecked, with a slot held.

        The mirror a :class:`~gateway.limits.failover.FailoverRateLimiter` keeps, so that this
        process's own recent admissions count against its share when Redis goes away.
        """
        with self._lock:
            now = self._clock()
            state = self._tenants.setdefault(tenant, _TenantState())
            state.trim(now, self.window_s)
            state.log.append((now, reservation_id))
            state.tokens[reservation_id] = tokens
            state.token_total += tokens
            state.slots[reservation_id] = now + self.slot_ttl_s

    def recent(self, tenant: str, margin_s: float = 1.0) -> bool:
        """Whether this process admitted for ``tenant`` within the window (less a margin).

        Redis showing an empty window while this is true means Redis lost its data.
        """
        with self._lock:
            state = self._tenants.get(tenant)
            if state is None or not state.log:
                return False
            return state.log[-1][0] > self._clock() - (self.window_s - margin_s)

    def held_slots(self) -> dict[str, list[str]]:
        """Reservation ids whose slot is held now, by tenant (the leases to renew)."""
        with self._lock:
            return {
                tenant: list(state.slots) for tenant, state in self._tenants.items() if state.slots
            }

    def snapshot(self, tenant: str | None = None) -> dict[str, list[LocalEntry]]:
        """Admissions within the window and slots held, with their ages, by tenant (or one)."""
        out: dict[str, list[LocalEntry]] = {}
        with self._lock:
            now = self._clock()
            tenants = self._tenants if tenant is None else {tenant: self._tenants.get(tenant)}
            for name, state in tenants.items():
                if state is None:
                    continue
                state.trim(now, self.window_s)
                entries = [
                    LocalEntry(rid, now - at, state.tokens[rid], rid in state.slots)
                    for at, rid in state.log
                ]
                entries += [
                    LocalEntry(rid, None, 0, True) for rid in state.slots if rid not in state.tokens
                ]
                if entries:
                    out[name] = entries
        return out

    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        check_tokens(actual_tokens)
        with self._lock:
            state = self._tenants.get(reservation.tenant)
            if state is None:
                return
            rid = reservation.reservation_id
            state.slots.pop(rid, None)
            counted = state.tokens.get(rid)
            if counted is not None:  # still in the window
                state.tokens[rid] = actual_tokens
                state.token_total += actual_tokens - counted
            state.trim(self._clock(), self.window_s)
            if not state.log and not state.slots:  # idle tenants cost nothing
                del self._tenants[reservation.tenant]

    async def usage(self, tenant: str) -> Usage:
        with self._lock:
            state = self._tenants.get(tenant)
            if state is None:
                return Usage(0, 0, 0)
            state.trim(self._clock(), self.window_s)
            return Usage(len(state.log), state.token_total, len(state.slots))
