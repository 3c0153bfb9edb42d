"""Tenant limits of several gateway workers without Redis: each worker enforces its share.

With ``TIERGATE_REDIS_URL`` every worker (and replica) reserves against the same sliding logs in
Redis, and the limits are exact. Without Redis each worker keeps its own in-process logs; N
workers each allowing the whole limit would let a tenant through at N times its limit. So:

* a limit of at least N is enforced by each worker as its **share**, ``limit // N`` (rounded
  down: the workers together never admit more than the limit, and may admit up to N - 1 fewer);
* a limit **below N** has no share (1 each would admit N, 0 each nothing): it is counted once,
  exactly, for all workers, in the table the supervisor shares with them
  (:mod:`gateway.limits.shared`);
* a tenant's requests are not spread evenly over the workers (the kernel hands each new
  connection to whichever worker accepts first, and a keep-alive connection stays on its
  worker), so a tenant can be refused by one worker while another still has room: refused
  early, never admitted late. A request larger than a worker's TPM share is refused outright.

That is the documented fallback (``docs/operations/workers.md``); exact limits need Redis.
Refusals say which share was reached, and what the tenant's limit is.
"""

from __future__ import annotations

import logging

from gateway.limits import LimitExceeded, Limits, RateLimiter, Reservation, Usage
from gateway.limits.shared import SharedLimitTable, below

log = logging.getLogger(__name__)


def worker_share(limits: Limits, workers: int) -> Limits:
    """Each limit of at least ``workers`` divided by it, rounded down; a smaller limit is not
    a worker's to enforce (None here: :func:`~gateway.limits.shared.below` has it)."""

    def part(value: int | None) -> int | None:
        return None if value is None or value < workers else value // workers

    return Limits(part(limits.rpm), part(limits.tpm), part(limits.max_concurrency))


def _fields(limits: Limits) -> tuple[int | None, int | None, int | None]:
    return limits.rpm, limits.tpm, limits.max_concurrency


_WHAT = {"rpm": "requests per minute", "tpm": "tokens per minute", "max_concurrency": "at once"}


class WorkerShareLimiter(RateLimiter):
    """An in-process limiter that enforces ``1/workers`` of each limit, and the limits below
    ``workers`` in the workers' shared table (see the module)."""

    def __init__(
        self, inner: RateLimiter, workers: int, *, table: SharedLimitTable | None = None
    ) -> None:
        if workers < 2:
            raise ValueError("a share is only needed with at least 2 workers")
        super().__init__(
            window_s=inner.window_s,
            slot_ttl_s=inner.slot_ttl_s,
            concurrency_retry_after_s=inner.concurrency_retry_after_s,
        )
        self.inner = inner
        self.workers = workers
        self.table = table
        self._small: dict[str, tuple[str, float]] = {}
        """Reservation id -> (tenant, its entry in the shared table)."""

    async def reserve(self, tenant: str, limits: Limits, tokens: int) -> Reservation:
        if limits.rpm is None and limits.tpm is None and limits.max_concurrency is None:
            return await self.inner.reserve(tenant, limits, tokens)
        small = below(limits, self.workers)
        share = worker_share(limits, self.workers)
        entry = None
        if small != Limits() and self.table is None:
            # not under a supervisor (no shared table): this process is the only one
            share = Limits(
                *(
                    a if a is not None else b
                    for a, b in zip(_fields(share), _fields(small), strict=True)
                )
            )
        elif small != Limits() and self.table is not None:
            try:
                entry = self.table.reserve(tenant, small, tokens)
            except LimitExceeded as exc:
                raise LimitExceeded(
                    exc.reason,
                    exc.retry_after_s,
                    f"{exc.message} (the tenant's whole limit, counted across the "
                    f"{self.workers} gateway workers)",
                ) from None
        try:
            reservation = await self.inner.reserve(tenant, share, tokens)
        except LimitExceeded as exc:
            if entry is not None and self.table is not None:
                self.table.cancel(tenant, entry)  # not admitted: it counts nowhere
            raise LimitExceeded(
                exc.reason, exc.retry_after_s, self._share_message(exc, limits, share)
            ) from None
        if entry is not None:
            self._small[reservation.reservation_id] = (tenant, entry)
        return reservation

    def _share_message(self, exc: LimitExceeded, limits: Limits, share: Limits) -> str:
        field = {"rate_limit_rpm": "rpm", "rate_limit_tpm": "tpm"}.get(
            exc.reason.value, "max_concurrency"
        )
        if getattr(share, field) == getattr(limits, field):
            return exc.message
        return (
            f"{exc.message}: this gateway worker's share, {getattr(share, field)} of the "
            f"tenant's {getattr(limits, field)} {_WHAT[field]} ({self.workers} workers without "
            "Redis each enforce limit // workers)"
        )

    def _forget(self, reservation: Reservation, tokens: int) -> None:
        held = self._small.pop(reservation.reservation_id, None)
        if held is not None and self.table is not None:
            self.table.release(held[0], held[1], tokens)

    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        self._forget(reservation, actual_tokens)
        await self.inner.reconcile(reservation, actual_tokens)

    async def release(self, reservation: Reservation, consumed_tokens: int = 0) -> None:
        self._forget(reservation, consumed_tokens)
        await self.inner.release(reservation, consumed_tokens)

    async def usage(self, tenant: str) -> Usage:
        return await self.inner.usage(tenant)

    async def aclose(self) -> None:
        await self.inner.aclose()


def per_worker_limits(
    limiter: RateLimiter, *, workers: int, shared: bool, table: SharedLimitTable | None = None
) -> RateLimiter:
    """``limiter`` as the app should use it: unchanged when the limits are ``shared`` (Redis) or
    there is one worker, else wrapped in :class:`WorkerShareLimiter` (with the workers' shared
    ``table`` for the limits below ``workers``)."""
    if shared or workers < 2:
        return limiter
    log.info(
        "%d gateway workers without TIERGATE_REDIS_URL: each enforces 1/%d of every tenant "
        "limit of at least %d (rounded down); smaller limits are counted once for all workers; "
        "set TIERGATE_REDIS_URL for exact shared limits",
        workers,
        workers,
        workers,
    )
    return WorkerShareLimiter(limiter, workers, table=table)
