"""The Requests page in a real browser, against a real gateway.

Requests served and refused by the gateway appear newest first with their outcome and, for a
missed SLO, the reason in words; the "Missed only" and "Why missed" filters narrow the list;
the "Older" link pages through more rows than a page holds without losing or repeating one; a
tenant admin sees its own tenant's rows only and is refused another tenant's filter.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy import insert, select

from gateway.app.accounting import MISS_WORDS
from gateway.app.ui.requests import PAGE_ROWS
from gateway.db import crud
from gateway.db.crud import operators
from gateway.db.models import RequestLog, utcnow
from tests.browser.helpers import sign_in
from tests.browser.stack import MODEL, SECRET, UiStack

pytestmark = pytest.mark.slow

VIEWPORT = {"width": 1280, "height": 800}
WHY_MISSED = 15
"""The "Why missed" column's index in ``#requests-table`` (the last of 16)."""
OUTCOME = 6
SLO = 14


def _unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def _fresh(browser: Browser, stack: UiStack) -> Page:
    context = browser.new_context(base_url=stack.origin, viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(15_000)
    return context.new_page()


def _tenant(stack: UiStack, stem: str, tier: str = "standard") -> tuple[str, int, str]:
    """A new tenant on ``tier`` and a key of its: (name, id, secret)."""
    name = _unique(stem)
    with stack.session_factory.begin() as session:
        tenant = crud.create_tenant(session, actor="test", name=name, tier=tier)
        secret = crud.create_key(session, actor="test", tenant=name, secret=SECRET).plaintext
        return name, tenant.id, secret


def _chat(stack: UiStack, key: str, content: str, max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    return httpx.post(
        f"{stack.openai_base_url}/chat/completions",
        json={**body, "max_tokens": max_tokens},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def _logged(stack: UiStack, tenant_id: int) -> list[RequestLog]:
    """The tenant's log rows, newest first, once the usage writer has stored what it holds."""
    assert stack.gateway.state.usage_writer.flush(timeout=30)
    with stack.session_factory() as session:
        query = (
            select(RequestLog)
            .where(RequestLog.tenant_id == tenant_id)
            .order_by(RequestLog.id.desc())
        )
        return list(session.scalars(query))


def _shown_ids(page: Page) -> list[int]:
    """The ids of the rows the table shows, top to bottom."""
    ids = page.locator("#requests-table tbody tr").evaluate_all("rows => rows.map(r => r.id)")
    return [int(i.removeprefix("request-")) for i in ids]


def _open(page: Page, query: str) -> None:
    page.goto(f"/ui/requests{query}")
    expect(page.get_by_role("heading", level=1)).to_have_text("Requests")


def test_served_and_refused_requests_show_newest_first_with_why_missed(
    signed_in: Page, stack: UiStack
) -> None:
    strict = _unique("strict")
    with stack.session_factory.begin() as session:
        crud.create_tier(session, actor="test", name=strict, weight=3.0, ttft_ms=20.0, tpot_ms=50.0)
    tenant, tenant_id, key = _tenant(stack, "served", tier=strict)
    quiet_name, quiet_id, standard_key = _tenant(stack, "quiet")
    served = _chat(stack, standard_key, "Say something.", 4)
    assert served.status_code == 200, served.text
    # the strict tier's 20 ms TTFT is out of reach for a 32k-character prompt: shed, hopeless
    shed = _chat(stack, key, "x" * 32_000, 2)
    assert shed.status_code == 503, shed.text
    small = _chat(stack, key, "Hi.", 2)  # served after it: the newest row
    assert small.status_code in (200, 503), small.text
    rows = _logged(stack, tenant_id)
    (quiet_row,) = _logged(stack, quiet_id)
    assert quiet_row.status == "ok"
    assert len(rows) == 2, [(r.status, r.reject_reason) for r in rows]
    newest, hopeless = rows
    assert (hopeless.status, hopeless.miss_reason) == ("rejected", "hopeless")

    page = signed_in
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Requests").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Requests")
    # everyone's log, newest first: this tenant's two rows at its top (nothing came after)
    shown = _shown_ids(page)
    assert shown == sorted(shown, reverse=True), shown
    assert shown[:2] == [newest.id, hopeless.id], (shown[:3], newest.id, hopeless.id)

    cells = page.locator(f"#request-{hopeless.id} td")
    expect(cells.nth(1)).to_have_text(tenant)
    expect(cells.nth(OUTCOME)).to_contain_text("rejected")
    expect(cells.nth(OUTCOME)).to_contain_text("503")
    expect(cells.nth(OUTCOME)).to_contain_text("slo_infeasible")
    expect(cells.nth(SLO)).to_have_text("—")  # refused: no attainment sample
    expect(cells.nth(WHY_MISSED)).to_have_text(MISS_WORDS["hopeless"])
    assert cells.nth(0).get_attribute("title") == hopeless.request_id

    # the standard tenant's served request: its outcome, and the SLO verdict the log holds
    _open(page, "?status=ok")
    quiet = page.locator(f"#request-{quiet_row.id} td")
    expect(quiet.nth(1)).to_have_text(quiet_name)
    expect(quiet.nth(OUTCOME)).to_contain_text("ok")
    expect(quiet.nth(OUTCOME)).to_contain_text("200")
    expect(quiet.nth(SLO)).to_have_text(
        {True: "met", False: "missed", None: "—"}[quiet_row.slo_met]
    )

    # "Missed only" through the form: the hopeless row stays, the served row goes
    _open(page, "")
    page.get_by_label("Missed only").check()
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/ui/requests?*missed=1*")
    shown_missed = _shown_ids(page)
    assert hopeless.id in shown_missed
    assert newest.id not in shown_missed or newest.miss_reason is not None
    for reason in page.locator("#requests-table tbody tr td:last-child").all_inner_texts():
        assert reason != "—", reason
    assert (quiet_row.id in shown_missed) == (quiet_row.miss_reason is not None)
    # "Why missed": a reason no row has leaves the list empty, in words
    page.get_by_label("Why missed").select_option("failover")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**reason=failover*")
    expect(page.locator(f"#request-{hopeless.id}")).to_have_count(0)


def _log_rows(tenant_id: int, count: int, stem: str) -> list[dict[str, object]]:
    """``count`` log rows of a tenant, oldest first; every third one missed, queued."""
    now = utcnow()
    return [
        {
            "request_id": f"{stem}-{i:03d}",
            "tenant_id": tenant_id,
            "model": MODEL,
            "status": "ok",
            "http_status": 200,
            "attempts": 1,
            "gain": 0.0,
            "ideal_gain": 1.0,
            "slo_met": i % 3 != 0,
            "miss_reason": "queued" if i % 3 == 0 else None,
            "created_at": now - timedelta(seconds=count - i),
        }
        for i in range(count)
    ]


def test_older_pages_filters_and_a_tenant_admin_sees_only_its_own(
    signed_in: Page, browser: Browser, stack: UiStack
) -> None:
    own, own_id, _ = _tenant(stack, "paged")
    other, other_id, _ = _tenant(stack, "other")
    count = PAGE_ROWS + 7
    with stack.session_factory.begin() as session:
        session.execute(insert(RequestLog), _log_rows(own_id, count, own))
        session.execute(insert(RequestLog), _log_rows(other_id, 3, other))
        ids = list(
            session.scalars(
                select(RequestLog.id)
                .where(RequestLog.tenant_id == own_id)
                .order_by(RequestLog.id.desc())
            )
        )
        other_request = f"{other}-002"
        credential = operators.create_credential(
            session,
            actor="test",
            secret=SECRET,
            name=_unique("tara"),
            role="tenant_admin",
            tenant=own_id,
        ).plaintext
    assert len(ids) == count

    # the owner: one tenant's rows, a full page newest first, then "Older" for the rest
    page = signed_in
    _open(page, "")
    page.get_by_label("Tenant").fill(own)
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(f"**tenant={own}*")
    assert _shown_ids(page) == ids[:PAGE_ROWS]
    expect(page.get_by_role("link", name="← Newest")).to_have_count(0)
    page.get_by_role("link", name="Older →").click()
    page.wait_for_url("**before=*")
    assert _shown_ids(page) == ids[PAGE_ROWS:]
    expect(page.get_by_role("link", name="Older →")).to_have_count(0)  # the last page
    page.get_by_role("link", name="← Newest").click()
    assert _shown_ids(page) == ids[:PAGE_ROWS]

    # missed only: every third row, all queued, in words
    missed = [i for i, n in zip(ids, range(count - 1, -1, -1), strict=True) if n % 3 == 0]
    _open(page, f"?tenant={own}&missed=1")
    assert _shown_ids(page) == missed
    reasons = page.locator("#requests-table tbody tr td:last-child").all_inner_texts()
    assert reasons == [MISS_WORDS["queued"]] * len(missed)
    _open(page, f"?tenant={own}&reason=queued")
    assert _shown_ids(page) == missed
    _open(page, f"?tenant={own}&reason=stalled")
    expect(page.locator("#requests-table")).to_have_count(0)
    expect(page.locator(".empty")).to_contain_text("No request matches these filters.")

    # a tenant admin: its own rows without a filter, never another tenant's
    admin = _fresh(browser, stack)
    sign_in(admin, credential)
    admin.wait_for_url("**/ui/keys")
    _open(admin, "")
    assert _shown_ids(admin) == ids[:PAGE_ROWS]
    expect(admin.locator(f'#requests-table td[title="{other_request}"]')).to_have_count(0)
    for text in admin.locator("#requests-table tbody tr").all_inner_texts():
        assert other not in text, text
    admin.get_by_role("link", name="Older →").click()
    admin.wait_for_url("**before=*")
    assert _shown_ids(admin) == ids[PAGE_ROWS:]
    for ref in (other, str(other_id)):
        refused = admin.goto(f"/ui/requests?tenant={ref}")
        assert refused is not None and refused.status == 403, (ref, refused and refused.status)
        expect(admin.locator("#requests-table")).to_have_count(0)
        assert other_request not in admin.content()
    admin.context.close()
