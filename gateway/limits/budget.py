"""Spend budgets at admission: reserve a request's maximum cost, settle to its actual cost.

A tenant, and each of its keys, may have a budget per UTC day and per UTC month
(:class:`gateway.db.models.Budget`). Admission reserves the request's *maximum* cost — its
prompt and its whole output budget (``max_tokens``) at its model's price — against every
budget that applies, atomically (:mod:`gateway.limits.budget_store`): when one has no room the
request is refused, 429 ``budget_exceeded`` with ``retry-after`` until the period ends, and
nothing is taken from the others. The end settles each reservation to the cost actually
charged, so concurrent requests can never together spend more than the budget: at most what a
request's real cost exceeds its reservation by (the engine counted more prompt tokens than the
gateway's estimate).

With Redis the counters are shared by every worker and replica (one Lua script per
operation); without it each process counts its own share (``amount / share``, ``share`` being
its processes), as the rate limits do. A request of a model without a price costs nothing and
reserves nothing; it is still refused while a budget is exhausted.

**Redis away or slow.** Neither fail open (any tenant past its budget for as long as Redis is
away) nor closed (a cache outage stopping every tenant with a budget): the guard degrades as
the rate limits do, with their machinery (:class:`~gateway.limits.failover.RedisSwitch`). The
first call that fails, or passes ``redis_timeout_s`` twice (a reservation or settlement that
times out is replayed once under its marker: slow is not down), switches this process to
deciding budgets in process (logged once per switch, ``on_change`` for the
``tiergate_budget_degraded`` gauge); no request waits on Redis after it. On each counter the
process may then add at most :func:`~gateway.limits.failover.share_of_rest` of it — ``(amount -
seen) // share``, ``seen`` being the counter's value as Redis last showed it to this process
(every reservation and settlement returns it; the heartbeat re-reads every known counter each
second; a counter never seen: what the usage records show spent) and ``share``
(``outage_share``) the gateway processes — net of what its settlements give back, and keeps
counting its own spend. A refusal then is 429 ``budget_exceeded`` with a ``retry-after`` of the
longest probe period. When Redis answers, each process writes back what it counted (one
operation per tenant), stays degraded ``settle_s`` more so the others have written theirs, and
switches back.

**The bound.** A process in degraded mode adds at most ``(amount - seen) // share`` to a
counter, plus what its requests' real costs exceed their reservations by (as with Redis). So
when Redis is away for every process (an outage) and each had seen the counter as it was at
the loss, the fleet spends **no more than the budget** while Redis is away, plus those
excesses (as with Redis). A process whose view was older adds 1/``share`` of what the fleet
spent since it last read the counter (at most about a second's spend: the heartbeat). When
Redis is away for some processes only (one process's call past its timeout), the others cannot
see the degraded ones' spend until it is written back: the budget may then be passed by at
most 1/``share`` of what was left, per degraded process. ``test_budget_outage.py`` shows each.

**Nothing lost, nothing twice.** Every operation carries a marker (its op key) that Redis keeps
``MARKER_TTL_S`` (10 minutes) and that makes it run at most once. A call whose answer never
came (Redis may have run it: a frozen server runs what it had received when it thaws) is
replayed under its own marker when admitted in process — counted once whether or not it ran —
or cancelled when refused in process (taken back if it ran, never run later). So once every
process has written back, Redis's counter is exactly what was charged. An outage longer than
the markers live may count a call that Redis ran but never answered (at most the calls in
flight at the loss) twice. The soft-threshold notice is not sent for spend counted in process:
it is sent by the first settlement through Redis past the threshold after it answers.

Once a settled charge takes a budget past ``soft_fraction`` of it, the first process to see
it (a flag in the store) counts ``tiergate_budget_soft_crossings_total`` once for the period
and, where the budget names one, posts a JSON
notice to its webhook (never a key or a prompt: the budget's target, period, amount, spent).

The budgets themselves are read from the database every ``ttl_s`` off the event loop; a new
counter starts from what the usage records show spent in its period (a budget created
mid-period, a restart without Redis).
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

import httpx
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.crud.budgets import spent_in
from gateway.db.errors import describe
from gateway.db.models import Budget
from gateway.db.money import NANOS, from_nanos, plain, to_nanos
from gateway.db.prices import PriceBook
from gateway.limits.base import AdmissionRejected, RejectReason
from gateway.limits.budget_store import (
    EXPIRY_MARGIN_S,
    BudgetStore,
    Charge,
    MemoryBudgetStore,
    RedisBudgetStore,
    Refusal,
)
from gateway.limits.failover import (
    CHECK_EVERY_S,
    PROBE_MAX_S,
    PROBE_MIN_S,
    RedisSwitch,
    share_of_rest,
)

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 5.0
"""How stale the budgets read from the database may get: how long a change takes to apply."""
WEBHOOK_TIMEOUT_S = 5.0

Period = Literal["day", "month"]
ADJECTIVE: dict[str, str] = {"day": "daily", "month": "monthly"}
"""A period as its budget is called in messages."""
State = Literal["ok", "soft", "exhausted"]


def period_bounds(period: str, now: datetime) -> tuple[datetime, datetime]:
    """The UTC day or month containing ``now``: ``[start, end)``."""
    now = now.astimezone(UTC)
    if period == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + timedelta(days=1)
    if period == "month":
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        days = calendar.monthrange(start.year, start.month)[1]
        return start, start + timedelta(days=days)
    raise ValueError(f"period must be day or month, got {period!r}")


def budget_state(spent: Decimal, amount: Decimal, soft_fraction: float | None) -> State:
    """``exhausted`` at the amount, ``soft`` past the soft threshold, else ``ok``."""
    if spent >= amount:
        return "exhausted"
    if soft_fraction is not None and spent >= amount * Decimal(repr(soft_fraction)):
        return "soft"
    return "ok"


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """One budget as the guard applies it."""

    budget_id: int
    tenant_id: int
    key_id: int | None
    period: str
    amount: Decimal
    soft_fraction: float | None = None
    webhook_url: str | None = None

    @property
    def scope(self) -> str:
        return "key" if self.key_id is not None else "tenant"

    @property
    def target(self) -> str:
        return f"key:{self.key_id}" if self.key_id is not None else f"tenant:{self.tenant_id}"

    @classmethod
    def of(cls, row: Budget) -> BudgetRule:
        return cls(
            budget_id=row.id,
            tenant_id=row.tenant_id,
            key_id=row.api_key_id,
            period=row.period,
            amount=Decimal(row.amount),
            soft_fraction=row.soft_fraction,
            webhook_url=row.webhook_url,
        )


class BudgetExceeded(AdmissionRejected):
    """429 ``budget_exceeded``: ``retry-after`` until the period ends (None: the request alone
    costs more than the whole budget, so waiting cannot help)."""

    def __init__(
        self,
        rule: BudgetRule,
        spent: Decimal,
        resets_at: datetime,
        now: datetime,
        *,
        too_large: bool = False,
        briefly: tuple[int, float] | None = None,
    ) -> None:
        scope = "the API key's" if rule.key_id is not None else "the tenant's"
        self.rule = rule
        self.resets_at = resets_at
        reset = resets_at.isoformat().replace("+00:00", "Z")
        if briefly is not None and not too_large:  # degraded: this process's share, for now
            share, wait = briefly
            text = (
                f"{scope} {ADJECTIVE[rule.period]} budget of {plain(rule.amount)}: while shared "
                f"budgets are briefly unavailable this gateway process may spend 1/{share} of "
                "what was left of it, and that is spent; retry shortly"
            )
        elif too_large:
            wait = None
            text = (
                f"this request could cost more than {scope} whole "
                f"{ADJECTIVE[rule.period]} budget of {plain(rule.amount)}: lower max_tokens"
            )
        else:
            wait = (resets_at - now).total_seconds()
            text = (
                f"{scope} {ADJECTIVE[rule.period]} budget of {plain(rule.amount)} is spent "
                f"({plain(spent)} so far, in-flight requests included); it resets at {reset}"
            )
        super().__init__(RejectReason.BUDGET_EXCEEDED, wait, text)


@dataclass(slots=True)
class BudgetHold:
    """What :meth:`BudgetGuard.reserve` took for one request: settle it once."""

    charges: list[tuple[BudgetRule, Charge]]
    reserved: int
    """Nano-units reserved on each counter."""
    settled: bool = False
    model: str | None = None
    """The model whose price :meth:`BudgetGuard.charge` settles at."""


def _period_key(prefix: str, rule: BudgetRule, start: datetime) -> str:
    # one tenant's counters share a hash tag: a script's keys must be in one Cluster slot
    tag = f"{{tenant:{rule.tenant_id}}}"
    return f"{prefix}:budget:{tag}:{rule.target}:{rule.period}:{int(start.timestamp())}"


Loader = Callable[[], list[BudgetRule]]
Seeder = Callable[[BudgetRule, datetime, datetime], Decimal]


class BudgetGuard:
    """Reserve and settle budgets for requests (one per process; on the event loop)."""

    def __init__(
        self,
        store: BudgetStore,
        *,
        outage_share: int = 1,
        probe_min_s: float = PROBE_MIN_S,
        probe_max_s: float = PROBE_MAX_S,
        settle_s: float | None = None,
        check_every_s: float = CHECK_EVERY_S,
        on_change: Callable[[bool], None] | None = None,
        load: Loader | None = None,
        seed: Seeder | None = None,
        prefix: str = "tiergate",
        share: int = 1,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        on_refused: Callable[[BudgetRule], None] | None = None,
        on_soft: Callable[[BudgetRule, Decimal], None] | None = None,
        notify: Callable[[BudgetRule, Decimal, datetime], Any] | None = None,
        prices: PriceBook | None = None,
    ) -> None:
        self.store = store
        self._price_book = prices
        self._pricing: asyncio.Task[None] | None = None
        self._load = load
        self._seed = seed
        self._prefix = prefix
        self._share = max(1, share)
        self._ttl_s = ttl_s
        self._clock = clock
        self._monotonic = monotonic
        self.on_refused = on_refused
        self.on_soft = on_soft
        self._notify = notify
        self._by_tenant: dict[int, list[BudgetRule]] = {}
        self._by_key: dict[int, list[BudgetRule]] = {}
        self._loaded_at: float | None = None
        self._loading: asyncio.Task[None] | None = None
        self._seeds: dict[str, int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.unavailable = 0
        """Operations the store could not do (Redis away or slow): decided in process."""
        self.slow_replays = 0
        """Calls replayed once after passing their timeout (:meth:`_twice_if_slow`)."""
        self._outage_share = max(1, outage_share)
        self._seen: dict[str, tuple[int, float]] = {}  # counter -> Redis's value, expires_at
        self._taken: dict[str, int] = {}  # counter -> nanos this process added while degraded
        self._unsent: dict[str, Charge] = {}  # counter -> degraded nanos not yet in an op
        self._journal: OrderedDict[str, tuple[str, list[Charge]]] = OrderedDict()
        """Operations for Redis when it answers (op key -> mode, charges), oldest first."""
        self.switch: RedisSwitch | None = None
        """Redis or degraded (the rate limits' machinery); None for an in-process store."""
        if store.shared:
            self.switch = RedisSwitch(
                "Redis budgets",
                f"each gateway process enforces 1/{self._outage_share} of what each budget had "
                "left, in process, until Redis answers",
                recover=self._recover,
                heartbeat=self.heartbeat,
                check_every_s=check_every_s,
                probe_min_s=probe_min_s,
                probe_max_s=probe_max_s,
                settle_s=settle_s,
                clock=monotonic,
                on_change=on_change,
                on_trip=self._taken.clear,
            )

    @property
    def degraded(self) -> bool:
        """True while Redis is away and this process decides budgets on its own."""
        return self.switch is not None and self.switch.degraded

    # -- the budgets in force ---------------------------------------------------------------

    def set_rules(self, rules: Sequence[BudgetRule]) -> None:
        """Replace the budgets (what a refresh does; tests)."""
        by_tenant: dict[int, list[BudgetRule]] = {}
        by_key: dict[int, list[BudgetRule]] = {}
        for rule in rules:
            if rule.key_id is not None:
                by_key.setdefault(rule.key_id, []).append(rule)
            else:
                by_tenant.setdefault(rule.tenant_id, []).append(rule)
        self._by_tenant, self._by_key = by_tenant, by_key
        self._loaded_at = self._monotonic()

    def invalidate(self) -> None:
        """Re-read the budgets before the next request (after an admin change)."""
        self._loaded_at = None

    async def _refresh(self) -> None:
        if self._load is None:
            return
        try:
            rules = await asyncio.to_thread(self._load)
        except SQLAlchemyError as exc:
            log.warning("could not read budgets (%s): keeping the last ones", describe(exc))
            self._loaded_at = self._monotonic()  # retried after ttl_s, not on every request
            return
        self.set_rules(rules)

    async def _rules_for(self, tenant_id: int, key_id: int | None) -> list[BudgetRule]:
        loaded = self._loaded_at
        if self._load is not None and (loaded is None or self._monotonic() - loaded >= self._ttl_s):
            if self._loading is None or self._loading.done():
                self._loading = asyncio.get_running_loop().create_task(self._refresh())
            if loaded is None:  # nothing known yet: wait for the first read
                await asyncio.shield(self._loading)
        rules = list(self._by_tenant.get(tenant_id, ()))
        if key_id is not None:
            rules += self._by_key.get(key_id, ())
        return rules

    # -- reserve and settle -----------------------------------------------------------------

    async def _charge(self, rule: BudgetRule, nanos: int, now: datetime) -> Charge:
        start, end = period_bounds(rule.period, now)
        key = _period_key(self._prefix, rule, start)
        seed = self._seeds.get(key)
        if seed is None:
            seed = 0
            if self._seed is not None:
                try:
                    spent = await asyncio.to_thread(self._seed, rule, start, end)
                    seed = to_nanos(spent) // self._share
                except SQLAlchemyError as exc:
                    log.warning("could not read a budget's spend (%s): from 0", describe(exc))
            if len(self._seeds) > 100_000:
                self._seeds.clear()
            self._seeds[key] = seed
        limit = to_nanos(rule.amount) // self._share
        expires = end.timestamp() + EXPIRY_MARGIN_S
        return Charge(key=key, nanos=nanos, limit=limit, seed=seed, expires_at=expires)

    async def admit(
        self,
        tenant_id: int,
        key_id: int | None,
        model: str | None,
        prompt_tokens: int,
        max_output_tokens: int,
    ) -> BudgetHold | None:
        """The request path's reserve: the request's maximum cost — its prompt and its whole
        output budget at ``model``'s price now — on every budget of the tenant and the key
        (None when none applies; nothing is priced then). Raises :class:`BudgetExceeded`."""
        rules = await self._rules_for(tenant_id, key_id)
        if not rules:
            return None
        book = await self._prices()
        max_cost = book.cost(model, prompt_tokens, max_output_tokens) if book else None
        hold = await self._reserve(rules, max_cost)
        if hold is not None:
            hold.model = model
        return hold

    async def charge(
        self, hold: BudgetHold | None, prompt_tokens: int, completion_tokens: int
    ) -> None:
        """The request path's settle: what the request's tokens cost at its model's price (the
        same price book the usage writer charges the record at)."""
        if hold is None:
            return
        book = self._price_book
        cost = book.cost(hold.model, prompt_tokens, completion_tokens) if book else None
        await self.settle(hold, cost)

    async def _prices(self) -> PriceBook | None:
        """The price book, read first if it never was (then refreshed off the event loop)."""
        book = self._price_book
        if book is None:
            return None
        if not book.loaded:
            await asyncio.to_thread(book.refresh)
        elif book.stale and (self._pricing is None or self._pricing.done()):
            self._pricing = asyncio.get_running_loop().create_task(
                asyncio.to_thread(book.refresh_if_stale)
            )
        return book

    async def reserve(
        self, tenant_id: int, key_id: int | None, max_cost: Decimal | None
    ) -> BudgetHold | None:
        """Reserve ``max_cost`` (None: unpriced, 0) on every budget of the tenant and the key;
        None when none applies. Raises :class:`BudgetExceeded`."""
        rules = await self._rules_for(tenant_id, key_id)
        if not rules:
            return None
        return await self._reserve(rules, max_cost)

    async def _reserve(
        self, rules: list[BudgetRule], max_cost: Decimal | None
    ) -> BudgetHold | None:
        now = self._clock()
        nanos = to_nanos(max_cost) if max_cost is not None and max_cost > 0 else 0
        charges = [(rule, await self._charge(rule, nanos, now)) for rule in rules]
        lost: str | None = None  # a call whose answer never came: Redis may have run it
        if self.switch is not None:
            self.switch.ensure_task()  # the heartbeat: an idle process notices an outage
        if not self.degraded:
            op = self._op_key(rules[0]) if self.switch is not None else None
            try:
                result = await self._twice_if_slow(self.store.reserve, [c for _, c in charges], op)
            except (RedisError, OSError) as exc:  # away or slow: decide in process
                self._lost(exc)
                lost = op
            else:
                if isinstance(result, Refusal):
                    rule, charge = charges[result.index]
                    self._saw(charge, result.spent)
                    self._refused(rule)
                    spent = from_nanos(result.spent * self._share)
                    _, end = period_bounds(rule.period, now)
                    raise BudgetExceeded(rule, spent, end, now, too_large=nanos > charge.limit)
                for (_, charge), value in zip(charges, result, strict=True):
                    self._saw(charge, value)
                return BudgetHold(charges=charges, reserved=nanos)
        return await self._reserve_here(charges, nanos, now, lost)

    async def _reserve_here(
        self,
        charges: list[tuple[BudgetRule, Charge]],
        nanos: int,
        now: datetime,
        lost: str | None,
    ) -> BudgetHold:
        """Degraded admission: on every counter, this process may add at most its share of
        what Redis last showed left (:func:`~gateway.limits.failover.share_of_rest`)."""
        for rule, charge in charges:
            seen = await self._last_seen(rule, charge, now)
            allowed = share_of_rest(charge.limit, seen, self._outage_share)
            taken = self._taken.get(charge.key, 0)
            if taken >= allowed or taken + nanos > allowed:
                if lost is not None:  # the call that timed out must not count if Redis ran it
                    self._journal[lost] = ("cancel", [c for _, c in charges])
                self._refused(rule)
                _, end = period_bounds(rule.period, now)
                wait = PROBE_MAX_S if self.switch is None else self.switch.probe_max_s
                raise BudgetExceeded(
                    rule,
                    from_nanos(seen + taken),
                    end,
                    now,
                    too_large=nanos > charge.limit,
                    briefly=(self._outage_share, wait),
                )
        self._here([c for _, c in charges], nanos, lost)
        return BudgetHold(charges=charges, reserved=nanos)

    def _here(self, charges: Sequence[Charge], nanos: int, lost: str | None) -> None:
        """Count ``nanos`` on each counter in this process, for Redis when it answers: the
        call that timed out replayed under its own op (at most once, whether or not Redis ran
        it), else merged into one operation per tenant at the next write-back."""
        for charge in charges:
            self._taken[charge.key] = self._taken.get(charge.key, 0) + nanos
        if lost is not None:
            self._journal[lost] = ("add", [_with_nanos(c, nanos) for c in charges])
            return
        for charge in charges:
            pending = self._unsent.get(charge.key)
            total = nanos + (pending.nanos if pending is not None else 0)
            self._unsent[charge.key] = _with_nanos(charge, total)

    async def _last_seen(self, rule: BudgetRule, charge: Charge, now: datetime) -> int:
        """What Redis last showed on ``charge``'s counter; never seen by this process: what
        the usage records show spent in the period (read once), else the counter's seed."""
        found = self._seen.get(charge.key)
        if found is not None:
            return found[0]
        value = charge.seed
        if self._seed is not None:
            start, end = period_bounds(rule.period, now)
            try:
                value = to_nanos(await asyncio.to_thread(self._seed, rule, start, end))
            except SQLAlchemyError as exc:
                log.warning("could not read a budget's spend (%s): from its seed", describe(exc))
        self._seen[charge.key] = (value, charge.expires_at)
        return value

    def _saw(self, charge: Charge, value: int) -> None:
        self._seen[charge.key] = (value, charge.expires_at)

    def _refused(self, rule: BudgetRule) -> None:
        if self.on_refused is not None:
            self.on_refused(rule)

    def _op_key(self, rule: BudgetRule) -> str:
        """A fresh operation's marker, in its tenant's hash slot."""
        return f"{self._prefix}:budget:{{tenant:{rule.tenant_id}}}:op:{uuid.uuid4().hex}"

    async def settle(self, hold: BudgetHold | None, cost: Decimal | None) -> None:
        """Replace the reservation with ``cost`` (None: nothing was charged). Idempotent."""
        if hold is None or hold.settled:
            return
        hold.settled = True
        actual = to_nanos(cost) if cost is not None and cost > 0 else 0
        delta = actual - hold.reserved
        watched = any(rule.soft_fraction is not None for rule, _ in hold.charges)
        if delta == 0 and not watched:
            return
        charges = [(rule, _with_nanos(c, delta)) for rule, c in hold.charges]
        if self.degraded:
            if delta:
                self._here([c for _, c in hold.charges], delta, None)
            return
        op = self._op_key(hold.charges[0][0]) if self.switch is not None else None
        try:
            values = await self._twice_if_slow(self.store.add, [c for _, c in charges], op)
        except (RedisError, OSError) as exc:
            self._lost(exc)
            if op is not None:
                self._here([c for _, c in hold.charges], delta, op)
            return
        for (_, charge), value in zip(charges, values, strict=True):
            self._saw(charge, value)
        if actual > 0:
            try:
                await self._crossed(charges, values)
            except (RedisError, OSError) as exc:
                self._lost(exc)

    async def _twice_if_slow(
        self, call: Callable[[list[Charge], str | None], Any], charges: list[Charge], op: str | None
    ) -> Any:
        """``call``, once more under the same marker when it passed its timeout: slow is not
        down. A loaded process's event loop can resume past a timeout whose answer was already
        there (one 2-core machine under a 200-request burst: one process in four degraded, the
        budget passed by a quarter of what was left); the marker makes the replay count once,
        whether or not the first call ran. A Redis that hangs costs the request a second
        timeout, once, before the switch trips; a refused connection trips at once."""
        try:
            return await call(charges, op)
        except (RedisTimeout, TimeoutError):
            if op is None:
                raise
            self.slow_replays += 1
            return await call(charges, op)

    def _lost(self, exc: Exception) -> None:
        """A store call failed or timed out: degraded mode (logged once, by the switch)."""
        self.unavailable += 1
        if self.switch is not None:
            self.switch.trip(exc)
        else:  # an in-process store does not fail; should one, say so
            log.warning("budget store failed (%s)", type(exc).__name__)

    # -- Redis away: the switch's heartbeat and write-back ------------------------------------

    async def heartbeat(self) -> None:
        """While Redis answers (every ``check_every_s``): re-read every counter this process
        knows, so that what it last saw is at most that old when Redis goes away. Tests call it;
        a Redis fault propagates (the switch trips)."""
        now = time.time()
        self._seen = {k: v for k, v in self._seen.items() if v[1] > now}
        keys = list(self._seen)
        if self._journal or self._unsent:
            await self._write_back()
        if not keys:
            await self.store.ping()
            return
        for key, value in zip(keys, await self.store.values(keys), strict=True):
            if value is not None and key in self._seen:
                self._seen[key] = (value, self._seen[key][1])

    async def probe(self) -> bool:
        """While degraded: write back and switch to Redis once it answers and settling is over
        (what the background task does; tests call it). True when on Redis."""
        return True if self.switch is None else await self.switch.probe()

    async def _recover(self) -> str:
        """Write back to Redis what this process counted while degraded, then re-read."""
        await self.store.ping()
        written = await self._write_back()
        await self.heartbeat()
        return f"budgets counted in Redis again ({written} operations written back)"

    async def _write_back(self) -> int:
        """Replay the journal, oldest first: each operation at most once (its op key)."""
        by_tenant: dict[int, list[Charge]] = {}
        for key, charge in self._unsent.items():
            by_tenant.setdefault(_tenant_of(key), []).append(charge)
        self._unsent = {}
        for tenant, charges in by_tenant.items():
            op = f"{self._prefix}:budget:{{tenant:{tenant}}}:op:{uuid.uuid4().hex}"
            self._journal[op] = ("add", charges)
        written = 0
        while self._journal:
            op, (mode, charges) = next(iter(self._journal.items()))
            if mode == "cancel":
                values = await self.store.cancel(charges, op)
            else:
                values = await self.store.add(charges, op)
            for charge, value in zip(charges, values, strict=True):
                self._saw(charge, value)
            self._journal.pop(op, None)
            written += 1
        return written

    async def spent(self, rule: BudgetRule) -> Decimal | None:
        """What the counter of ``rule``'s current period holds (reservations included), for
        the whole fleet with Redis; None when no request touched it yet."""
        start, _ = period_bounds(rule.period, self._clock())
        value = await self.store.spent(_period_key(self._prefix, rule, start))
        return None if value is None else from_nanos(value * self._share)

    async def _crossed(
        self, charges: Sequence[tuple[BudgetRule, Charge]], values: Sequence[int]
    ) -> None:
        """Tell of each soft threshold the counters are past, once per budget and period
        (the store's flag: whichever process settles past it first)."""
        for (rule, charge), value in zip(charges, values, strict=True):
            if rule.soft_fraction is None or value < int(charge.limit * rule.soft_fraction):
                continue
            if not await self.store.first(charge.key + ":soft", charge.expires_at):
                continue
            spent = from_nanos(value * self._share)
            if self.on_soft is not None:
                self.on_soft(rule, spent)
            if rule.webhook_url and self._notify is not None:
                _, end = period_bounds(rule.period, self._clock())
                task = asyncio.get_running_loop().create_task(
                    _quietly(self._notify(rule, spent, end))
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.switch is not None:
            await self.switch.aclose()
        await self.store.aclose()


def _with_nanos(charge: Charge, nanos: int) -> Charge:
    return Charge(charge.key, nanos, charge.limit, charge.seed, charge.expires_at)


def _tenant_of(key: str) -> int:
    """The tenant of a counter's key (its hash tag): an operation's keys are one tenant's."""
    return int(key.split("{tenant:", 1)[1].split("}", 1)[0])


async def _quietly(work: Any) -> None:
    with contextlib.suppress(Exception):
        await work


async def post_webhook(rule: BudgetRule, spent: Decimal, resets_at: datetime) -> None:
    """POST the soft-threshold notice to the budget's webhook (no key, no prompt)."""
    assert rule.webhook_url is not None
    notice = {
        "event": "budget.soft_threshold",
        "budget_id": rule.budget_id,
        "tenant_id": rule.tenant_id,
        "scope": rule.scope,
        "period": rule.period,
        "amount": plain(rule.amount),
        "soft_fraction": rule.soft_fraction,
        "spent": plain(spent),
        "resets_at": resets_at.isoformat().replace("+00:00", "Z"),
    }
    try:
        async with httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S) as client:
            await client.post(rule.webhook_url, json=notice)
    except httpx.HTTPError as exc:
        log.warning("budget %d's webhook failed: %s", rule.budget_id, type(exc).__name__)


def load_rules(factory: sessionmaker[Session]) -> Loader:
    """Every budget, read in one query (blocking: run in a thread)."""

    def load() -> list[BudgetRule]:
        with factory() as session:
            return [BudgetRule.of(row) for row in session.scalars(select(Budget))]

    return load


def seed_from(factory: sessionmaker[Session]) -> Seeder:
    def seed(rule: BudgetRule, start: datetime, end: datetime) -> Decimal:
        with factory() as session:
            return spent_in(session, rule.tenant_id, rule.key_id, start, end)

    return seed


def make_budget_guard(
    factory: sessionmaker[Session] | None,
    *,
    redis_url: str | None = None,
    prefix: str = "tiergate",
    share: int = 1,
    timeout_s: float = 0.25,
    **kwargs: Any,
) -> BudgetGuard:
    """The guard a gateway process runs: counters in Redis when ``redis_url`` is set (exact
    across every process; while Redis is away, ``1/share`` of what was left in each process),
    else in this process with ``share`` = its processes. ``on_change`` (a keyword) is told of
    every switch to and from degraded mode (the ``tiergate_budget_degraded`` gauge)."""
    store: BudgetStore
    outage_share = share  # while Redis is away each process enforces 1/share of what was left
    if redis_url:
        store, share = RedisBudgetStore.from_url(redis_url, timeout_s=timeout_s), 1
    else:
        store = MemoryBudgetStore()
    return BudgetGuard(
        store,
        outage_share=outage_share,
        load=load_rules(factory) if factory is not None else None,
        seed=seed_from(factory) if factory is not None else None,
        prefix=prefix,
        share=share,
        notify=post_webhook,
        **kwargs,
    )


__all__ = [
    "NANOS",
    "BudgetExceeded",
    "BudgetGuard",
    "BudgetHold",
    "BudgetRule",
    "budget_state",
    "make_budget_guard",
    "period_bounds",
]
