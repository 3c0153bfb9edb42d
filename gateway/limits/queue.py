"""The admission queue: requests wait here, in :class:`Backlog` order, for a dispatch slot.

The queue owns a count of in-flight dispatches against ``max_in_flight`` (the router may change
it with :meth:`AdmissionQueue.set_max_in_flight` as backends come and go). A request either goes
at once (nothing queued, a slot free), or waits its turn; it leaves the queue by being granted a
slot, by its TTL running out (503 ``queue_ttl``), by being refused or displaced when the queue is
full (429 ``queue_full``), or by its caller being cancelled (client disconnect). The holder of a
slot gives it back with :meth:`AdmissionQueue.release` — or uses ``async with queue.admit(item)``,
which does both ends.

Usage::

    queue = AdmissionQueue(max_in_flight=64, max_queued=256)
    item = QueueItem(request_id, tier, priority=gain_density(weights, w, prefill_s),
                     ttl_s=tier_queue_ttl_s, aging_s=tier_ttft_slo_s)
    async with queue.admit(item):   # raises QueueRejected (429/503) instead of admitting
        ...  # dispatch to the chosen backend
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from gateway.limits.backlog import Backlog, Entry, QueueItem
from gateway.limits.base import AdmissionRejected, RejectReason

DEFAULT_RETRY_AFTER_S = 1.0


class QueueRejected(AdmissionRejected):
    """The admission queue refused, displaced or timed out a request."""


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
    ) -> None:
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._backlog = Backlog(max_queued, rescue_every=rescue_every)
        self._waiters: dict[Entry, asyncio.Future[None]] = {}
        self._retry_after_s = retry_after_s
        self._clock = clock

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

    async def wait_for_turn(self, item: QueueItem) -> None:
        """Return once ``item`` holds a dispatch slot; the caller must :meth:`release` it.

        Raises :class:`QueueRejected`: 429 ``queue_full`` when refused or displaced, 503
        ``queue_ttl`` when ``item.ttl_s`` passes first.
        """
        now = self._clock()
        self._expire(now)
        if not self._backlog and self._in_flight < self._max_in_flight:
            self._in_flight += 1
            return
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
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[entry] = future
        self._pump()
        try:
            async with asyncio.timeout(None if item.ttl_s == float("inf") else item.ttl_s):
                await future
        except TimeoutError:
            if self._granted(future):  # the slot came as the timer fired: keep it
                return
            self._forget(entry)
            raise self._ttl(item) from None
        except asyncio.CancelledError:
            if self._granted(future):
                self.release()
            self._forget(entry)
            raise

    def release(self) -> None:
        """Give back a slot taken by :meth:`wait_for_turn`; the next waiter goes."""
        if self._in_flight == 0:
            raise RuntimeError("release() without a matching wait_for_turn()")
        self._in_flight -= 1
        self._pump()

    @asynccontextmanager
    async def admit(self, item: QueueItem) -> AsyncIterator[None]:
        """Hold a dispatch slot for the body of the ``async with``."""
        await self.wait_for_turn(item)
        try:
            yield
        finally:
            self.release()

    def _pump(self) -> None:
        """Grant free slots to waiters in backlog order."""
        now = self._clock()
        self._expire(now)
        while self._in_flight < self._max_in_flight:
            entry = self._backlog.pop(now)
            if entry is None:
                return
            future = self._waiters.pop(entry)
            if future.done():  # its waiter is gone
                continue
            self._in_flight += 1
            future.set_result(None)

    def _expire(self, now: float) -> None:
        for entry in self._backlog.expire(now):
            future = self._waiters.pop(entry)
            if not future.done():
                future.set_exception(self._ttl(entry.item))

    def _forget(self, entry: Entry) -> None:
        self._backlog.remove(entry)
        self._waiters.pop(entry, None)

    @staticmethod
    def _granted(future: asyncio.Future[None]) -> bool:
        return future.done() and not future.cancelled() and future.exception() is None

    def _full(self, item: QueueItem, why: str) -> QueueRejected:
        return QueueRejected(RejectReason.QUEUE_FULL, self._retry_after_s, f"{why} ({item.tier})")

    def _ttl(self, item: QueueItem) -> QueueRejected:
        return QueueRejected(
            RejectReason.QUEUE_TTL,
            self._retry_after_s,
            f"no dispatch slot within the queue time limit of {item.ttl_s:g} s",
        )
