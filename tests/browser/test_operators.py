"""Named operators in a real browser: the owner adds a viewer on the Operators page and hands
over the credential shown once; the viewer signs in and finds every page without a write
control; a tenant admin signs in to its tenant's keys, with a navigation of its own pages
only, and is refused another page with the dashboard's error page."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import Browser, Page, expect

from gateway.db import crud
from gateway.db.crud import operators
from tests.browser.helpers import PageProblems, form_field, sign_in
from tests.browser.stack import SECRET, UiStack

pytestmark = pytest.mark.slow

VIEWPORT = {"width": 1280, "height": 800}


def _unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def _nav(page: Page) -> list[str]:
    links = page.get_by_role("navigation", name="Main").get_by_role("link")
    return [name.strip() for name in links.all_inner_texts()]


def _fresh(browser: Browser, stack: UiStack) -> Page:
    context = browser.new_context(base_url=stack.origin, viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(15_000)
    return context.new_page()


def _write_controls(page: Page) -> list[str]:
    """Every control on the page that would change something: POST forms other than sign-out,
    and the links to the create and import forms."""
    forms = page.locator("form[method=post]:not(.logout)")
    links = page.locator("a[href$='/-/new'], a[href$='/-/import']")
    return [f.get_attribute("action") or "" for f in forms.all()] + [
        a.get_attribute("href") or "" for a in links.all()
    ]


def test_the_owner_adds_a_viewer_who_sees_no_write_controls(
    signed_in: Page, browser: Browser, stack: UiStack, page_problems: PageProblems
) -> None:
    page = signed_in
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Operators").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Operators")
    expect(page.locator("#operators-table")).to_contain_text("operator")
    page.get_by_role("link", name="New operator").click()
    name = _unique("vic")
    form_field(page, "Name").fill(name)
    page.get_by_label("Role").select_option("viewer")
    page.get_by_role("button", name="Create operator").click()
    secret = page.locator("#new-credential")
    expect(secret).to_have_text(re.compile(r"^tgop-"))
    credential = secret.inner_text().strip()
    page.get_by_role("link", name="Done").click()
    expect(page.locator("#operators-table")).to_contain_text(name)
    assert page_problems.all() == []

    viewer = _fresh(browser, stack)
    sign_in(viewer, credential)
    viewer.wait_for_url("**/ui/")
    expect(viewer.locator("#who-role")).to_have_text("viewer")
    assert "Operators" in _nav(viewer) and "Tiers" in _nav(viewer)
    tier = "standard"
    pages = [
        "/ui/",
        "/ui/tiers",
        f"/ui/tiers/{tier}",
        "/ui/tenants",
        "/ui/tenants/demo",
        "/ui/keys",
        "/ui/backends",
        "/ui/profiles",
        "/ui/operators",
        f"/ui/operators/{name}",
    ]
    for path in pages:
        viewer.goto(path)
        expect(viewer.get_by_role("heading", level=1)).to_be_visible()
        assert _write_controls(viewer) == [], path
    viewer.goto(f"/ui/tiers/{tier}")
    expect(viewer.get_by_role("button", name=re.compile("Save|Delete"))).to_have_count(0)
    # the same pages give the owner its controls: the check above is not vacuous
    page.goto(f"/ui/tiers/{tier}")
    assert _write_controls(page)
    # a form the viewer never saw is refused, with the dashboard's page
    viewer.goto("/ui/tiers/-/new")
    expect(viewer.get_by_role("heading", level=1)).to_have_text("Not allowed for your role")
    expect(viewer.locator("#error-message")).to_contain_text("is a viewer")
    viewer.context.close()


def test_a_tenant_admin_starts_at_its_keys_and_sees_only_its_pages(
    browser: Browser, stack: UiStack
) -> None:
    name = _unique("tess")
    with stack.session_factory.begin() as session:
        tenant = crud.get_tenant(session, "demo")
        credential = operators.create_credential(
            session, actor="test", secret=SECRET, name=name, role="tenant_admin", tenant=tenant.id
        ).plaintext
    page = _fresh(browser, stack)
    sign_in(page, credential)
    page.wait_for_url("**/ui/keys")
    assert _nav(page) == ["Usage", "Requests", "Budgets", "Keys", "API reference"]
    expect(page.locator("#who-role")).to_have_text("tenant admin")
    rows = page.locator("table tbody tr")
    assert rows.count() >= 1
    for text in rows.all_inner_texts():
        assert "demo" in text
    page.goto("/ui/tenants")
    expect(page.get_by_role("heading", level=1)).to_have_text("Not allowed for your role")
    page.context.close()
