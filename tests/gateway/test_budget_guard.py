"""The budget guard (:mod:`gateway.limits.budget`): reserve the maximum cost, settle to the
actual one, refuse 429 ``budget_exceeded`` with when it resets; in process and for real against
Redis (``TIERGATE_REDIS_URL``, default ``redis://127.0.0.1:6379/0``), where a burst from four
processes sharing Redis never spends past the budget."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import pytest_asyncio

from gateway.db.prices import PriceBook
from gateway.errors import ApiError
from gateway.limits.budget import (
    BudgetExceeded,
    BudgetGuard,
    BudgetRule,
    budget_state,
    period_bounds,
    post_webhook,
)
from gateway.limits.budget_store import MemoryBudgetStore, RedisBudgetStore
from tests.gateway.test_limits import _delete_prefix, redis_url  # noqa: F401 - the fixture

NOW = datetime(2030, 2, 27, 18, 30, tzinfo=UTC)  # ahead: Redis expires past periods
TENANT_DAY = BudgetRule(1, tenant_id=7, key_id=None, period="day", amount=Decimal("1.00"))
KEY_MONTH = BudgetRule(
    2, tenant_id=7, key_id=70, period="month", amount=Decimal("0.50"), soft_fraction=0.5
)


def test_periods_are_utc_days_and_months() -> None:
    assert period_bounds("day", NOW) == (
        datetime(2030, 2, 27, tzinfo=UTC),
        datetime(2030, 2, 28, tzinfo=UTC),
    )
    assert period_bounds("month", NOW) == (
        datetime(2030, 2, 1, tzinfo=UTC),
        datetime(2030, 3, 1, tzinfo=UTC),
    )
    december = datetime(2030, 12, 31, 23, 59, tzinfo=UTC)
    assert period_bounds("month", december)[1] == datetime(2031, 1, 1, tzinfo=UTC)


def test_budget_states() -> None:
    assert budget_state(Decimal("0.4"), Decimal(1), 0.5) == "ok"
    assert budget_state(Decimal("0.5"), Decimal(1), 0.5) == "soft"
    assert budget_state(Decimal("1"), Decimal(1), 0.5) == "exhausted"
    assert budget_state(Decimal("0.99"), Decimal(1), None) == "ok"


@pytest_asyncio.fixture(params=["memory", "redis"])
async def make_guard(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., BudgetGuard]]:
    prefix = f"tiergate-test-{uuid.uuid4().hex[:12]}"
    made: list[BudgetGuard] = []

    def make(rules: list[BudgetRule], **kwargs: Any) -> BudgetGuard:
        if request.param == "redis":
            url = request.getfixturevalue("redis_url")
            store: Any = RedisBudgetStore.from_url(url, timeout_s=5.0)
        else:
            store = MemoryBudgetStore(clock=lambda: NOW.timestamp())
        guard = BudgetGuard(store, prefix=prefix, clock=lambda: NOW, **kwargs)
        guard.set_rules(rules)
        made.append(guard)
        return guard

    yield make
    for guard in made:
        await guard.aclose()
    if request.param == "redis":
        _delete_prefix(prefix)


@pytest.mark.asyncio
async def test_reserve_settle_and_refuse_until_the_period_ends(
    make_guard: Callable[..., BudgetGuard],
) -> None:
    guard = make_guard([TENANT_DAY])
    assert await guard.reserve(8, None, Decimal("5")) is None  # another tenant: no budget
    first = await guard.reserve(7, None, Decimal("0.60"))
    assert first is not None
    with pytest.raises(BudgetExceeded) as refused:  # 0.60 held + 0.60 > 1.00
        await guard.reserve(7, None, Decimal("0.60"))
    await guard.settle(first, Decimal("0.10"))  # it cost less: the rest is free again
    await guard.settle(first, Decimal("0.10"))  # idempotent
    assert await guard.spent(TENANT_DAY) == Decimal("0.1")
    second = await guard.reserve(7, None, Decimal("0.90"))
    await guard.settle(second, Decimal("0.90"))
    with pytest.raises(BudgetExceeded) as refused:  # exhausted: even a free request waits
        await guard.reserve(7, None, None)
    exc = refused.value
    assert exc.status_code == 429 and exc.reason.value == "budget_exceeded"
    assert exc.headers()["retry-after"] == str(
        int((datetime(2030, 2, 28, tzinfo=UTC) - NOW).total_seconds())
    )
    assert "resets at 2030-02-28T00:00:00Z" in exc.message
    assert "tenant's daily budget of" in exc.message  # the period as people say it
    body = ApiError.from_rejection(exc).body()["error"]
    assert body["code"] == "budget_exceeded" and body["type"] == "rate_limit_exceeded"


@pytest.mark.asyncio
async def test_a_request_dearer_than_the_whole_budget_gets_no_retry_after(
    make_guard: Callable[..., BudgetGuard],
) -> None:
    guard = make_guard([TENANT_DAY])
    with pytest.raises(BudgetExceeded) as refused:
        await guard.reserve(7, None, Decimal("1.01"))
    assert "retry-after" not in refused.value.headers()
    assert "max_tokens" in refused.value.message
    assert "whole daily budget" in refused.value.message


@pytest.mark.asyncio
async def test_tenant_and_key_budgets_are_charged_together_or_not_at_all(
    make_guard: Callable[..., BudgetGuard],
) -> None:
    soft: list[tuple[int, Decimal]] = []
    refused: list[str] = []
    guard = make_guard(
        [TENANT_DAY, KEY_MONTH],
        on_soft=lambda rule, spent: soft.append((rule.budget_id, spent)),
        on_refused=lambda rule: refused.append(rule.scope),
    )
    held = await guard.reserve(7, 70, Decimal("0.30"))
    assert soft == []  # a reservation is not spend
    with pytest.raises(BudgetExceeded):  # the key's 0.50 refuses; the tenant is not charged
        await guard.reserve(7, 70, Decimal("0.30"))
    assert refused == ["key"]
    assert await guard.spent(TENANT_DAY) == Decimal("0.3")
    await guard.settle(held, Decimal("0.20"))
    assert await guard.spent(KEY_MONTH) == Decimal("0.2")
    assert soft == []
    other = await guard.reserve(7, 71, Decimal("0.30"))  # another key: the tenant's only
    assert other is not None and len(other.charges) == 1
    for _ in range(2):  # 0.26, then 0.32 of 0.50: past the soft half, told once
        hold = await guard.reserve(7, 70, Decimal("0.10"))
        await guard.settle(hold, Decimal("0.06"))
    assert soft == [(2, Decimal("0.26"))]


@pytest.mark.asyncio
async def test_a_new_counter_starts_from_what_the_records_show(
    make_guard: Callable[..., BudgetGuard],
) -> None:
    seen: list[tuple[int, datetime]] = []

    def seed(rule: BudgetRule, start: datetime, end: datetime) -> Decimal:
        seen.append((rule.budget_id, start))
        return Decimal("0.95")

    guard = make_guard([TENANT_DAY], seed=seed)
    with pytest.raises(BudgetExceeded):
        await guard.reserve(7, None, Decimal("0.10"))
    await guard.reserve(7, None, Decimal("0.05"))
    assert seen == [(1, datetime(2030, 2, 27, tzinfo=UTC))]  # read once


def _process_burst(url: str, prefix: str, attempts: int, start: Any, results: Any) -> None:
    async def burst() -> tuple[int, int]:
        store = RedisBudgetStore.from_url(url, timeout_s=10.0)
        guard = BudgetGuard(store, prefix=prefix, clock=lambda: NOW)
        guard.set_rules([TENANT_DAY])
        admitted = spent = 0

        async def one(i: int) -> None:
            nonlocal admitted, spent
            try:
                hold = await guard.reserve(7, None, Decimal("0.01"))
            except BudgetExceeded:
                return
            admitted += 1
            cost = Decimal("0.01") if i % 2 else Decimal("0.004")  # some cost less
            spent += int(cost * 1000)
            await guard.settle(hold, cost)

        try:
            await asyncio.gather(*(one(i) for i in range(attempts)))
        finally:
            await guard.aclose()
        return admitted, spent

    start.wait()
    results.put(asyncio.run(burst()))


def test_a_burst_from_four_processes_never_overspends(redis_url: str) -> None:  # noqa: F811
    context = multiprocessing.get_context("spawn")
    processes, attempts = 4, 100  # 400 requests of at most 0.01 against 1.00
    prefix = f"tiergate-test-{uuid.uuid4().hex[:12]}"
    start = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(target=_process_burst, args=(redis_url, prefix, attempts, start, results))
        for _ in range(processes)
    ]
    try:
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=120) for _ in workers]
        for worker in workers:
            worker.join(timeout=30)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
        _delete_prefix(prefix)
    admitted = sum(a for a, _ in outcomes)
    spent_thousandths = sum(s for _, s in outcomes)
    assert spent_thousandths <= 1000  # never past the budget
    assert admitted >= 100  # the settled refunds let more through than 1.00 / 0.01
    assert admitted < processes * attempts


class _Away(MemoryBudgetStore):
    shared = True  # a store other processes share, that can be away

    async def reserve(self, charges: Any, op: str | None = None) -> Any:
        raise ConnectionError("redis is away")

    async def add(self, charges: Any, op: str | None = None) -> Any:
        raise ConnectionError("redis is away")

    async def ping(self) -> None:
        raise ConnectionError("redis is away")


@pytest.mark.asyncio
async def test_an_unreachable_store_degrades_to_this_process_share() -> None:
    """Never fail open: with the store away, ``1/outage_share`` of the budget in process (the
    real Redis outages: ``test_budget_outage.py``)."""
    guard = BudgetGuard(_Away(), clock=lambda: NOW, outage_share=4)
    guard.set_rules([TENANT_DAY])
    try:
        hold = await guard.reserve(7, None, Decimal("0.25"))  # 1.00 / 4
        assert hold is not None and guard.degraded and guard.unavailable == 1
        with pytest.raises(BudgetExceeded) as refused:
            await guard.reserve(7, None, Decimal("0.01"))
        assert "briefly unavailable" in refused.value.message
        await guard.settle(hold, Decimal("0.20"))  # what it gives back is free again
        assert await guard.reserve(7, None, Decimal("0.05")) is not None
        assert guard.unavailable == 1  # decided in process since: no call waits on the store
    finally:
        await guard.aclose()


@pytest.mark.asyncio
async def test_admit_and_charge_price_the_tokens_at_the_models_price(
    make_guard: Callable[..., BudgetGuard],
) -> None:
    book = PriceBook(None)
    book.set({"m": (Decimal("1000"), Decimal("2000"))})  # 0.001 a prompt token, 0.002 an output
    guard = make_guard([TENANT_DAY], prices=book)
    assert await guard.admit(8, None, "m", 10, 10) is None  # no budget: nothing priced
    hold = await guard.admit(7, None, "m", 100, 300)  # at most 0.1 + 0.6
    assert hold is not None and hold.reserved == 700_000_000
    with pytest.raises(BudgetExceeded):
        await guard.admit(7, None, "m", 100, 300)
    await guard.charge(hold, 100, 50)  # 0.1 + 0.1
    assert await guard.spent(TENANT_DAY) == Decimal("0.2")
    free = await guard.admit(7, None, "unpriced", 10**6, 10**6)
    assert free is not None and free.reserved == 0
    await guard.charge(free, 10**6, 10**6)
    assert await guard.spent(TENANT_DAY) == Decimal("0.2")


@pytest.mark.asyncio
async def test_the_soft_threshold_posts_one_notice_to_the_webhook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import httpx

    import gateway.limits.budget as budget_module

    posted: list[tuple[str, dict[str, Any]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append((str(request.url), json.loads(request.content)))
        return httpx.Response(204)

    real = httpx.AsyncClient
    monkeypatch.setattr(
        budget_module.httpx,
        "AsyncClient",
        lambda **kw: real(transport=httpx.MockTransport(handler), **kw),
    )
    rule = BudgetRule(
        3,
        tenant_id=7,
        key_id=None,
        period="day",
        amount=Decimal("1"),
        soft_fraction=0.5,
        webhook_url="http://hooks.example/budget",
    )
    guard = BudgetGuard(MemoryBudgetStore(), clock=lambda: NOW, notify=post_webhook)
    guard.set_rules([rule])
    for _ in range(3):  # 0.3, 0.6, 0.9: past half once
        await guard.settle(await guard.reserve(7, None, Decimal("0.3")), Decimal("0.3"))
    await asyncio.gather(*guard._tasks)
    assert len(posted) == 1
    url, notice = posted[0]
    assert url == "http://hooks.example/budget"
    assert notice["event"] == "budget.soft_threshold" and notice["spent"] == "0.600000000"
    assert notice["resets_at"] == "2030-02-28T00:00:00Z" and notice["scope"] == "tenant"
