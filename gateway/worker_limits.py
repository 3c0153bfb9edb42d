"""Tenant limits of several gateway workers without Redis: each worker enforces its share.

With ``TIERGATE_REDIS_URL`` every worker (and replica) reserves against the same sliding logs in
Redis, and the limits are exact. Without Redis each worker keeps its own in-process logs; N
workers each allowing the whole limit would let a tenant through at N times its limit. So each
worker enforces ``max(1, limit // N)`` of every limit (RPM, TPM, concurrency):

* the fleet never admits more than the limit while the limit is at least N (rounded down, so
  it may admit up to N - 1 less);
* a limit below N is still 1 per worker: up to N in all (refusing every request of a tenant
  whose limit is 1 would be worse than letting 2 through);
* a tenant's requests are not spread evenly over the workers (the kernel hands each new
  connection to whichever worker accepts first, and a keep-alive connection stays on its
  worker), so a tenant can be refused by one worker while another still has room: refused
  early, never admitted late. A request larger than a worker's TPM share is refused outright.

That is the documented fallback (``docs/operations/workers.md``); exact limits need Redis.
Refusals say which share was reached.
"""

from __future__ import annotations

import logging

from gateway.limits import LimitExceeded, Limits, RateLimiter, Reservation, Usage

log = logging.getLogger(__name__)


def worker_share(limits: Limits, workers: int) -> Limits:
    """Each limit divided by ``workers``, rounded down, at least 1; unlimited stays so."""

    def part(value: int | None) -> int | None:
        return None if value is None else max(1, value // workers)

    return Limits(part(limits.rpm), part(limits.tpm), part(limits.max_concurrency))


class WorkerShareLimiter(RateLimiter):
    """An in-process limiter that enforces ``1/workers`` of each limit (see the module)."""

    def __init__(self, inner: RateLimiter, workers: int) -> None:
        if workers < 2:
            raise ValueError("a share is only needed with at least 2 workers")
        super().__init__(
            window_s=inner.window_s,
            slot_ttl_s=inner.slot_ttl_s,
            concurrency_retry_after_s=inner.concurrency_retry_after_s,
        )
        self.inner = inner
        self.workers = workers

    async def reserve(self, tenant: str, limits: Limits, tokens: int) -> Reservation:
        if limits.rpm is None and limits.tpm is None and limits.max_concurrency is None:
            return await self.inner.reserve(tenant, limits, tokens)
        try:
            return await self.inner.reserve(tenant, worker_share(limits, self.workers), tokens)
        except LimitExceeded as exc:
            raise LimitExceeded(
                exc.reason,
                exc.retry_after_s,
                f"{exc.message} (this gateway worker's share, 1/{self.workers} of the tenant's "
                "limit: the workers share no Redis)",
            ) from None

    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        await self.inner.reconcile(reservation, actual_tokens)

    async def release(self, reservation: Reservation, consumed_tokens: int = 0) -> None:
        await self.inner.release(reservation, consumed_tokens)

    async def usage(self, tenant: str) -> Usage:
        return await self.inner.usage(tenant)

    async def aclose(self) -> None:
        await self.inner.aclose()


def per_worker_limits(limiter: RateLimiter, *, workers: int, shared: bool) -> RateLimiter:
    """``limiter`` as the app should use it: unchanged when the limits are ``shared`` (Redis) or
    there is one worker, else wrapped in :class:`WorkerShareLimiter`."""
    if shared or workers < 2:
        return limiter
    log.info(
        "%d gateway workers without TIERGATE_REDIS_URL: each enforces 1/%d of every tenant "
        "limit (rounded down, at least 1); set TIERGATE_REDIS_URL for exact shared limits",
        workers,
        workers,
    )
    return WorkerShareLimiter(limiter, workers)
