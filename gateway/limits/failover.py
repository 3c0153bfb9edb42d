"""Shared limits that survive Redis going away: degraded per-process limits, then recovery.

Redis holds the exact, fleet-wide sliding logs (:mod:`gateway.limits.redis`). When it cannot be
reached, refusing every limited request (fail closed) would turn a cache outage into a full
outage for paying tenants, and admitting everything (fail open) would let any tenant past its
limits. So the limiter *degrades*: each gateway process enforces its **share** of every limit —
``limit // share``, ``share`` being the number of gateway processes (workers × replicas) — in
process, so that the fleet together stays within the global limit. ``docs/operations/
redis-outage.md`` gives the reasoning and the bounds.

The pieces:

- **Unlimited tenants never touch Redis**: nothing to count, so no round trip and no failure.
- **A mirror**: every admission Redis grants is also logged in an
  :class:`~gateway.limits.memory.InMemoryRateLimiter` of this process. In degraded mode that log
  is what the share is checked against, so a process that admitted its share just before the
  outage cannot admit it again.
- **Trip at once, probe with backoff**: the first failed call (bounded by short socket
  timeouts) switches to degraded mode; a background task pings Redis with exponential backoff
  and switches back once it answers — no request waits on a dead Redis after the first.
- **A fleet budget**: each tenant's window as Redis last showed it (requests and tokens) is
  kept; until it has passed, a process in degraded mode admits at most ``1/share`` of what was
  left of the limit then, so imbalance before the outage cannot add up to more than the limit.
- **Settling**: once Redis answers, a process re-seeds it and stays degraded ``settle_s`` more
  (twice the longest probe period), so every other process has re-seeded its part before any
  admits from Redis again.
- **Re-seeding**: on recovery, and whenever Redis shows an empty window for a tenant this process
  admitted requests for within the window (Redis restarted without persistence) or its
  ``run_id`` changed, each process writes its own entries of the window and its held slots back.
  Entries carry unique ids, so re-seeding is idempotent and the processes' entries add up to the
  window Redis lost, plus what was admitted in degraded mode.
- **Leases with a heartbeat**: a concurrency slot is a short lease (``slot_ttl_s``, 30 s by
  default) that the same task renews every ``renew_every_s`` while the request runs, so a process
  that dies leaks its slots for seconds, not for the longest request. A release Redis did not
  get is queued and replayed when it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.limits.base import (
    DEFAULT_SLOT_TTL_S,
    LimitExceeded,
    Limits,
    RateLimiter,
    RejectReason,
    Reservation,
    Usage,
    check_tokens,
    too_large_for_tpm,
)
from gateway.limits.memory import InMemoryRateLimiter
from gateway.limits.redis import RedisRateLimiter, WindowLost

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 30.0
"""Redis lease of a concurrency slot, renewed every third of it while the request runs."""
CHECK_EVERY_S = 1.0
"""While Redis answers: how often the background task checks it (one INFO), so that an idle
process notices an outage or a restart within this."""
PROBE_MIN_S = 0.25
PROBE_MAX_S = 2.0
MAX_PENDING = 10_000
"""Releases kept for Redis while it is away; past this the oldest are dropped (their leases
expire by themselves within ``slot_ttl_s``)."""

MODE_REDIS = "redis"
MODE_DEGRADED = "degraded-local"


def share_of_rest(limit: int, used: int, share: int) -> int:
    """What one of ``share`` processes may take, while Redis is away, of what Redis last showed
    left of ``limit`` (``used`` taken): rounded down, so the processes' parts together never
    exceed what was left. The one share rule of the rate limits and the spend budgets."""
    return max(0, limit - used) // share


class RedisSwitch:
    """One process's use of Redis: ``redis`` or ``degraded-local``, and the task between them.

    What both the rate limits and the spend budgets need when Redis goes away, so they behave
    alike: the first failed call trips to degraded mode (logged once, ``on_change``); a
    background task then probes with backoff from ``probe_min_s`` to ``probe_max_s``, each
    probe calling ``recover`` (write back what this process counted while degraded; it
    returns the end of the log line of the switch back). Once ``recover`` succeeds the switch
    stays degraded ``settle_s`` more (probing again), so every other process has written its
    part back before any trusts Redis again, then switches back (logged once,
    ``on_change``). While Redis answers, the task calls ``heartbeat`` every ``check_every_s``
    (or when :meth:`wake` is called): a fault there
    trips too, so an idle process notices an outage.
    """

    def __init__(
        self,
        what: str,
        detail: str,
        *,
        recover: Callable[[], Awaitable[str]],
        heartbeat: Callable[[], Awaitable[None]] | None = None,
        check_every_s: float = CHECK_EVERY_S,
        probe_min_s: float = PROBE_MIN_S,
        probe_max_s: float = PROBE_MAX_S,
        settle_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
        on_trip: Callable[[], None] | None = None,
    ) -> None:
        self.what = what
        """What degrades, in the log line of a trip (``Redis limits``)."""
        self.detail = detail
        """What this process does meanwhile, the end of that line."""
        self._recover = recover
        self._heartbeat = heartbeat
        self.check_every_s = check_every_s
        self.probe_min_s = probe_min_s
        self.probe_max_s = probe_max_s
        self.settle_s = 2 * probe_max_s if settle_s is None else settle_s
        self.on_change = on_change
        self._on_trip = on_trip
        self.fallbacks = 0
        """How many times Redis was lost (switches to degraded mode)."""
        self._clock = clock
        self.degraded = False
        self._answering_since: float | None = None  # Redis answers again since (settling)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def mode(self) -> str:
        return MODE_DEGRADED if self.degraded else MODE_REDIS

    def trip(self, error: BaseException) -> None:
        """Switch to degraded mode (once per outage)."""
        self.ensure_task()
        if self.degraded:
            return
        self.degraded = True
        self._answering_since = None
        self.fallbacks += 1
        if self._on_trip is not None:
            self._on_trip()
        log.warning("%s unavailable (%s): %s", self.what, type(error).__name__, self.detail)
        if self.on_change is not None:
            self.on_change(True)
        self._wake.set()

    def wake(self) -> None:
        """Run the heartbeat now rather than at its next tick."""
        self._wake.set()

    def ensure_task(self) -> None:
        if (self._task is None or self._task.done()) and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._maintain())

    async def probe(self) -> bool:
        """``recover`` and switch back if Redis answers and settling is over; False (still
        degraded) otherwise. What the background task does while degraded (tests call it)."""
        if not self.degraded:
            return True
        try:
            done = await self._recover()
        except Exception as error:
            self._answering_since = None
            log.debug("%s still unavailable: %s", self.what, type(error).__name__)
            return False
        now = self._clock()
        if self._answering_since is None:
            self._answering_since = now
        if now - self._answering_since < self.settle_s:
            return False  # the other processes may not have written their part back yet
        self._answering_since = None
        self.degraded = False
        log.warning("Redis answers again: %s", done)
        if self.on_change is not None:
            self.on_change(False)
        return True

    async def _maintain(self) -> None:
        delay = self.probe_min_s
        while not self._closed:
            if self.degraded:
                await asyncio.sleep(delay)
                recovered = await self.probe()
                delay = self.probe_min_s if recovered else min(delay * 2, self.probe_max_s)
                if self._answering_since is not None:  # settling: switch back when it ends
                    ends = self._answering_since + self.settle_s - self._clock()
                    delay = max(self.probe_min_s, ends)
                continue
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # arrives as the event is set, and aclose would wait for this task forever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.check_every_s):
                    await self._wake.wait()
            self._wake.clear()
            if self.degraded or self._heartbeat is None:
                continue
            try:
                await self._heartbeat()
            except Exception as error:
                self.trip(error)

    async def aclose(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None


def _unlimited(limits: Limits) -> bool:
    return limits.rpm is None and limits.tpm is None and limits.max_concurrency is None


class FailoverRateLimiter(RateLimiter):
    """Redis limits with a per-process fallback at ``1/share`` of each limit while Redis is away.

    ``on_change(degraded)`` is called on every switch (metrics). ``reserve`` raises only
    :class:`LimitExceeded` (and ``ValueError`` for negative counts); ``reconcile`` only
    ``ValueError``: a Redis fault never reaches the request.
    """

    def __init__(
        self,
        shared: RedisRateLimiter,
        *,
        share: int = 1,
        renew_every_s: float | None = None,
        check_every_s: float = CHECK_EVERY_S,
        probe_min_s: float = PROBE_MIN_S,
        probe_max_s: float = PROBE_MAX_S,
        settle_s: float | None = None,
        local_slot_ttl_s: float = DEFAULT_SLOT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__(
            window_s=shared.window_s,
            slot_ttl_s=shared.slot_ttl_s,
            concurrency_retry_after_s=shared.concurrency_retry_after_s,
        )
        if share < 1:
            raise ValueError(f"share must be at least 1, got {share!r}")
        self.shared = shared
        self.share = share
        self.local = InMemoryRateLimiter(
            clock=clock,
            window_s=shared.window_s,
            slot_ttl_s=local_slot_ttl_s,
            concurrency_retry_after_s=shared.concurrency_retry_after_s,
        )
        self.renew_every_s = renew_every_s if renew_every_s is not None else self.slot_ttl_s / 3
        self.check_every_s = check_every_s
        self._renewed_at = clock()
        self._clock = clock
        self._local_admissions = 0  # reservations taken in degraded mode (recovery re-checks)
        self._pending: OrderedDict[str, tuple[str, int]] = OrderedDict()  # id -> tenant, tokens
        self._deciding: dict[str, int] = {}  # tenant -> Redis reserve calls under way
        self._seen: dict[str, tuple[int, int, float]] = {}  # tenant -> Redis window, when seen
        self._since_trip: dict[str, list[int]] = {}  # tenant -> [requests, tokens] degraded
        self._reseed_needed = False
        self._run_id: str | None = None
        self.switch = RedisSwitch(
            "Redis limits",
            f"enforcing 1/{share} of each limit in this process until Redis answers",
            recover=self._recover,
            heartbeat=self._tick,
            check_every_s=min(check_every_s, self.renew_every_s),
            probe_min_s=probe_min_s,
            probe_max_s=probe_max_s,
            settle_s=settle_s,
            clock=clock,
            on_change=on_change,
            on_trip=self._since_trip.clear,
        )
        """Redis or degraded, and the task that probes (shared with the spend budgets)."""

    # ---- state --------------------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        return self.switch.degraded

    @property
    def mode(self) -> str:
        return self.switch.mode

    @property
    def fallbacks(self) -> int:
        """How many times Redis was lost (switches to degraded mode)."""
        return self.switch.fallbacks

    @property
    def settle_s(self) -> float:
        return self.switch.settle_s

    @property
    def probe_max_s(self) -> float:
        return self.switch.probe_max_s

    @property
    def on_change(self) -> Callable[[bool], None] | None:
        """Called with True on a switch to degraded mode, False on the way back (metrics)."""
        return self.switch.on_change

    @on_change.setter
    def on_change(self, callback: Callable[[bool], None] | None) -> None:
        self.switch.on_change = callback

    def _trip(self, error: BaseException) -> None:
        """Switch to degraded mode (once per outage) and let the background task probe."""
        self.switch.trip(error)

    # ---- the contract -------------------------------------------------------------------

    async def reserve(self, tenant: str, limits: Limits, tokens: int) -> Reservation:
        check_tokens(tokens)
        if _unlimited(limits):  # nothing to count: no round trip, nothing that can fail
            now = self._clock()
            return Reservation(uuid.uuid4().hex, tenant, tokens, now, math.inf, held=False)
        if limits.tpm is not None and tokens > limits.tpm:
            raise too_large_for_tpm(tokens, limits.tpm)
        self.switch.ensure_task()
        # One id whichever store admits it: a call that timed out may still run in Redis later
        # (a frozen server resumes its queue); re-seeding then merges it with the local one.
        rid = uuid.uuid4().hex
        if not self.degraded:
            self._deciding[tenant] = self._deciding.get(tenant, 0) + 1
            try:
                reservation = await self._reserve_shared(tenant, limits, tokens, rid)
            except LimitExceeded:
                self._saw_window(tenant)
                raise
            except Exception as error:  # any Redis fault: serve this one locally, trip
                self._trip(error)
            else:
                self._saw_window(tenant)
                self.local.record(tenant, reservation.reservation_id, tokens)
                return reservation
            finally:
                left = self._deciding[tenant] - 1
                if left:
                    self._deciding[tenant] = left
                else:
                    del self._deciding[tenant]
            try:
                return await self._reserve_local(tenant, limits, tokens, rid)
            except LimitExceeded:  # free the slot that call may yet take in Redis
                self._queue_release(Reservation(rid, tenant, 0, 0.0, 0.0), 0)
                raise
        return await self._reserve_local(tenant, limits, tokens, rid)

    async def _reserve_shared(
        self, tenant: str, limits: Limits, tokens: int, rid: str
    ) -> Reservation:
        recent = self.local.recent(tenant)
        try:
            return await self.shared.reserve(
                tenant, limits, tokens, recent=recent, reservation_id=rid
            )
        except WindowLost:
            pass
        log.warning("Redis lost a tenant's window (restarted empty?): re-seeding it")
        await self.shared.reseed(tenant, self.local.snapshot(tenant).get(tenant, []))
        self._reseed_needed = True  # the other tenants' windows are gone too
        self.switch.wake()
        return await self.shared.reserve(tenant, limits, tokens, reservation_id=rid)

    def _saw_window(self, tenant: str) -> None:
        seen = self.shared.last_window.get(tenant)
        if seen is not None:
            self._seen[tenant] = (*seen, self._clock())

    async def _reserve_local(
        self, tenant: str, limits: Limits, tokens: int, rid: str
    ) -> Reservation:
        share = self._share_of(limits, tokens)
        deciding = self._deciding.get(tenant, 0)
        if deciding:  # calls sent before the trip may still be admitted by Redis: count them
            share = self._less(share, deciding)
        self._check_fleet_budget(tenant, limits, tokens)
        try:
            reservation = await self.local.reserve(tenant, share, tokens, reservation_id=rid)
        except LimitExceeded as exc:
            raise LimitExceeded(
                exc.reason,
                exc.retry_after_s,
                f"{exc.message} (this gateway process's share, 1/{self.share} of the tenant's "
                "limit, while shared limits are briefly unavailable)",
            ) from None
        self._local_admissions += 1
        taken = self._since_trip.setdefault(tenant, [0, 0])
        taken[0] += 1
        taken[1] += tokens
        return reservation

    def _check_fleet_budget(self, tenant: str, limits: Limits, tokens: int) -> None:
        """What the fleet had left when this process last saw the tenant's window in Redis, split
        ``share`` ways, caps this process's degraded admissions until that window has passed.

        The share alone is checked against this process's own log; a process that admitted
        more than its share through Redis just before the outage would leave the others free to
        add theirs, and a minute could see up to twice the limit. With the budget, the window
        Redis last showed plus every process's part of what was left stays within the limit.
        """
        seen = self._seen.get(tenant)
        if seen is None:
            return
        requests, used_tokens, seen_at = seen
        left_s = seen_at + self.window_s - self._clock()
        if left_s <= 0:  # everything Redis counted then has left the window
            return
        taken = self._since_trip.get(tenant, (0, 0))
        checks = (
            (limits.rpm, requests, taken[0] + 1, RejectReason.RATE_LIMIT_RPM),
            (limits.tpm, used_tokens, taken[1] + tokens, RejectReason.RATE_LIMIT_TPM),
        )
        for limit, used, wanted, reason in checks:
            if limit is not None and wanted > share_of_rest(limit, used, self.share):
                raise LimitExceeded(
                    reason,
                    left_s,
                    f"rate limit reached: while shared limits are briefly unavailable this "
                    f"gateway process may use 1/{self.share} of what the tenant had left of "
                    f"its limit of {limit}",
                )

    def _share_of(self, limits: Limits, tokens: int) -> Limits:
        """Each limit divided by ``share``, rounded down so the fleet stays within the limit.

        A share that rounds to 0 (a limit smaller than the number of processes), or a request
        larger than this process's TPM share, is refused with a retry-after of a probe period:
        it fits again once Redis is back.
        """
        parts: dict[str, int | None] = {}
        reasons = {
            "rpm": RejectReason.RATE_LIMIT_RPM,
            "tpm": RejectReason.RATE_LIMIT_TPM,
            "max_concurrency": RejectReason.CONCURRENCY,
        }
        for name, reason in reasons.items():
            value = getattr(limits, name)
            part = None if value is None else value // self.share
            if part == 0 or (name == "tpm" and part is not None and tokens > part):
                raise LimitExceeded(
                    reason,
                    self.probe_max_s,
                    f"shared rate limits are briefly unavailable; this gateway process may use "
                    f"1/{self.share} of the tenant's {name} limit of {value} until they return",
                )
            parts[name] = part
        return Limits(**parts)

    def _less(self, share: Limits, deciding: int) -> Limits:
        """``share`` less ``deciding`` requests whose Redis call is still out (a trip during a
        burst: those may yet be admitted and mirrored, and must not be admitted twice)."""
        rpm = None if share.rpm is None else share.rpm - deciding
        conc = None if share.max_concurrency is None else share.max_concurrency - deciding
        for value, reason in (
            (rpm, RejectReason.RATE_LIMIT_RPM),
            (conc, RejectReason.CONCURRENCY),
        ):
            if value is not None and value < 1:
                raise LimitExceeded(
                    reason,
                    self.concurrency_retry_after_s,
                    "rate limit reached: this gateway process's share is taken by requests "
                    "still being admitted",
                )
        return Limits(rpm, share.tpm, conc)

    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        check_tokens(actual_tokens)
        if not reservation.held:
            return
        await self.local.reconcile(reservation, actual_tokens)
        if self.degraded:
            self._queue_release(reservation, actual_tokens)
            return
        try:
            await self.shared.reconcile(reservation, actual_tokens)
        except Exception as error:
            self._queue_release(reservation, actual_tokens)
            self._trip(error)

    def _queue_release(self, reservation: Reservation, tokens: int) -> None:
        self._pending[reservation.reservation_id] = (reservation.tenant, tokens)
        self._pending.move_to_end(reservation.reservation_id)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)

    async def usage(self, tenant: str) -> Usage:
        if not self.degraded:
            try:
                return await self.shared.usage(tenant)
            except Exception as error:
                self._trip(error)
        return await self.local.usage(tenant)

    async def aclose(self) -> None:
        await self.switch.aclose()
        await self.shared.aclose()

    # ---- the background task: heartbeat while healthy, probe while degraded -------------

    async def _tick(self) -> None:
        """The switch's heartbeat: leases only every ``renew_every_s``."""
        now = self._clock()
        renew = now - self._renewed_at >= self.renew_every_s
        await self.heartbeat(renew=renew)
        if renew:
            self._renewed_at = now

    async def heartbeat(self, *, renew: bool = True) -> None:
        """Notice a lost or restarted Redis, renew held leases, replay queued releases.

        What the background task does every ``check_every_s`` while Redis answers (leases only
        every ``renew_every_s``); tests call it directly. A Redis fault propagates (the task
        trips to degraded mode): so a process with no traffic learns of an outage, and
        readiness says so, within ``check_every_s``.
        """
        run_id = await self.shared.server_id()
        if self._run_id and run_id and run_id != self._run_id:
            log.warning("Redis restarted (new run id): re-seeding this process's windows")
            self._reseed_needed = True
        self._run_id = run_id
        if self._reseed_needed:
            self._reseed_needed = False
            await self._reseed_all()
        if renew:
            for tenant, ids in self.local.held_slots().items():
                await self.shared.renew(tenant, ids)
        await self._flush_pending()

    async def probe(self) -> bool:
        """Re-seed Redis and switch back if it answers; False (still degraded) if not.

        What the background task does while degraded (tests call it directly).
        """
        return await self.switch.probe()

    async def _recover(self) -> str:
        """Re-seed Redis with this process's windows and replay the releases it missed."""
        await self.shared.ping()
        self._run_id = await self.shared.server_id()
        added = 0
        for _ in range(3):  # until no degraded admission slipped in while we re-seeded
            seen = self._local_admissions
            added += await self._reseed_all()
            await self._flush_pending()
            if seen == self._local_admissions:
                break
        self._reseed_needed = False
        return f"shared limits restored ({added} entries re-seeded)"

    async def _reseed_all(self) -> int:
        added = 0
        for tenant, entries in self.local.snapshot().items():
            added += await self.shared.reseed(tenant, entries)
        return added

    async def _flush_pending(self) -> None:
        while self._pending:
            rid, (tenant, tokens) = next(iter(self._pending.items()))
            stub = Reservation(rid, tenant, tokens, 0.0, 0.0)
            await self.shared.reconcile(stub, tokens)
            self._pending.pop(rid, None)


def make_rate_limiter(
    redis_url: str | None,
    *,
    share: int = 1,
    on_change: Callable[[bool], None] | None = None,
    timeout_s: float | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    **options: Any,
) -> RateLimiter:
    """Redis-backed limits with a degraded mode when ``redis_url`` is set, else in-process.

    ``share``: gateway processes sharing the Redis limits (each enforces ``1/share`` of a limit
    while Redis is away); ``lease_s``: the Redis concurrency lease, renewed every third of it.
    ``options`` go to the limiter (``window_s``, ``prefix`` for Redis, ...).
    """
    if redis_url:
        url_options: dict[str, Any] = {} if timeout_s is None else {"timeout_s": timeout_s}
        shared = RedisRateLimiter.from_url(redis_url, slot_ttl_s=lease_s, **url_options, **options)
        return FailoverRateLimiter(shared, share=share, on_change=on_change)
    options.pop("prefix", None)
    return InMemoryRateLimiter(**options)
