"""What the gateway's watchdog looks at: streams waiting on an engine, and how long.

A relayed stream past its first token registers a :class:`StreamWatch` with the backend pool
for as long as it relays. Per upstream read it stores two numbers — when it started waiting on
the engine, and (on its backend) when an event last came in — so the hot path pays two
attribute writes per read and no timer. The pool's health loop (:mod:`gateway.app.backends`)
scans the watches a few times a second and concludes:

* **a stalled stream**: waiting longer than its stall timeout (:func:`stall_timeout
  <gateway.app.deadlines.stall_timeout>`): its deadline is expired, the relay ends it with an
  error event;
* **a hung engine**: every stream on a backend waiting longer than the backend's stall
  threshold, and no event from it in that time: its breaker opens (``unresponsive``). A
  healthy engine delivers a token to every running stream at least once per step, so the
  threshold is at least ``backend_stall_min_s`` and :data:`STEP_MARGIN` times the longest step
  the engine may be running now (:meth:`BackendPool.stall_threshold
  <gateway.app.backends.BackendPool.stall_threshold>`): by its latency profile, the last
  chunk of the longest prompt this gateway has waiting there for a first token — or, when the
  last scrape showed work the gateway did not send (other gateways, other workers), of a
  prompt of :data:`EXTERNAL_PROMPT_TOKENS`.

A stream blocked writing to a slow client is not waiting on the engine (``read_since`` 0), so a
slow client never makes its backend look hung. It has a clock of its own instead: ``write_since``,
when its current write to the client began. A write that the client has not taken within
``client_write_timeout_s`` ends that stream alone — its engine request aborted, no failure
counted against the backend — so a client that stops reading holds a bounded buffer (the
upstream connection stops reading past :data:`~gateway.app.h1.PAUSE_BYTES`, the client's
transport past its high-water mark) for a bounded time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.app.backends import Backend

STEP_MARGIN = 1.5
"""A backend is hung after this many times its longest step with no event on any stream."""
EXTERNAL_PROMPT_TOKENS = 32768
"""The prompt assumed of work the gateway did not send (it cannot see its length)."""


@dataclass(eq=False, slots=True)
class StreamWatch:
    """One stream being relayed from ``backend``, as the watchdog sees it."""

    backend: Backend
    stall_s: float
    """How long it may wait on the engine for its next event."""
    write_s: float = float("inf")
    """How long one write to the client may wait for the client to take it."""
    deadline: asyncio.Timeout | None = None
    """The relay's timeout context: expired by the watchdog when the stream stalls."""
    read_since: float = 0.0
    """Monotonic time it started waiting on the engine; 0 while not waiting (writing)."""
    write_since: float = 0.0
    """Monotonic time its current write to the client began; 0 while not writing."""
    stalled: bool = False
    """Ended for the engine's silence (a backend failure)."""
    client_stalled: bool = False
    """Ended for the client's: it took nothing for ``write_s`` (not the backend's fault)."""

    def expire(self, loop_now: float, *, client: bool = False) -> None:
        """End the relay with a stall, the engine's or (``client``) the client's (from the
        event loop)."""
        deadline = self.deadline
        if deadline is None or deadline.expired() or self.stalled or self.client_stalled:
            return
        if client:
            self.client_stalled = True
        else:
            self.stalled = True
        deadline.reschedule(loop_now)


def stalled_backends(
    watches: set[StreamWatch], now: float, loop_now: float, floor_s: float
) -> dict[Backend, float]:
    """Expire stalled streams (on the engine's side or the client's); return each backend whose
    every stream waiting on it has waited more than ``floor_s``, with the shortest of those
    waits (the caller compares it with the backend's own threshold and last event before
    concluding anything). A stream writing to its client is no evidence about its backend."""
    shortest: dict[Backend, float] = {}
    for watch in watches:
        since = watch.read_since
        if not since:
            writing = watch.write_since
            if writing and now - writing > watch.write_s:
                watch.expire(loop_now, client=True)
            continue
        waited = now - since
        if waited > watch.stall_s:
            watch.expire(loop_now)
        backend = watch.backend
        previous = shortest.get(backend)
        if previous is None or waited < previous:
            shortest[backend] = waited
    return {b: w for b, w in shortest.items() if w > floor_s}
