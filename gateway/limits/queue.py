"""The admission queue: requests wait here, in :class:`Backlog` order, for a dispatch slot.

The queue owns a count of in-flight dispatches against ``max_in_flight`` (the router may change
it with :meth:`AdmissionQueue.set_max_in_flight` as backends come and go). A request either goes
at once (nothing queued, a slot free), or waits its turn; it leaves the queue by being granted a
slot, by its TTL running out (503 ``queue_ttl``), by being refused or displaced when the queue is
full (429 ``queue_full``), or by its caller being cancelled (client disconnect). The holder of a
slot gives it back with :meth:`AdmissionQueue.release` — or uses ``async with queue.admit(item)``,
which does both ends.

**Ready backends.** Besides a free slot, a request may need its backends to be *ready*
(``ready(model, demoted)``, :mod:`gateway.app.shedding`): the gateway keeps the backlog here,
in gain order, rather than in the engines' queues, and best effort gets only leftover capacity.
While requests wait for that (slots free), the queue looks again every ``ready_poll_s``.

**Predicting the wait** (for SLO-aware admission, ``docs/operations/overload.md``): the queue
measures its own service rate — requests dispatched from it per second while promised requests
were waiting (:class:`ServiceRate`) — and predicts a newcomer's wait as the requests that would
go before it (higher or equal priority, plus the rescue lane's share) plus one, over that rate
(:meth:`AdmissionQueue.predicted_wait_s`). A request whose wait makes its TTFT objective
unattainable leaves early (503 ``slo_unattainable``) or is demoted (:mod:`gateway.limits.backlog`).

Usage::

    queue = AdmissionQueue(max_in_flight=64, max_queued=256)
    item = QueueItem(request_id, tier, priority=gain_density(weights, w, prefill_s),
                     ttl_s=tier_queue_ttl_s, aging_s=tier_ttft_slo_s)
    async with queue.admit(item) as grant:   # raises QueueRejected (429/503) instead
        ...  # dispatch to the chosen backend (grant.demoted: at the lowest priority)
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from gateway.limits.backlog import Backlog, Entry, QueueItem, Ready
from gateway.limits.base import AdmissionRejected, RejectReason

DEFAULT_RETRY_AFTER_S = 1.0
DEFAULT_RATE_WINDOW_S = 3.0
"""Memory of the service-rate and overtaker estimates, in seconds (of saturation, for the rate):
long enough to average a few dozen dispatches at the rates where a queue forms, short enough to
follow a backend that slows down or leaves within a few seconds."""
DEFAULT_READY_POLL_S = 0.02
"""While requests wait for ready backends with slots free, the queue looks again this often
(backends become ready as prefills end, which releases no slot)."""
MIN_RATE_OBSERVATION_S = 0.25
"""Saturated time observed before the rate is trusted; until then the wait is unknown."""


class QueueRejected(AdmissionRejected):
    """The admission queue refused, displaced or timed out a request."""


@dataclass(frozen=True, slots=True)
class Grant:
    """A dispatch slot: how long it took, and whether the request was demoted meanwhile (or
    at admission): then it goes to the engine at the lowest priority, without its SLO."""

    waited_s: float
    demoted: bool


class ServiceRate:
    """Dispatches per second while promised requests waited: the queue's service rate.

    Only saturated time counts (requests waiting): a dispatch while nobody waits says how fast
    requests arrive, not how fast they can be served. Dispatches and saturated seconds are both
    weighted by ``exp(-age / window_s)``, age counted in saturated time, and their ratio is the
    rate — an exponentially weighted average that forgets a past overload at the same pace
    whether the queue was busy or idle since.
    """

    def __init__(
        self,
        window_s: float = DEFAULT_RATE_WINDOW_S,
        min_observation_s: float = MIN_RATE_OBSERVATION_S,
    ) -> None:
        if not window_s > 0 or min_observation_s < 0:
            raise ValueError("window_s must be > 0 and min_observation_s >= 0")
        self.window_s = window_s
        self.min_observation_s = min_observation_s
        self._since: float | None = None  # start of the saturated stretch not yet folded in
        self._seconds = 0.0  # weighted saturated seconds
        self._releases = 0.0  # weighted releases in them
        self._observed = 0.0  # saturated seconds seen in all (not weighted)

    def saturated(self, now: float, busy: bool) -> None:
        """Whether requests are waiting from ``now`` on."""
        if busy and self._since is None:
            self._since = now
        elif not busy and self._since is not None:
            self._fold(now)
            self._since = None

    def served(self, now: float) -> None:
        """A waiting request was dispatched at ``now`` (counted only while saturated)."""
        if self._since is None:
            return
        self._fold(now)
        self._releases += 1.0

    def _fold(self, now: float) -> None:
        assert self._since is not None
        elapsed = max(0.0, now - self._since)
        decay = math.exp(-elapsed / self.window_s)
        self._seconds = self._seconds * decay + self.window_s * (1.0 - decay)
        self._releases *= decay
        self._observed += elapsed
        self._since = now

    def rate(self, now: float) -> float | None:
        """Dispatches per saturated second, or None until enough has been observed."""
        seconds, releases = self._seconds, self._releases
        if self._since is not None:  # the open stretch counts too, without a release yet
            elapsed = max(0.0, now - self._since)
            decay = math.exp(-elapsed / self.window_s)
            seconds = seconds * decay + self.window_s * (1.0 - decay)
            releases *= decay
            observed = self._observed + elapsed
        else:
            observed = self._observed
        if observed < self.min_observation_s or seconds <= 0.0 or releases <= 0.0:
            return None
        return releases / seconds


class Overtakers:
    """Recent promised arrivals by priority: how fast requests arrive that would overtake a
    waiting one of a given priority (a newcomer's wait grows with them, not only with the
    requests already ahead of it).

    Priorities are counted in quarter-octave buckets, so a question costs the number of
    buckets in use (tens), not the number of arrivals (thousands under overload); arrivals
    within the same bucket as the priority asked about (within ~19% of it) do not count.
    """

    BUCKETS_PER_OCTAVE = 4

    def __init__(self, window_s: float = DEFAULT_RATE_WINDOW_S) -> None:
        if not window_s > 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._arrivals: deque[tuple[float, int]] = deque()
        self._counts: Counter[int] = Counter()

    def arrived(self, now: float, priority: float) -> None:
        bucket = self._bucket(priority)
        self._arrivals.append((now, bucket))
        self._counts[bucket] += 1
        self._forget(now)

    def rate_above(self, priority: float, now: float) -> float:
        """Arrivals per second of a priority above ``priority``'s bucket, over the window."""
        self._forget(now)
        bucket = self._bucket(priority)
        return sum(n for b, n in self._counts.items() if b > bucket) / self.window_s

    @classmethod
    def _bucket(cls, priority: float) -> int:
        if priority <= 0.0:  # below every gain density
            return -(1 << 30)
        return math.floor(math.log2(priority) * cls.BUCKETS_PER_OCTAVE)

    def _forget(self, now: float) -> None:
        horizon = now - self.window_s
        while self._arrivals and self._arrivals[0][0] < horizon:
            _, bucket = self._arrivals.popleft()
            self._counts[bucket] -= 1
            if not self._counts[bucket]:
                del self._counts[bucket]


class AdmissionQueue:
    """Bounded, gain-ordered wait for a dispatch slot, with a rescue lane against starvation.

    ``clock`` orders and ages the queue (injectable for tests); each waiter's TTL timer runs on
    the event loop, and a waiter found past its TTL (by ``clock``) at dispatch time is dropped
    too, so with the default monotonic clock both agree.
    """

    def __init__(
        self,
        *,
        max_in_flight: int,
        max_queued: int,
        rescue_every: int | None = 4,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        service_rate: ServiceRate | None = None,
        ready: Ready | None = None,
        ready_poll_s: float = DEFAULT_READY_POLL_S,
    ) -> None:
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._backlog = Backlog(max_queued, rescue_every=rescue_every)
        self._waiters: dict[Entry, asyncio.Future[bool]] = {}
        self._retry_after_s = retry_after_s
        self._clock = clock
        self.service_rate = service_rate if service_rate is not None else ServiceRate()
        self.overtakers = Overtakers()
        self._ready = ready
        self._ready_poll_s = ready_poll_s
        self._repump: asyncio.Handle | None = None
        self._repump_due = 0.0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def queued(self) -> int:
        return len(self._backlog)

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def rescued(self) -> int:
        """How many dispatches the rescue lane made (a starvation-pressure metric)."""
        return self._backlog.rescued

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change the dispatch capacity; waiting requests go at once if it grew."""
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self._max_in_flight = max_in_flight
        self._pump()

    # ---- predictions ------------------------------------------------------------------------

    def predicted_wait_s(self, priority: float, model: str = "") -> float | None:
        """How long a new, not demoted request of ``priority`` for ``model`` would wait: 0 if it
        would go at once, else the requests going before it (gain order, plus the rescue lane's
        share while any is overdue) and itself, over what the measured service rate leaves once
        higher-priority arrivals are served (``inf`` if nothing); None while the rate is
        unknown (no saturation observed yet)."""
        now = self._clock()
        if self._in_flight < self._max_in_flight and (
            self._ready is None or self._ready(model, False)
        ):
            return 0.0
        rate = self.service_rate.rate(now)
        if rate is None:
            return None
        ahead = self._backlog.ahead_of(priority, now)
        every = self._backlog.rescue_every
        if every is not None and every > 1:
            overdue = self._backlog.overdue(now)
            ahead += min(overdue, math.ceil((ahead + 1) / (every - 1)))
        elif every == 1:
            ahead += self._backlog.overdue(now)
        # requests of higher priority arriving meanwhile go first too: what is left of the
        # service rate for this priority is the rate less theirs (a priority queue's wait)
        left = rate - self.overtakers.rate_above(priority, now)
        return (ahead + 1) / left if left > 0 else math.inf

    def measured_rate(self) -> float | None:
        """The service rate now (dispatches per saturated second), None until measured."""
        return self.service_rate.rate(self._clock())

    def drain_time_s(self) -> float | None:
        """How long the queue as it is now takes to be served (None while the rate is unknown):
        the retry hint of a refusal that waiting can cure."""
        now = self._clock()
        rate = self.service_rate.rate(now)
        if rate is None:
            return None
        return self._backlog.live(now) / rate

    # ---- waiting ----------------------------------------------------------------------------

    async def wait_for_turn(self, item: QueueItem) -> Grant:
        """Return once ``item`` holds a dispatch slot; the caller must :meth:`release` it.

        Raises :class:`QueueRejected`: 429 ``queue_full`` when refused or displaced, 503
        ``queue_ttl`` when ``item.ttl_s`` passes first, 503 ``slo_unattainable`` when
        ``item.slo_wait_s`` does (a demotable item is demoted then instead).
        """
        now = self._clock()
        self._expire(now)
        demoted = item.demotable and item.slo_wait_s <= 0.0
        if not demoted:
            self.overtakers.arrived(now, item.priority)
        if (
            not self._backlog
            and self._in_flight < self._max_in_flight
            and (self._ready is None or self._ready(item.model, demoted))
        ):
            self._in_flight += 1
            return Grant(0.0, demoted)
        pushed = self._backlog.push(item, now)
        if pushed.queued is None:
            raise self._full(item, "the admission queue is full of higher-priority requests")
        entry = pushed.queued
        if pushed.evicted is not None:
            displaced = self._waiters.pop(pushed.evicted)
            if not displaced.done():
                displaced.set_exception(
                    self._full(pushed.evicted.item, "displaced from the full admission queue")
                )
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters[entry] = future
        self._pump()
        limit = entry.expires_at_s - entry.enqueued_s
        try:
            async with asyncio.timeout(None if limit == math.inf else limit):
                demoted = await future
        except TimeoutError:
            if self._granted(future):  # the slot came as the timer fired: keep it
                return Grant(self._clock() - now, future.result())
            self._forget(entry)
            raise self._expired(entry) from None
        except asyncio.CancelledError:
            if self._granted(future):
                self.release()
            self._forget(entry)
            raise
        return Grant(self._clock() - now, demoted)

    def release(self) -> None:
        """Give back a slot taken by :meth:`wait_for_turn`; the next waiter goes."""
        if self._in_flight == 0:
            raise RuntimeError("release() without a matching wait_for_turn()")
        self._in_flight -= 1
        self._pump()

    @asynccontextmanager
    async def admit(self, item: QueueItem) -> AsyncIterator[Grant]:
        """Hold a dispatch slot for the body of the ``async with``."""
        grant = await self.wait_for_turn(item)
        try:
            yield grant
        finally:
            self.release()

    def _pump(self) -> None:
        """Grant free slots to waiters in backlog order.

        With ``ready``, at most one request per model per pump: the backends' state that
        ``ready`` reads changes only once the granted request has been dispatched, which its
        waiter does as soon as it runs — so the queue looks again right after it has."""
        now = self._clock()
        self._expire(now)
        if not self._backlog:  # nobody waits (most releases): nothing to grant or schedule
            return
        granted: set[str] = set()
        ready = self._ready
        gate: Ready | None = None
        if ready is not None:

            def gate(model: str, demoted: bool) -> bool:
                return model not in granted and ready(model, demoted)

        while self._in_flight < self._max_in_flight:
            entry = self._backlog.pop(now, gate)
            if entry is None:
                break
            future = self._waiters.pop(entry)
            if future.done():  # its waiter is gone
                continue
            self._in_flight += 1
            self.service_rate.served(now)
            future.set_result(entry.demoted(now))
            granted.add(entry.item.model)
        self._note_saturation(now)
        if self._backlog and self._in_flight < self._max_in_flight:
            # waiting for ready backends: look again once the granted ones are dispatched, or
            # soon (backends become ready as prefills end, which releases no slot)
            self._schedule_repump(0.0 if granted and ready is not None else self._ready_poll_s)

    def _note_saturation(self, now: float) -> None:
        """Promised requests wait (for a slot, or for ready backends): the service rate's
        clock runs. Best effort alone waiting is no saturation: it waits for leftovers."""
        self.service_rate.saturated(now, self._backlog.promised(now))

    def _schedule_repump(self, delay_s: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the event loop: the next event pumps
            return
        due = loop.time() + delay_s
        if self._repump is not None:
            if self._repump_due <= due:
                return
            self._repump.cancel()

        def repump() -> None:
            self._repump = None
            self._pump()

        self._repump_due = due
        self._repump = loop.call_later(delay_s, repump) if delay_s > 0 else loop.call_soon(repump)

    def _expire(self, now: float) -> None:
        for entry in self._backlog.expire(now):
            future = self._waiters.pop(entry)
            if not future.done():
                future.set_exception(self._expired(entry))
        self._note_saturation(now)

    def _forget(self, entry: Entry) -> None:
        self._backlog.remove(entry)
        self._waiters.pop(entry, None)
        self._note_saturation(self._clock())

    @staticmethod
    def _granted(future: asyncio.Future[bool]) -> bool:
        return future.done() and not future.cancelled() and future.exception() is None

    def _full(self, item: QueueItem, why: str) -> QueueRejected:
        return QueueRejected(RejectReason.QUEUE_FULL, self._retry_after_s, f"{why} ({item.tier})")

    def _expired(self, entry: Entry) -> QueueRejected:
        item = entry.item
        if entry.slo_expired:
            drain = self.drain_time_s()
            return QueueRejected(
                RejectReason.SLO_UNATTAINABLE,
                max(self._retry_after_s, drain) if drain is not None else self._retry_after_s,
                f"waited {item.slo_wait_s:.3g} s for a dispatch slot: the first token can no "
                f"longer meet the TTFT objective of tier {item.tier!r}",
            )
        return QueueRejected(
            RejectReason.QUEUE_TTL,
            self._retry_after_s,
            f"no dispatch slot within the queue time limit of {item.ttl_s:g} s",
        )
