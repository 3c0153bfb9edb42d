"""Fixtures for the dashboard's real-browser tests: a running gateway and Debian's Chromium.

* ``stack`` — the gateway with the dashboard, emulated engines and the admin key known to the
  test (:mod:`tests.browser.stack`), one per test module: on PostgreSQL when it answers (required
  under ``CI=true``), else SQLite.
* ``browser`` — headless Chromium driven by Playwright through the system binary
  (``.ci/browser.sh`` installs it; Playwright's own browser download cannot work here). Without
  it the tests skip, saying so — except under ``CI=true``, where they fail.
* ``page`` — a fresh context (1280×800, no shared cookies) whose console errors and failed
  requests are recorded in ``page_problems``; ``signed_in`` — the same page after sign-in.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, Request, sync_playwright
from playwright.sync_api import Response as PlaywrightResponse

from tests.browser.helpers import PageProblems, sign_in
from tests.browser.stack import UiStack, chromium_path, in_ci, ui_stack

VIEWPORT = {"width": 1280, "height": 800}
ACTION_TIMEOUT_MS = 15_000
"""How long an action or ``expect`` waits for its element: bounds a failing test only."""


def _unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the browser tests must run; run .ci/browser.sh)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    """Per module, not per session: the sync API runs an event loop in this thread until it
    stops, and the asyncio tests that follow in the same run need the thread free of it."""
    if chromium_path() is None:
        _unavailable("chromium is not installed (bash .ci/browser.sh)")
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium refuses root otherwise
    browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=args)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiStack]:
    root: Path = tmp_path_factory.mktemp("ui-stack")
    with ui_stack(root, require_postgres=in_ci()) as running:
        yield running


@pytest.fixture
def page_problems() -> PageProblems:
    return PageProblems()


@pytest.fixture
def page(browser: Browser, stack: UiStack, page_problems: PageProblems) -> Iterator[Page]:
    context = browser.new_context(base_url=stack.origin, viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    page = context.new_page()

    def on_console(message: ConsoleMessage) -> None:
        # the browser's own /favicon.ico fetch comes at a time of its choosing; whether the
        # pages name an icon that loads is checked deterministically in test_pages
        if message.type == "error" and not str(message.location.get("url")).endswith(
            "/favicon.ico"
        ):
            where = message.location.get("url") or page.url
            page_problems.console_errors.append(f"console: {message.text} ({where})")

    def on_failed(request: Request) -> None:
        # likewise the page's icon: Chromium fetches it lazily and cancels the fetch
        # (net::ERR_ABORTED) when the test navigates on first; test_pages checks it loads
        if "/favicon." in request.url and "ERR_ABORTED" in str(request.failure):
            return
        page_problems.failed_requests.append(
            f"request failed: {request.method} {request.url} ({request.failure})"
        )

    def on_response(response: PlaywrightResponse) -> None:
        # a 404 for a vendored file or an icon is not a "failed" request to the browser
        if response.status >= 400 and response.request.resource_type != "document":
            page_problems.failed_requests.append(
                f"HTTP {response.status}: {response.request.method} {response.url}"
            )

    page.on("console", on_console)
    page.on("response", on_response)
    page.on("requestfailed", on_failed)
    page.on("pageerror", lambda error: page_problems.page_errors.append(f"page error: {error}"))
    page.on("dialog", lambda dialog: dialog.accept())  # the forms' data-confirm questions
    yield page
    context.close()


@pytest.fixture
def signed_in(page: Page, stack: UiStack) -> Page:
    """The page signed in with the operator credential ``tiergate serve`` printed."""
    sign_in(page, stack.operator_credential)
    page.wait_for_url("**/ui/")
    return page
