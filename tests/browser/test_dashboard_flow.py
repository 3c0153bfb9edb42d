"""What an operator does on the dashboard, in a real browser, against a real gateway.

Sign in with the credential ``tiergate serve`` printed; create a tier, a tenant on it and a key
for the tenant through the forms; see the key's secret once; call ``/v1`` with it through the
official ``openai`` client; find that request in the usage page, its chart drawn from the
series the page loaded; revoke the key and watch the same client get 401; find every change in
the audit log under ``admin-ui:<operator>``. And the refusals: a bad value shown beside its
field, a POST without the CSRF token (403, nothing changed), a tenant key at sign-in, a session
after sign-out.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import openai
import pytest
from playwright.sync_api import Page, Response, expect
from sqlalchemy import func, or_, select

from gateway.db.models import ApiKey, AuditLog, Tenant, Tier, UsageRecord
from tests.browser.helpers import CREDENTIAL_LABEL, PageProblems, form_field, sign_in
from tests.browser.stack import MODEL, UiStack, wait_for

pytestmark = pytest.mark.slow

OPERATOR_ACTOR = "admin-ui:operator"  # the credential `tiergate serve` issues is "operator"'s


def _unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def _nav_to(page: Page, label: str) -> None:
    page.get_by_role("navigation", name="Main").get_by_role("link", name=label, exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile(f"^{label}"))


def _create_tier(page: Page, name: str) -> None:
    _nav_to(page, "Tiers")
    page.get_by_role("link", name="New tier").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("New tier")
    form_field(page, "Name").fill(name)
    form_field(page, "Weight").fill("3")
    form_field(page, "TTFT ms").fill("1500")
    form_field(page, "TPOT ms").fill("80")
    page.get_by_label("Requests per minute").fill("600")
    page.get_by_label("Shed slack").fill("0")
    page.get_by_role("button", name="Create tier").click()
    page.wait_for_url("**/ui/tiers")
    expect(page.locator("#flash")).to_contain_text(f"Tier {name} created")
    row = page.locator("#tiers-table tbody tr", has=page.get_by_role("link", name=name, exact=True))
    expect(row).to_contain_text("1,500")  # the TTFT typed, as the list shows it
    expect(row).to_contain_text("600")


def _create_tenant(page: Page, name: str, tier: str) -> None:
    _nav_to(page, "Tenants")
    page.get_by_role("link", name="New tenant").click()
    form_field(page, "Name").fill(name)
    form_field(page, "Tier").select_option(tier)
    page.get_by_role("button", name="Create tenant").click()
    page.wait_for_url("**/ui/tenants")
    expect(page.locator("#flash")).to_contain_text(f"Tenant {name} created")
    expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()


def _create_key(page: Page, tenant: str, name: str) -> tuple[str, str]:
    """Create a key through the form; returns its secret (shown this once) and prefix."""
    _nav_to(page, "Keys")
    form = page.locator("form[action='/ui/keys/new']")
    form.get_by_label("Tenant").fill(tenant)
    form.get_by_label("Key name").fill(name)
    form.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-secret").inner_text().strip()
    prefix = page.locator("#new-prefix").inner_text().strip()
    assert secret.startswith("tg-") and prefix and prefix in secret
    return secret, prefix


def _chat(stack: UiStack, key: str) -> Any:
    client = openai.OpenAI(base_url=stack.openai_base_url, api_key=key, max_retries=0)
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello from the browser test."}],
        max_tokens=5,
    )


def _usage_recorded(stack: UiStack, prefix: str) -> bool:
    with stack.session_factory() as session:
        query = (
            select(func.count())
            .select_from(UsageRecord)
            .join(ApiKey, ApiKey.id == UsageRecord.api_key_id)
            .where(ApiKey.prefix == prefix, UsageRecord.status == "ok")
        )
        return bool(session.scalar(query))


def _points(series: dict[str, Any], chart: str) -> list[float]:
    """The non-empty values of one chart in a series.json answer, every line together."""
    (found,) = [c for c in series["charts"] if c["id"] == chart]
    return [v for line in found["series"] for v in line["data"] if v]


def test_operator_flow(stack: UiStack, signed_in: Page, page_problems: PageProblems) -> None:
    page = signed_in
    tier, tenant = _unique("gold"), _unique("acme")
    expect(page.locator("#flash")).to_contain_text("Signed in as operator")

    # ---- create a tier, a tenant on it and a key, through the forms ----------------------
    _create_tier(page, tier)
    _create_tenant(page, tenant, tier)
    secret, prefix = _create_key(page, tenant, "browser-test")
    db_prefix = prefix.removeprefix("tg-")  # the list shows "tg-<prefix>"

    # ---- the secret is shown once: not on a reload, the key's page or the list -------------
    with page.expect_response(lambda r: r.url.endswith("/ui/keys/new")) as reloaded:
        page.reload()  # re-posts the form: 409, no second key (tests/browser/test_key_resubmit)
    assert reloaded.value.status == 409
    assert secret not in page.content()
    page.goto(f"/ui/keys/{prefix}")
    expect(page.get_by_role("heading", level=1)).to_contain_text(prefix)
    assert secret not in page.content()
    page.goto(f"/ui/keys?tenant={tenant}")
    expect(page.locator("#keys-table")).to_contain_text(prefix)
    assert secret not in page.content()

    # ---- the key works with the official client ------------------------------------------
    reply = _chat(stack, secret)
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    wait_for(lambda: _usage_recorded(stack, db_prefix), "the usage writer to store the request")

    # ---- the request is in the usage page, its chart drawn from the series -------------------
    _nav_to(page, "Usage")
    charts = page.locator("#usage-charts")
    expect(charts).to_have_attribute("data-drawn", "true")  # the unfiltered page's own load
    filters = page.locator("#usage-filters")
    filters.get_by_label("Tenant").fill(tenant)
    filters.get_by_label("Group by").select_option("tenant")
    with page.expect_response(
        lambda r: "/ui/usage/series.json" in r.url and f"tenant={tenant}" in r.url
    ) as answer:
        filters.get_by_role("button", name="Show").click()
    response: Response = answer.value
    assert response.status == 200
    series = response.json()
    assert series["requests"] == 1 and series["x"]
    assert _points(series, "requests") == [1]
    assert sum(_points(series, "tokens")) == reply.usage.total_tokens
    expect(charts).to_have_attribute("data-drawn", "true")
    expect(page.locator("#chart-requests canvas")).to_have_count(1)
    expect(page.locator("#chart-requests")).to_have_attribute("data-points", str(len(series["x"])))
    totals = page.locator("#usage-table tbody tr", has_text=tenant)
    expect(totals).to_have_count(1)
    expect(totals.locator("td").nth(1)).to_have_text("1")  # Requests

    # ---- revoke: the same client now gets 401 ---------------------------------------------
    page.goto(f"/ui/keys?tenant={tenant}")
    page.get_by_role("button", name=f"Revoke {prefix}").click()
    page.wait_for_url(f"**/ui/keys/{prefix}")
    expect(page.locator("#flash")).to_contain_text(f"Key {prefix} revoked")
    with pytest.raises(openai.AuthenticationError) as refused:
        _chat(stack, secret)
    assert refused.value.status_code == 401

    # ---- every change is in the audit log, made by the signed-in operator -------------------
    with stack.session_factory() as session:
        ids = {
            "tier": session.scalar(select(Tier.id).where(Tier.name == tier)),
            "tenant": session.scalar(select(Tenant.id).where(Tenant.name == tenant)),
            "api_key": session.scalar(select(ApiKey.id).where(ApiKey.prefix == db_prefix)),
        }
        actors = set(
            session.scalars(
                select(AuditLog.actor).where(
                    or_(
                        *(
                            (AuditLog.entity_type == kind) & (AuditLog.entity_id == str(id_))
                            for kind, id_ in ids.items()
                        )
                    )
                )
            )
        )
    assert actors == {OPERATOR_ACTOR}, actors
    _nav_to(page, "Audit")
    page.get_by_label("Actor").fill(OPERATOR_ACTOR)
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"/ui/audit\?.*actor="))
    rows = page.locator("#audit-table tbody tr")
    for kind, action in (
        ("tier", "create"),
        ("tenant", "create"),
        ("api_key", "create"),
        ("api_key", "revoke"),
    ):
        row = rows.filter(
            has=page.get_by_role("link", name=f"{kind} {ids[kind]}", exact=True)
        ).filter(has=page.locator(".badge", has_text=re.compile(f"^{action}$")))
        expect(row).to_have_count(1)
        expect(row.locator("td").nth(1)).to_have_text(OPERATOR_ACTOR)
    expect(rows.filter(has_text=tier).first).to_be_visible()  # the changes show the names
    assert page_problems.unexpected("status of 409 (Conflict)") == []  # the reload's 409


def test_a_bad_value_is_shown_beside_its_field(signed_in: Page, stack: UiStack) -> None:
    page = signed_in
    name = _unique("bad")
    page.goto("/ui/tiers/-/new")
    form_field(page, "Name").fill(name)
    form_field(page, "Weight").fill("-2")
    form_field(page, "TTFT ms").fill("1500")
    form_field(page, "TPOT ms").fill("80")
    with page.expect_response(lambda r: r.url.endswith("/ui/tiers/-/new")) as answer:
        page.get_by_role("button", name="Create tier").click()
    assert answer.value.status == 400
    error = page.locator("#error-weight")
    expect(error).to_have_attribute("role", "alert")
    expect(error).to_contain_text("weight")
    weight = form_field(page, "Weight")
    expect(weight).to_have_attribute("aria-invalid", "true")
    expect(weight).to_have_value("-2")  # what was typed is kept
    expect(form_field(page, "Name")).to_have_value(name)
    with stack.session_factory() as session:
        assert session.scalar(select(Tier).where(Tier.name == name)) is None


def _tier_form(name: str) -> dict[str, str | float | bool]:
    return {"name": name, "weight": "2", "ttft_ms": "1000", "tpot_ms": "50", "shed_slack": "0"}


def test_a_post_without_the_csrf_token_is_refused(signed_in: Page, stack: UiStack) -> None:
    page = signed_in
    name = _unique("csrf")
    refused = page.request.post("/ui/tiers/-/new", form=_tier_form(name), max_redirects=0)
    assert refused.status == 403
    assert "CSRF" in refused.text()
    wrong = page.request.post(
        "/ui/tiers/-/new",
        form={**_tier_form(name), "csrf_token": "not-the-token"},
        headers={"x-csrf-token": "not-the-token"},
        max_redirects=0,
    )
    assert wrong.status == 403
    with stack.session_factory() as session:
        assert session.scalar(select(Tier).where(Tier.name == name)) is None
    page.goto("/ui/tiers")
    expect(page.get_by_role("link", name=name, exact=True)).to_have_count(0)
    # the same request with the session's token is accepted: the token was what was missing
    token = page.locator('meta[name="csrf-token"]').get_attribute("content")
    assert token
    accepted = page.request.post(
        "/ui/tiers/-/new", form={**_tier_form(name), "csrf_token": token}, max_redirects=0
    )
    assert accepted.status == 303, accepted.text()
    with stack.session_factory() as session:
        assert session.scalar(select(Tier).where(Tier.name == name)) is not None


def test_a_tenant_key_cannot_sign_in(page: Page, stack: UiStack) -> None:
    with page.expect_response(
        lambda r: r.url.endswith("/ui/login") and r.request.method == "POST"
    ) as answer:
        sign_in(page, stack.tenant_key)
    assert answer.value.status == 401
    error = page.locator("#error-credential")
    expect(error).to_have_attribute("role", "alert")
    expect(error).to_contain_text("tenant API key")
    expect(page.get_by_label(CREDENTIAL_LABEL)).to_have_attribute("aria-invalid", "true")
    assert not [c for c in page.context.cookies() if c["name"] == "tiergate_session"]
    page.goto("/ui/tenants")
    page.wait_for_url(re.compile(r"/ui/login\?next="))
    expect(page.get_by_role("heading", level=1)).to_have_text("Sign in")


def test_the_admin_key_signs_in_and_sign_out_ends_the_session(
    page: Page, stack: UiStack, page_problems: PageProblems
) -> None:
    sign_in(page, stack.admin_key)
    page.wait_for_url("**/ui/")
    expect(page.locator(".who")).to_have_text("admin-key")
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "tiergate_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] in ("Lax", "Strict")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/ui/login")
    expect(page.locator("#flash")).to_contain_text("Signed out")
    page.goto("/ui/keys")
    page.wait_for_url(re.compile(r"/ui/login\?next=/ui/keys"))
    # the old cookie, replayed, is dead on the server too (not only forgotten by the browser)
    replay = page.context.request.get(
        stack.url("/ui/keys"),
        headers={"cookie": f"tiergate_session={cookie['value']}"},
        max_redirects=0,
    )
    assert replay.status == 303
    assert replay.headers["location"].startswith("/ui/login")
    assert page_problems.all() == []
