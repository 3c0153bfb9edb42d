"""The admission queue's policy — which waiting request goes next, and which one a full queue
drops — as a plain data structure with time passed in, so it can be reasoned about and tested
without an event loop. :mod:`gateway.limits.queue` puts the waiting and the capacity around it.

**Order: gain first, with a rescue lane.** Requests go by *priority* (a float the router computes,
normally :func:`gain_density`: first-token gain per unit of prefill work — the most gain the
gateway can buy with the next unit of engine time). Pure gain order starves low tiers under
sustained overload, so every request also carries ``aging_s`` (its tier's TTFT SLO is the natural
value): once it has waited that long it is *overdue*, and while any request is overdue, at least
one dispatch in every ``rescue_every`` goes to the request that became overdue first.

Why a rescue lane rather than priority that grows with waiting time: under sustained overload an
aging term ends up reordering the whole queue by age (everything ages), so gain order — the point
of the queue — is lost exactly when it matters, and how long a low tier waits depends on the ratio
of the tiers' priorities. The lane keeps at least ``(rescue_every - 1) / rescue_every`` of
dispatches in gain order and gives a bound that depends on configuration only:

    a request that is overdue at time T is dispatched within ``rescue_every * max_size``
    dispatches after T, unless its TTL runs out or a full queue evicts it first,

because only requests already queued at T can be overdue before it (a later arrival becomes
overdue after T), there are at most ``max_size - 1`` of them, and each rescue serves one.

**Bounded size: longest-tier drop.** When the queue is full a newcomer whose tier holds fewer
places than the longest tier takes the place of that tier's lowest-priority request; otherwise it
competes within its own tier — it replaces its tier's lowest-priority request if it has strictly
higher priority, and is refused if not. (Ties go to the request already waiting; among equal
priorities the newest is dropped.) Dropping the *globally* lowest request instead would let a
flood of high-gain requests keep every low-tier request out of the queue, which no dispatch order
can repair; longest-queue drop is the classic fair way to share a buffer: every active tier keeps
about ``max_size / tiers`` places.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from priority.gain import GainWeights


def gain_density(weights: GainWeights, tier_weight: float, prefill_cost: float) -> float:
    """First-token gain per unit of prefill work: the natural queue priority.

    ``prefill_cost`` is the estimated prefill time (seconds, from the router's estimator) or the
    prompt length — any unit, as long as one gateway uses one unit for every request.
    """
    return weights.token_value(tier_weight, 1) / max(prefill_cost, 1e-9)


@dataclass(frozen=True, slots=True)
class QueueItem:
    """A request asking to be dispatched.

    ``priority``: larger goes first (see :func:`gain_density`). ``ttl_s``: longest it may wait
    (then 503 ``queue_ttl``; may be ``inf``). ``aging_s``: wait after which it is overdue and
    owed a rescue slot (its tier's TTFT SLO).
    """

    request_id: str
    tier: str
    priority: float
    ttl_s: float
    aging_s: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.priority):
            raise ValueError(f"priority must be finite, got {self.priority!r}")
        if not self.ttl_s > 0 or not (self.aging_s > 0 and math.isfinite(self.aging_s)):
            raise ValueError("ttl_s must be > 0 and aging_s positive and finite")


@dataclass(slots=True, eq=False)
class Entry:
    """A queued item and when it joined (identity-hashed: one entry per wait)."""

    item: QueueItem
    enqueued_s: float
    seq: int

    @property
    def overdue_at_s(self) -> float:
        return self.enqueued_s + self.item.aging_s

    @property
    def expires_at_s(self) -> float:
        return self.enqueued_s + self.item.ttl_s


@dataclass(frozen=True, slots=True)
class PushResult:
    """``queued`` is the new entry (``None`` if refused); ``evicted`` the entry it displaced."""

    queued: Entry | None
    evicted: Entry | None = None


@dataclass(slots=True)
class Backlog:
    """Bounded, gain-ordered backlog with a rescue lane (see the module docstring).

    Operations scan the entries (O(size)); a gateway's queue holds hundreds, not millions.
    ``rescue_every=None`` disables the rescue lane (pure gain order, for comparison).
    """

    max_size: int
    rescue_every: int | None = 4
    entries: list[Entry] = field(default_factory=list)
    rescued: int = 0  # dispatches made by the rescue lane
    _seq: int = 0
    _since_rescue: int = 0  # gain-order dispatches since the last rescue, while any was overdue

    def __post_init__(self) -> None:
        if self.max_size < 1:
            raise ValueError("max_size must be >= 1")
        if self.rescue_every is not None and self.rescue_every < 1:
            raise ValueError("rescue_every must be >= 1 or None")

    def __len__(self) -> int:
        return len(self.entries)

    def push(self, item: QueueItem, now: float) -> PushResult:
        entry = Entry(item, now, self._seq)
        self._seq += 1
        if len(self.entries) < self.max_size:
            self.entries.append(entry)
            return PushResult(entry)
        occupancy = Counter(e.item.tier for e in self.entries)
        longest = max(occupancy.values())
        own = occupancy[item.tier]
        if own < longest:
            tier = min((t for t, n in occupancy.items() if n == longest), key=self._min_priority)
        else:
            tier = item.tier
        victim = min(
            (e for e in self.entries if e.item.tier == tier),
            key=lambda e: (e.item.priority, -e.seq),
        )
        if tier == item.tier and item.priority <= victim.item.priority:
            return PushResult(None)
        self.entries.remove(victim)
        self.entries.append(entry)
        return PushResult(entry, victim)

    def _min_priority(self, tier: str) -> float:
        return min(e.item.priority for e in self.entries if e.item.tier == tier)

    def pop(self, now: float) -> Entry | None:
        """Remove and return the next entry to dispatch (expired entries are never returned)."""
        live = [e for e in self.entries if e.expires_at_s > now]
        if not live:
            return None
        overdue = [e for e in live if e.overdue_at_s <= now]
        rescue_due = self.rescue_every is not None and self._since_rescue >= self.rescue_every - 1
        if overdue and rescue_due:
            chosen = min(overdue, key=lambda e: (e.overdue_at_s, e.seq))
            self._since_rescue = 0
            self.rescued += 1
        else:
            chosen = max(live, key=lambda e: (e.item.priority, -e.seq))
            if overdue:
                self._since_rescue += 1
        self.entries.remove(chosen)
        return chosen

    def remove(self, entry: Entry) -> bool:
        """Take ``entry`` out (its waiter left); False if it was no longer queued."""
        try:
            self.entries.remove(entry)
        except ValueError:
            return False
        return True

    def expire(self, now: float) -> list[Entry]:
        """Remove and return the entries whose TTL has run out."""
        expired = [e for e in self.entries if e.expires_at_s <= now]
        if expired:
            self.entries = [e for e in self.entries if e.expires_at_s > now]
        return expired
