"""Reloading the page that showed a new key's secret, in a real browser: the reload re-posts
the create form, and the gateway issues no second key (409, the first key named, no secret)."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import func, select

from gateway.db.models import ApiKey
from tests.browser.helpers import PageProblems
from tests.browser.stack import UiStack

pytestmark = pytest.mark.slow

TENANT = "demo"  # seeded by `tiergate serve`'s first start
RESUBMITTED = "status of 409 (Conflict)"
"""What Chromium logs of the deliberate 409 answer to the re-posted form."""


def _keys_named(stack: UiStack, name: str) -> int:
    with stack.session_factory() as session:
        query = select(func.count()).select_from(ApiKey).where(ApiKey.name == name)
        return int(session.scalar(query) or 0)


def test_reloading_the_new_key_page_creates_no_second_key(
    signed_in: Page, stack: UiStack, page_problems: PageProblems
) -> None:
    page = signed_in
    name = f"reload-{uuid.uuid4().hex[:6]}"
    page.goto("/ui/keys")
    form = page.locator("form[action='/ui/keys/new']")
    form.get_by_label("Tenant").fill(TENANT)
    form.get_by_label("Key name").fill(name)
    with page.expect_response(lambda r: r.url.endswith("/ui/keys/new")) as created:
        form.get_by_role("button", name="Create key").click()
    assert created.value.status == 201
    secret = page.locator("#new-secret").inner_text().strip()
    prefix = page.locator("#new-prefix").inner_text().strip()
    assert secret.startswith(prefix) and _keys_named(stack, name) == 1

    # Chromium reloads the answer to a POST by sending the same form again (headless, no
    # "confirm resubmission" question): the CSRF and one-time form tokens included
    with page.expect_response(lambda r: r.url.endswith("/ui/keys/new")) as reloaded:
        page.reload()
    assert reloaded.value.request.method == "POST"
    assert reloaded.value.status == 409
    expect(page.get_by_role("heading", level=1)).to_have_text("Key already created")
    expect(page.locator("#repeated-prefix")).to_have_text(prefix)
    expect(page.locator("#key-repeated")).to_contain_text(TENANT)
    expect(page.locator("#new-secret")).to_have_count(0)
    assert secret not in page.content()
    assert _keys_named(stack, name) == 1  # exactly one key: the reload issued nothing

    page.get_by_role("link", name="rotate the key").click()  # the way out if it was lost
    page.wait_for_url(f"**/ui/keys/{prefix}#rotate")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Key {prefix}")
    assert page_problems.unexpected(RESUBMITTED) == []
