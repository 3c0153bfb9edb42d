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
its processes), as the rate limits do. While Redis cannot be reached requests are admitted
without a budget check (fail open, counted in ``unavailable`` and logged): a cache outage must
not stop every tenant with a budget; the usage records still charge what they cost. A request
of a model without a price costs nothing and reserves nothing; it is still refused while a
budget is exhausted.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

import httpx
from redis.exceptions import RedisError
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
    ) -> None:
        scope = "the API key's" if rule.key_id is not None else "the tenant's"
        self.rule = rule
        self.resets_at = resets_at
        reset = resets_at.isoformat().replace("+00:00", "Z")
        if too_large:
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
        """Operations the store could not do (Redis away): those requests were admitted."""
        self._logged_at = -float("inf")

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
        try:
            result = await self.store.reserve([c for _, c in charges])
        except (RedisError, OSError) as exc:  # the store is away: admit, never fail the request
            self._unavailable("reserve", exc)
            return None
        if isinstance(result, Refusal):
            rule, charge = charges[result.index]
            if self.on_refused is not None:
                self.on_refused(rule)
            spent = from_nanos(result.spent * self._share)
            _, end = period_bounds(rule.period, now)
            raise BudgetExceeded(rule, spent, end, now, too_large=nanos > charge.limit)
        return BudgetHold(charges=charges, reserved=nanos)

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
        try:
            values = await self.store.add([c for _, c in charges])
        except (RedisError, OSError) as exc:
            self._unavailable("settle", exc)
            return
        if actual > 0:
            await self._crossed(charges, values)

    def _unavailable(self, what: str, exc: Exception) -> None:
        """Count and log (at most every 10 s) an operation the store could not do."""
        self.unavailable += 1
        now = self._monotonic()
        if now - self._logged_at >= 10.0:
            self._logged_at = now
            log.warning(
                "budget store unavailable (%s: %s): admitting without budgets (%d so far)",
                what,
                type(exc).__name__,
                self.unavailable,
            )

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
        await self.store.aclose()


def _with_nanos(charge: Charge, nanos: int) -> Charge:
    return Charge(charge.key, nanos, charge.limit, charge.seed, charge.expires_at)


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
    across every process), else in this process with ``share`` = its processes."""
    store: BudgetStore
    if redis_url:
        store, share = RedisBudgetStore.from_url(redis_url, timeout_s=timeout_s), 1
    else:
        store = MemoryBudgetStore()
    return BudgetGuard(
        store,
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
