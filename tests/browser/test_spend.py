"""Prices, budgets and spend in a real browser, against a real gateway.

The owner sets a model's price on the Prices page, changes it and deletes it; a viewer sees the
same page without a control and is refused the forms it never saw. A priced model's request
shows its exact cost in the usage page's Spend chart and column. The owner creates a tenant's
budget and a key's on the Budgets page, sees what each has spent and its state (the key's
exhausted, and the gateway refusing that key with 429 ``budget_exceeded``), and deletes them; a
tenant admin sees its own tenant's budgets only, without a control.
"""

from __future__ import annotations

import re
import uuid
from decimal import Decimal
from typing import Any

import openai
import pytest
from playwright.sync_api import Browser, Locator, Page, Response, expect
from sqlalchemy import select

from gateway.db import crud
from gateway.db.crud import budgets, operators, prices
from gateway.db.models import ApiKey, AuditLog, Budget, UsageRecord
from gateway.db.money import cost_of
from gateway.db.security import display_prefix
from tests.browser.helpers import PageProblems, form_field, sign_in
from tests.browser.stack import MODEL, SECRET, UiStack, wait_for

pytestmark = pytest.mark.slow

VIEWPORT = {"width": 1280, "height": 800}
OPERATOR_ACTOR = "admin-ui:operator"
NOT_ALLOWED = "Not allowed for your role"


def _unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def _fresh(browser: Browser, stack: UiStack) -> Page:
    context = browser.new_context(base_url=stack.origin, viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(15_000)
    return context.new_page()


def _nav_to(page: Page, label: str) -> None:
    page.get_by_role("navigation", name="Main").get_by_role("link", name=label, exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text(label)


def _write_controls(page: Page) -> list[str]:
    """Every control on the page that would change something: POST forms other than sign-out."""
    forms = page.locator("form[method=post]:not(.logout)")
    return [f.get_attribute("action") or "" for f in forms.all()]


def _csrf(page: Page) -> str:
    token = page.locator('meta[name="csrf-token"]').get_attribute("content")
    assert token
    return token


def _set_price(page: Page, model: str, prompt: str, completion: str) -> None:
    """Set (or change) ``model``'s price through the Prices page's one form."""
    page.goto("/ui/prices")
    form = page.locator("#price-form")
    form_field(page, "Model (as clients name it)").fill(model)
    form_field(page, "Prompt, per 1M tokens").fill(prompt)
    form_field(page, "Completion, per 1M tokens").fill(completion)
    form.get_by_role("button", name="Set price").click()
    page.wait_for_url("**/ui/prices")
    expect(page.locator("#flash")).to_contain_text(f"Price of {model} set.")


def _price_row(page: Page, model: str) -> Any:
    return page.locator("#prices-table tbody tr").filter(
        has=page.get_by_role("rowheader", name=model, exact=True)
    )


def _tenant_with_key(stack: UiStack, stem: str) -> tuple[str, str, str]:
    """A new tenant on the standard tier and a key of its: (tenant, secret, display prefix)."""
    tenant = _unique(stem)
    with stack.session_factory.begin() as session:
        crud.create_tenant(session, actor="test", name=tenant, tier="standard")
        created = crud.create_key(session, actor="test", tenant=tenant, secret=SECRET)
        prefix = display_prefix(created.api_key.prefix)
    return tenant, created.plaintext, prefix


def _chat(stack: UiStack, key: str) -> Any:
    client = openai.OpenAI(base_url=stack.openai_base_url, api_key=key, max_retries=0)
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What does this cost?"}],
        max_tokens=5,
    )


def _records(stack: UiStack, prefix: str) -> list[UsageRecord]:
    with stack.session_factory() as session:
        query = (
            select(UsageRecord)
            .join(ApiKey, ApiKey.id == UsageRecord.api_key_id)
            .where(ApiKey.prefix == prefix.removeprefix("tg-"), UsageRecord.status == "ok")
        )
        return list(session.scalars(query))


def _charged(stack: UiStack, secret: str, prefix: str) -> Decimal:
    """Make one request with the key, wait for its usage record, and return what it cost —
    checked against the price set in this module (so the record was charged, not left empty)."""
    before = len(_records(stack, prefix))
    reply = _chat(stack, secret)
    assert reply.usage is not None
    wait_for(lambda: len(_records(stack, prefix)) > before, "the usage writer to store it")
    record = max(_records(stack, prefix), key=lambda r: r.id)
    expected = cost_of(
        reply.usage.prompt_tokens, reply.usage.completion_tokens, *MODEL_PRICE_DECIMAL
    )
    assert record.cost is not None and record.cost == expected, (record.cost, expected)
    return record.cost


MODEL_PRICE = ("1000", "2000")
"""What :data:`~tests.browser.stack.MODEL` costs in this module's usage and budget tests: high
enough that one short request costs a few hundredths."""
MODEL_PRICE_DECIMAL = (Decimal(MODEL_PRICE[0]), Decimal(MODEL_PRICE[1]))


# ---- prices ---------------------------------------------------------------------------------


def test_the_owner_sets_changes_and_deletes_a_price(
    signed_in: Page, stack: UiStack, page_problems: PageProblems
) -> None:
    page = signed_in
    model = _unique("browser-model")
    _nav_to(page, "Prices")

    _set_price(page, model, "0.15", "0.6")
    row = _price_row(page, model)
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(0)).to_have_text("0.150000")
    expect(row.locator("td").nth(1)).to_have_text("0.600000")

    _set_price(page, model, "0.2", "1.25")  # the same form changes a price it has
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(0)).to_have_text("0.200000")
    expect(row.locator("td").nth(1)).to_have_text("1.250000")
    with stack.session_factory() as session:
        stored = prices.get_price(session, model)
        assert (stored.prompt_per_mtok, stored.completion_per_mtok) == (
            Decimal("0.2"),
            Decimal("1.25"),
        )
        price_id = stored.id

    # more than six decimals: refused above the form, what was typed kept, nothing changed
    form_field(page, "Model (as clients name it)").fill(model)
    form_field(page, "Prompt, per 1M tokens").fill("0.1234567")
    form_field(page, "Completion, per 1M tokens").fill("1")
    with page.expect_response(lambda r: r.url.endswith("/ui/prices/-/new")) as answer:
        page.get_by_role("button", name="Set price").click()
    assert answer.value.status == 400
    expect(page.locator("#error-form")).to_contain_text("prompt_per_mtok")
    expect(form_field(page, "Prompt, per 1M tokens")).to_have_value("0.1234567")
    expect(_price_row(page, model).locator("td").nth(0)).to_have_text("0.200000")

    page.goto("/ui/prices")
    _price_row(page, model).get_by_role("button", name="Delete").click()
    page.wait_for_url("**/ui/prices")
    expect(page.locator("#flash")).to_contain_text(f"Price of {model} deleted.")
    expect(_price_row(page, model)).to_have_count(0)
    with stack.session_factory() as session:
        assert prices.find_price(session, model) is None
        actions = list(
            session.scalars(
                select(AuditLog.action)
                .where(AuditLog.entity_type == "price", AuditLog.entity_id == str(price_id))
                .where(AuditLog.actor == OPERATOR_ACTOR)
                .order_by(AuditLog.id)
            )
        )
    assert actions == ["create", "update", "delete"], actions
    assert page_problems.unexpected("status of 400 (Bad Request)") == []


def test_a_viewer_sees_prices_and_budgets_without_controls_and_cannot_post(
    signed_in: Page, browser: Browser, stack: UiStack
) -> None:
    model = _unique("viewer-model")
    tenant, _, _ = _tenant_with_key(stack, "viewed")
    with stack.session_factory.begin() as session:
        prices.create_price(
            session, actor="test", model=model, prompt_per_mtok="1", completion_per_mtok="2"
        )
        budget_id = budgets.create_budget(
            session, actor="test", tenant=tenant, period="month", amount="50"
        ).id
        credential = operators.create_credential(
            session, actor="test", secret=SECRET, name=_unique("vera"), role="viewer"
        ).plaintext

    # the owner's pages have the controls: the checks below are not vacuous
    owner = signed_in
    for path in ("/ui/prices", "/ui/budgets"):
        owner.goto(path)
        assert _write_controls(owner), path

    viewer = _fresh(browser, stack)
    sign_in(viewer, credential)
    viewer.wait_for_url("**/ui/")
    _nav_to(viewer, "Prices")
    expect(_price_row(viewer, model)).to_have_count(1)
    expect(viewer.locator("#price-form")).to_have_count(0)
    assert _write_controls(viewer) == []
    _nav_to(viewer, "Budgets")
    expect(viewer.locator("#budgets-table")).to_contain_text(tenant)
    expect(viewer.locator("#budget-form")).to_have_count(0)
    assert _write_controls(viewer) == []

    # the forms it never saw, posted with its own session's token, are refused
    token = _csrf(viewer)
    posts = {
        "/ui/prices/-/new": {"model": model, "prompt_per_mtok": "0", "completion_per_mtok": "0"},
        f"/ui/prices/{model}/delete": {},
        "/ui/budgets/-/new": {"tenant": tenant, "period": "day", "amount": "1"},
        f"/ui/budgets/{budget_id}/delete": {},
    }
    for path, form in posts.items():
        refused = viewer.request.post(path, form={**form, "csrf_token": token}, max_redirects=0)
        assert refused.status == 403, (path, refused.status)
        assert NOT_ALLOWED in refused.text()
    with stack.session_factory() as session:
        stored = prices.get_price(session, model)
        assert stored.prompt_per_mtok == Decimal("1")
        tenant_id = crud.get_tenant(session, tenant).id
        assert [b.id for b in budgets.list_budgets(session, tenant=tenant_id)] == [budget_id]
    viewer.context.close()


# ---- spend in the usage page ------------------------------------------------------------------


def _points(series: dict[str, Any], chart: str) -> list[float]:
    (found,) = [c for c in series["charts"] if c["id"] == chart]
    return [v for line in found["series"] for v in line["data"] if v]


def test_a_priced_models_usage_shows_its_cost(
    signed_in: Page, stack: UiStack, page_problems: PageProblems
) -> None:
    page = signed_in
    _set_price(page, MODEL, *MODEL_PRICE)
    tenant, secret, prefix = _tenant_with_key(stack, "spender")
    cost = _charged(stack, secret, prefix)
    assert cost > 0

    _nav_to(page, "Usage")
    filters = page.locator("#usage-filters")
    filters.get_by_label("Tenant").fill(tenant)
    filters.get_by_label("Group by").select_option("key")
    with page.expect_response(
        lambda r: "/ui/usage/series.json" in r.url and f"tenant={tenant}" in r.url
    ) as answer:
        filters.get_by_role("button", name="Show").click()
    response: Response = answer.value
    assert response.status == 200
    series = response.json()
    assert series["group_by"] == "key"
    assert _points(series, "spend") == [pytest.approx(float(cost))]
    (spend,) = [c for c in series["charts"] if c["id"] == "spend"]
    assert [line["label"] for line in spend["series"]] == [prefix]
    expect(page.locator("#usage-charts")).to_have_attribute("data-drawn", "true")
    expect(page.locator("#chart-spend canvas")).to_have_count(1)
    expect(page.locator("#chart-spend")).to_have_attribute("data-points", str(len(series["x"])))

    row = page.locator("#usage-table tbody tr", has_text=prefix)
    expect(row).to_have_count(1)
    expect(row.locator("td.spend")).to_have_text(f"{cost.quantize(Decimal('0.000001')):,f}")
    expect(page.locator("#usage-table thead")).to_contain_text("Spend")
    assert page_problems.all() == []


# ---- budgets ----------------------------------------------------------------------------------


def _budget_row(page: Page, tenant: str, key: str | None) -> Any:
    rows = page.locator("#budgets-table tbody tr").filter(
        has=page.get_by_role("rowheader", name=tenant, exact=True)
    )
    key_cell = re.compile(f"^{re.escape(key)}$" if key else "^—$")
    return rows.filter(has=page.locator("td:first-of-type", has_text=key_cell))


def _amount(cell: Locator) -> Decimal:
    """A money cell's value (the page writes exact decimal text)."""
    return Decimal(cell.inner_text().strip().replace(",", ""))


def _create_budget(page: Page, *, tenant: str, key: str = "", amount: str, soft: str) -> None:
    page.goto("/ui/budgets")
    form_field(page, "Tenant").fill(tenant)
    form_field(page, "API key (prefix)").fill(key)
    page.get_by_label("Period").select_option("day")
    form_field(page, "Amount").fill(amount)
    form_field(page, "Soft threshold (0-1)").fill(soft)
    page.locator("#budget-form").get_by_role("button", name="Create budget").click()
    page.wait_for_url("**/ui/budgets")
    expect(page.locator("#flash")).to_contain_text(re.compile(r"Budget \d+ created\."))


def test_the_owner_creates_budgets_sees_their_spend_and_deletes_them(
    signed_in: Page, stack: UiStack, page_problems: PageProblems
) -> None:
    page = signed_in
    _set_price(page, MODEL, *MODEL_PRICE)
    tenant, secret, prefix = _tenant_with_key(stack, "budgeted")
    _nav_to(page, "Budgets")

    # the tenant's budget: room for many requests, warned at 1%
    _create_budget(page, tenant=tenant, amount="1", soft="0.01")
    row = _budget_row(page, tenant, None)
    expect(row).to_have_count(1)
    cells = row.locator("td")
    expect(cells.nth(1)).to_have_text("day")
    assert _amount(cells.nth(2)) == Decimal("1")
    assert _amount(cells.nth(3)) == 0  # nothing spent yet
    expect(cells.nth(4)).to_have_text("ok")
    expect(cells.nth(5)).to_have_text("1.0%")

    spent = sum((_charged(stack, secret, prefix) for _ in range(3)), Decimal(0))
    assert Decimal("0.01") <= spent < Decimal("1")  # past the soft threshold, under the amount
    page.reload()
    expect(row).to_have_count(1)
    assert _amount(cells.nth(3)) == spent  # exactly what the usage records were charged
    expect(cells.nth(4)).to_have_text("soft")

    # the key's budget, under what it spent today but with room for one request's maximum
    # cost: exhausted, and the gateway refuses the key until the day ends
    amount = (spent * 3 / 4).quantize(Decimal("0.000001"))
    _create_budget(page, tenant=tenant, key=prefix, amount=str(amount), soft="")
    key_row = _budget_row(page, tenant, prefix)
    expect(key_row).to_have_count(1)
    assert _amount(key_row.locator("td").nth(2)) == amount
    assert _amount(key_row.locator("td").nth(3)) == spent
    expect(key_row.locator("td").nth(4)).to_have_text("exhausted")
    with pytest.raises(openai.RateLimitError) as refused:
        _chat(stack, secret)
    assert refused.value.status_code == 429
    assert refused.value.code == "budget_exceeded", refused.value.body
    assert "resets at" in refused.value.message
    assert float(refused.value.response.headers["retry-after"]) > 0

    # delete both through their rows' buttons
    for key in (prefix, None):
        _budget_row(page, tenant, key).get_by_role("button", name="Delete").click()
        page.wait_for_url("**/ui/budgets")
        expect(page.locator("#flash")).to_contain_text(re.compile(r"Budget \d+ deleted\."))
        expect(_budget_row(page, tenant, key)).to_have_count(0)
    with stack.session_factory() as session:
        tenant_id = crud.get_tenant(session, tenant).id
        assert budgets.list_budgets(session, tenant=tenant_id) == []
    # nothing limits the key any more
    assert _chat(stack, secret).usage is not None
    assert page_problems.all() == []


def test_a_tenant_admin_sees_only_its_tenants_budgets(browser: Browser, stack: UiStack) -> None:
    own, _, own_key = _tenant_with_key(stack, "mine")
    other, _, other_key = _tenant_with_key(stack, "theirs")
    with stack.session_factory.begin() as session:
        for tenant, key in ((own, own_key), (other, other_key)):
            budgets.create_budget(session, actor="test", tenant=tenant, period="month", amount="5")
            budgets.create_budget(session, actor="test", key=key, period="day", amount="1")
        other_budget = budgets.list_budgets(session, tenant=crud.get_tenant(session, other).id)[
            0
        ].id
        credential = operators.create_credential(
            session,
            actor="test",
            secret=SECRET,
            name=_unique("tina"),
            role="tenant_admin",
            tenant=crud.get_tenant(session, own).id,
        ).plaintext

    page = _fresh(browser, stack)
    sign_in(page, credential)
    page.wait_for_url("**/ui/keys")
    _nav_to(page, "Budgets")
    rows = page.locator("#budgets-table tbody tr")
    expect(rows).to_have_count(2)
    for text in rows.all_inner_texts():
        assert own in text and other not in text, text
    expect(_budget_row(page, own, own_key)).to_have_count(1)
    expect(page.locator("#budgets-table")).not_to_contain_text(other_key)
    assert _write_controls(page) == []

    # another tenant's budget cannot be deleted, nor a budget created, nor prices read
    token = _csrf(page)
    for path, form in (
        (f"/ui/budgets/{other_budget}/delete", {}),
        ("/ui/budgets/-/new", {"tenant": own, "period": "day", "amount": "100"}),
    ):
        refused = page.request.post(path, form={**form, "csrf_token": token}, max_redirects=0)
        assert refused.status == 403, (path, refused.status)
    with stack.session_factory() as session:
        assert session.get(Budget, other_budget) is not None
        assert len(budgets.list_budgets(session, tenant=crud.get_tenant(session, own).id)) == 2
    page.goto("/ui/prices")
    expect(page.get_by_role("heading", level=1)).to_have_text(NOT_ALLOWED)
    page.context.close()
