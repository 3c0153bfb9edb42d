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
    dispatches after T, unless its TTL runs out, a full queue evicts it or it is demoted first,

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

**SLO-aware leaving** (``docs/operations/overload.md``). An item may carry ``slo_wait_s``: the
longest wait after which it can still meet its TTFT objective within its tier's slack. Past it,
a plain item leaves (its waiter gets 503 ``slo_unattainable``, :attr:`Entry.slo_expired`) rather
than wait out its TTL for an answer that is late anyway; a ``demotable`` one (a tier that allows
best effort) is *demoted* instead: it ranks below every item that is not, is never owed a rescue
(it was promised nothing) and keeps its TTL. An item demoted at admission has ``slo_wait_s = 0``.
Demotion is computed from the clock, not stored, so no event is needed to apply it.

**Ready backends.** ``pop`` may be given ``ready(model, demoted)``: an entry goes only when its
backends take it now (the gateway holds requests while a backend's pending prefills would make
them wait there, out of its order, and lets best effort use only what is left over).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from priority.gain import GainWeights

Ready = Callable[[str, bool], bool]
"""``ready(model, demoted)``: whether a request for ``model`` (a demoted one, or not) may be
dispatched now — its backends' pending prefills are short enough (``gateway.app.shedding``)."""


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
    owed a rescue slot (its tier's TTFT SLO). ``slo_wait_s``: longest wait that still lets it
    meet its TTFT objective within its tier's slack (``inf``: no such limit); past it the item
    leaves with 503 ``slo_unattainable``, or, if ``demotable``, is demoted (module docstring).
    """

    request_id: str
    tier: str
    priority: float
    ttl_s: float
    aging_s: float
    slo_wait_s: float = math.inf
    demotable: bool = False
    model: str = ""
    """What serves it: ``pop``'s ``ready`` is asked about its backends."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.priority):
            raise ValueError(f"priority must be finite, got {self.priority!r}")
        if not self.ttl_s > 0 or not (self.aging_s > 0 and math.isfinite(self.aging_s)):
            raise ValueError("ttl_s must be > 0 and aging_s positive and finite")
        if not self.slo_wait_s >= 0:  # also refuses nan
            raise ValueError(f"slo_wait_s must be >= 0, got {self.slo_wait_s!r}")


@dataclass(slots=True, eq=False)
class Entry:
    """A queued item and when it joined (identity-hashed: one entry per wait).

    Its times are computed once, as it joins: the queue reads them for every entry at every
    dispatch, which under overload is thousands of times a second."""

    item: QueueItem
    enqueued_s: float
    seq: int
    overdue_at_s: float = field(init=False)
    """When it is owed a rescue slot (if not demoted by then)."""
    demoted_at_s: float = field(init=False)
    """When it ranks below every item not demoted (``inf``: never)."""
    expires_at_s: float = field(init=False)
    """When it leaves without a slot (its TTL, or for a promised item its SLO wait)."""

    def __post_init__(self) -> None:
        item = self.item
        self.overdue_at_s = self.enqueued_s + item.aging_s
        if item.demotable:
            self.demoted_at_s = self.enqueued_s + item.slo_wait_s
            self.expires_at_s = self.enqueued_s + item.ttl_s
        else:
            self.demoted_at_s = math.inf
            self.expires_at_s = self.enqueued_s + min(item.ttl_s, item.slo_wait_s)

    @property
    def slo_expired(self) -> bool:
        """Whether it leaves (or left) because its SLO became unattainable, not by its TTL."""
        return not self.item.demotable and self.item.slo_wait_s < self.item.ttl_s

    def demoted(self, now: float) -> bool:
        return now >= self.demoted_at_s

    def rank(self, now: float) -> tuple[bool, float, int]:
        """Dispatch order, larger first: not demoted, then priority, then the oldest."""
        return (now < self.demoted_at_s, self.item.priority, -self.seq)


@dataclass(frozen=True, slots=True)
class PushResult:
    """``queued`` is the new entry (``None`` if refused); ``evicted`` the entry it displaced."""

    queued: Entry | None
    evicted: Entry | None = None


class Backlog:
    """Bounded, gain-ordered backlog with a rescue lane (see the module docstring).

    Entries promised their SLO when they joined are kept apart from best effort: under overload
    the backlog is mostly best effort waiting for leftovers, while dispatch order, predictions
    and the rescue lane look at the promised ones — a few, their waits bounded by their SLOs.
    Expiry pops a heap. Choosing among promised entries, and among best effort once some model
    has capacity to spare, still scans them (a gateway's queue holds hundreds, not millions).
    ``rescue_every=None`` disables the rescue lane (pure gain order, for comparison).
    """

    def __init__(self, max_size: int, rescue_every: int | None = 4) -> None:
        if max_size < 1:
            raise ValueError("max_size must be >= 1")
        if rescue_every is not None and rescue_every < 1:
            raise ValueError("rescue_every must be >= 1 or None")
        self.max_size = max_size
        self.rescue_every = rescue_every
        self.rescued = 0  # dispatches made by the rescue lane
        self._seq = 0
        self._since_rescue = 0  # gain-order dispatches since the last rescue, while any overdue
        self._all: dict[Entry, None] = {}  # insertion-ordered set
        self._promised: dict[Entry, None] = {}  # not demoted when they joined
        self._expiry: list[tuple[float, int, Entry]] = []
        self._tiers: Counter[str] = Counter()
        self._models: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._all)

    @property
    def entries(self) -> list[Entry]:
        """The queued entries, in the order they joined."""
        return list(self._all)

    def push(self, item: QueueItem, now: float) -> PushResult:
        entry = Entry(item, now, self._seq)
        self._seq += 1
        if len(self._all) < self.max_size:
            self._add(entry)
            return PushResult(entry)
        longest = max(self._tiers.values())
        if self._tiers[item.tier] < longest:
            tier = min(
                (t for t, n in self._tiers.items() if n == longest),
                key=lambda t: self._lowest(t, now).rank(now),
            )
        else:
            tier = item.tier
        victim = self._lowest(tier, now)
        if tier == item.tier and entry.rank(now)[:2] <= victim.rank(now)[:2]:
            return PushResult(None)
        self._discard(victim)
        self._add(entry)
        return PushResult(entry, victim)

    def _add(self, entry: Entry) -> None:
        self._all[entry] = None
        if entry.demoted_at_s > entry.enqueued_s:
            self._promised[entry] = None
        if len(self._expiry) > 2 * len(self._all) + 64:  # records of entries long gone
            self._expiry = [(e.expires_at_s, e.seq, e) for e in self._all]
            heapq.heapify(self._expiry)
        else:
            heapq.heappush(self._expiry, (entry.expires_at_s, entry.seq, entry))
        self._tiers[entry.item.tier] += 1
        self._models[entry.item.model] += 1

    def _discard(self, entry: Entry) -> None:
        """Take a queued entry out (its heap record goes lazily, when it comes up)."""
        del self._all[entry]
        self._promised.pop(entry, None)
        for counter, key in ((self._tiers, entry.item.tier), (self._models, entry.item.model)):
            counter[key] -= 1
            if not counter[key]:
                del counter[key]

    def _lowest(self, tier: str, now: float) -> Entry:
        """The tier's entry that would be dispatched last (ties: the newest)."""
        return min((e for e in self._all if e.item.tier == tier), key=lambda e: e.rank(now))

    def pop(self, now: float, ready: Ready | None = None) -> Entry | None:
        """Remove and return the next entry to dispatch (expired entries are never returned).

        ``ready(model, demoted)``: whether the backends of ``model`` take such a request now;
        an entry whose backends do not stays queued (None: always)."""
        verdicts: dict[tuple[str, bool], bool] = {}

        def allowed(model: str, demoted: bool) -> bool:
            if ready is None:
                return True
            key = (model, demoted)
            if key not in verdicts:
                verdicts[key] = ready(model, demoted)
            return verdicts[key]

        promised = [
            e
            for e in self._promised
            if e.expires_at_s > now and now < e.demoted_at_s and allowed(e.item.model, False)
        ]
        chosen: Entry | None = None
        if promised:
            # a demoted entry is owed no rescue: it was promised nothing
            overdue = [e for e in promised if e.overdue_at_s <= now]
            every = self.rescue_every
            if overdue and every is not None and self._since_rescue >= every - 1:
                chosen = min(overdue, key=lambda e: (e.overdue_at_s, e.seq))
                self._since_rescue = 0
                self.rescued += 1
            else:
                chosen = max(promised, key=lambda e: e.rank(now))
                if overdue:
                    self._since_rescue += 1
        elif any(allowed(model, True) for model in self._models):
            best_effort = [
                e
                for e in self._all
                if e.expires_at_s > now and e.demoted(now) and allowed(e.item.model, True)
            ]
            if best_effort:
                chosen = max(best_effort, key=lambda e: e.rank(now))
        if chosen is not None:
            self._discard(chosen)
        return chosen

    def ahead_of(self, priority: float, now: float) -> int:
        """How many live entries go before a new, not demoted item of ``priority`` in gain
        order (the rescue lane aside): those not demoted with at least its priority."""
        return sum(
            1
            for e in self._promised
            if e.item.priority >= priority and e.expires_at_s > now and now < e.demoted_at_s
        )

    def overdue(self, now: float) -> int:
        """Live entries owed a rescue at ``now``."""
        return sum(
            1
            for e in self._promised
            if e.expires_at_s > now and e.overdue_at_s <= now < e.demoted_at_s
        )

    def promised(self, now: float) -> bool:
        """Whether any live entry is not demoted (still promised its SLO)."""
        return any(e.expires_at_s > now and now < e.demoted_at_s for e in self._promised)

    def live(self, now: float) -> int:
        """Entries not yet expired at ``now``."""
        return sum(1 for e in self._all if e.expires_at_s > now)

    def remove(self, entry: Entry) -> bool:
        """Take ``entry`` out (its waiter left); False if it was no longer queued."""
        if entry not in self._all:
            return False
        self._discard(entry)
        return True

    def expire(self, now: float) -> list[Entry]:
        """Remove and return the entries whose TTL has run out."""
        expired = []
        while self._expiry and self._expiry[0][0] <= now:
            _, _, entry = heapq.heappop(self._expiry)
            if entry in self._all:
                self._discard(entry)
                expired.append(entry)
        return expired
