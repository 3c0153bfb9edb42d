"""A backend's circuit breaker: when to take it out of routing, and what evidence brings it back.

Pure state, no I/O and no clock of its own (callers pass ``now``), so every transition is
tested without waiting. It opens for one of two reasons, and the reason says what closes it:

* ``unreachable`` — a liveness probe (``GET /health``) failed or timed out: the engine process
  is down or frozen. A liveness probe that succeeds again closes it: the process is back.
* ``unresponsive`` — the engine answers ``/health`` but not requests: ``threshold`` request
  failures in a row (connect errors, 5xx, broken or garbled streams, first-token and stall
  timeouts) with no success between them, or the gateway's watchdog saw every stream on it
  wait with no event (a hung engine core). ``/health`` proves nothing here; a successful
  1-token trial request, or any request succeeding, closes it.

Either way, after ``cooldown_s`` the breaker half-opens: traffic is routed to the backend
again, the first success closes it and the first failure re-opens it for another cooldown.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class OpenReason(StrEnum):
    UNREACHABLE = "unreachable"
    UNRESPONSIVE = "unresponsive"


@dataclass(slots=True)
class Breaker:
    threshold: int
    """Consecutive request failures that open the breaker."""
    cooldown_s: float
    failures: int = 0
    """Request failures since the last success."""
    reason: OpenReason | None = None
    """Why it is open; None while closed."""
    open_until: float = 0.0
    """Until when an open breaker keeps the backend out of routing (then it half-opens)."""

    @property
    def is_open(self) -> bool:
        return self.reason is not None

    def routable(self, now: float) -> bool:
        """Closed, or half-open (open but past its cooldown)."""
        return self.reason is None or now >= self.open_until

    def failure(self, now: float) -> bool:
        """A request failed here; True if that opened (or re-opened) the breaker."""
        self.failures += 1
        half_open = self.reason is not None and now >= self.open_until
        if half_open or (self.reason is None and self.failures >= self.threshold):
            return self.trip(now, self.reason or OpenReason.UNRESPONSIVE)
        return False

    def trip(self, now: float, reason: OpenReason) -> bool:
        """Open for ``reason`` (or keep open, for the stronger one); True if it was routable
        before: callers then abandon the attempts waiting on this backend."""
        was_routable = self.routable(now)
        if self.reason is not OpenReason.UNREACHABLE:  # unreachable is the stronger finding
            self.reason = reason
        self.open_until = now + self.cooldown_s
        return was_routable

    def success(self) -> bool:
        """A request (or a trial) succeeded here; True if that closed the breaker."""
        self.failures = 0
        if self.reason is None:
            return False
        self.reason = None
        self.open_until = 0.0
        return True

    def alive(self) -> bool:
        """A liveness probe succeeded: closes a breaker opened for unreachability; True if so.
        Failures are kept: an engine can answer ``/health`` and still fail every request."""
        if self.reason is not OpenReason.UNREACHABLE:
            return False
        self.reason = None
        self.open_until = 0.0
        return True


def breaker_state(breaker: Breaker, now: float) -> int:
    """``tiergate_backend_breaker_state``: 0 closed, 1 half-open, 2 open."""
    if breaker.reason is None:
        return 0
    return 1 if breaker.routable(now) else 2
