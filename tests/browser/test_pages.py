"""Every dashboard page renders in a real browser, cleanly; ``/docs`` and ``/redoc`` work
without internet.

"Cleanly" is what a person would notice in the browser's developer tools: no console error, no
uncaught script error, no request that failed (a missing vendored file, a CDN that cannot be
reached). The pages are reached through the navigation, as a person would, so a wrong link is a
failure too.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Locator, Page, Route, expect

from tests.browser.helpers import PageProblems, sign_in
from tests.browser.stack import UiStack

pytestmark = pytest.mark.slow

NAV = (
    ("Overview", "/ui/"),
    ("Usage", "/ui/usage"),
    ("Requests", "/ui/requests"),
    ("Budgets", "/ui/budgets"),
    ("Tiers", "/ui/tiers"),
    ("Tenants", "/ui/tenants"),
    ("Keys", "/ui/keys"),
    ("Backends", "/ui/backends"),
    ("Profiles", "/ui/profiles"),
    ("Prices", "/ui/prices"),
    ("Audit", "/ui/audit"),
    ("Operators", "/ui/operators"),
)
"""The navigation's pages, in its order (the contract), each with its ``<h1>``."""
LOCAL_HOSTS = ("127.0.0.1", "localhost")
LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
"""The one CDN file ReDoc's bundle names (its footer's logo); /redoc's policy refuses it."""


def _nav(page: Page) -> Locator:
    return page.get_by_role("navigation", name="Main")


def test_the_navigation_lists_every_page_in_order(signed_in: Page) -> None:
    links = _nav(signed_in).get_by_role("link")
    names = [name.strip() for name in links.all_inner_texts()]
    expected = [label for label, _ in NAV] + ["API reference"]
    found = [n for n in names if n in expected]
    assert found == expected, names
    expect(_nav(signed_in).get_by_role("link", name="API reference")).to_have_attribute(
        "href", "/docs"
    )


@pytest.mark.parametrize(("label", "path"), NAV, ids=[label for label, _ in NAV])
def test_each_page_renders_without_errors(
    signed_in: Page, page_problems: PageProblems, label: str, path: str
) -> None:
    _nav(signed_in).get_by_role("link", name=label, exact=True).click()
    signed_in.wait_for_url(re.compile(re.escape(path) + r"(\?.*)?$"))
    signed_in.wait_for_load_state("networkidle")
    expect(signed_in.get_by_role("heading", level=1)).to_have_text(re.compile(f"^{label}"))
    response = signed_in.request.get(path)
    assert response.status == 200, (path, response.status)
    assert page_problems.all() == []


def _assert_icon_loads(page: Page) -> None:
    icon = page.locator('link[rel~="icon"]')
    assert icon.count() >= 1, f"{page.url} names no icon: the browser fetches /favicon.ico"
    href = icon.first.get_attribute("href") or ""
    if not href.startswith("data:"):
        assert page.request.get(href).status == 200, href


def test_the_pages_name_an_icon_that_loads(page: Page, stack: UiStack) -> None:
    """Without ``<link rel="icon">`` the browser asks for ``/favicon.ico`` on its own, and its
    404 is an error in the console of the first page a person opens."""
    page.goto("/ui/login")
    _assert_icon_loads(page)
    sign_in(page, stack.operator_credential)
    page.wait_for_url("**/ui/")
    _assert_icon_loads(page)


def test_api_reference_renders_offline(
    stack: UiStack, page: Page, page_problems: PageProblems
) -> None:
    """Swagger UI from the gateway's own files: every request stays on 127.0.0.1."""
    blocked, requested = _local_only(page)
    page.goto("/docs")
    # the operations list is drawn by Swagger UI's script from /openapi.json: it really ran
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible(timeout=15_000)
    expect(page.locator(".swagger-ui")).to_contain_text("/v1/chat/completions")
    page.wait_for_load_state("networkidle")
    assert blocked == [], f"/docs reached outside 127.0.0.1: {blocked}"
    assert any(url.endswith("/openapi.json") for url in requested), requested
    assert all(urlsplit(url).hostname in LOCAL_HOSTS for url in requested if "://" in url)
    assert page_problems.all() == []


def _local_only(page: Page) -> tuple[list[str], list[str]]:
    """Abort every request of ``page`` that leaves 127.0.0.1; the URLs it blocked and every URL
    it requested, as they happen."""
    blocked: list[str] = []

    def only_local(route: Route) -> None:
        host = urlsplit(route.request.url).hostname or ""
        if host in LOCAL_HOSTS or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort("internetdisconnected")

    page.context.route("**/*", only_local)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    return blocked, requested


def test_redoc_renders_offline(stack: UiStack, page: Page, page_problems: PageProblems) -> None:
    """ReDoc from the gateway's own files: every request stays on 127.0.0.1, and the one
    CDN file its bundle names (a footer logo) is never requested (the page's policy)."""
    blocked, requested = _local_only(page)
    page.goto("/redoc")
    # the operations are drawn by ReDoc's script from /openapi.json: it really ran
    expect(page.locator("h1").first).to_contain_text("tiergate", timeout=15_000)
    expect(page.locator("body")).to_contain_text("/v1/chat/completions")
    page.wait_for_load_state("networkidle")
    assert blocked == [], f"/redoc reached outside 127.0.0.1: {blocked}"
    assert any(url.endswith("/openapi.json") for url in requested), requested
    outside = [u for u in requested if "://" in u and urlsplit(u).hostname not in LOCAL_HOSTS]
    assert outside == [LOGO], outside  # asked for by the script, refused by the browser:
    assert [p for p in page_problems.failed_requests if LOGO in p] == [
        f"request failed: GET {LOGO} (csp)"
    ]
    assert page_problems.unexpected(LOGO) == []  # and Chromium's console line saying so


def test_usage_charts_fit_their_panels(signed_in: Page) -> None:
    """Each uPlot chart (canvas and legend) is drawn inside its own panel, none cut off."""
    signed_in.goto("/ui/usage")
    expect(signed_in.locator("#usage-charts")).to_have_attribute("data-drawn", "true")
    figures = signed_in.locator("#usage-charts figure.chart")
    assert figures.count() >= 1
    for i in range(figures.count()):
        figure = figures.nth(i)
        box = figure.bounding_box()
        assert box is not None
        for part in (figure.locator("canvas").first, figure.locator(".u-legend").first):
            inner = part.bounding_box()
            assert inner is not None
            name = figure.get_attribute("id")
            assert inner["x"] >= box["x"] - 1, (name, inner, box)
            assert inner["x"] + inner["width"] <= box["x"] + box["width"] + 1, (name, inner, box)


def _one_request(stack: UiStack) -> None:
    """A finished request of the demo tenant, its usage record written."""
    import openai
    from sqlalchemy import func, select

    from gateway.db.models import UsageRecord
    from tests.browser.stack import MODEL, wait_for

    def records() -> int:
        with stack.session_factory() as session:
            return int(session.scalar(select(func.count()).select_from(UsageRecord)) or 0)

    before = records()
    client = openai.OpenAI(base_url=stack.openai_base_url, api_key=stack.tenant_key)
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    wait_for(lambda: records() > before, "the request's usage record")


BLUE = (0x24, 0x52, 0xC9)
"""The first series' colour (usage.js): what a drawn line or point of it is painted in."""


def _painted(page: Page, chart: str) -> int:
    """Pixels of the first series' colour on a chart's plot canvas."""
    return int(
        page.evaluate(
            """([id, rgb]) => {
                const canvas = document.querySelector('#chart-' + id + ' canvas');
                const data = canvas.getContext('2d')
                    .getImageData(0, 0, canvas.width, canvas.height).data;
                let n = 0;
                for (let i = 0; i < data.length; i += 4) {
                    if (Math.abs(data[i] - rgb[0]) < 8 && Math.abs(data[i + 1] - rgb[1]) < 8 &&
                        Math.abs(data[i + 2] - rgb[2]) < 8 && data[i + 3] > 200) { n++; }
                }
                return n;
            }""",
            [chart, list(BLUE)],
        )
    )


def test_a_fresh_install_draws_its_one_point_with_distinct_axis_labels(
    stack: UiStack, signed_in: Page
) -> None:
    """A day in hour buckets with requests in one hour: the latency charts have one value
    each (the other buckets have none); it is drawn, and the axis labels differ."""
    _one_request(stack)
    signed_in.goto("/ui/usage?range=24h&bucket=hour")
    expect(signed_in.locator("#usage-charts")).to_have_attribute("data-drawn", "true")
    for chart in ("ttft", "tpot", "slo", "tdg"):
        assert _painted(signed_in, chart) > 0, f"{chart}: its one point is not drawn"
    for chart in ("ttft", "tpot"):
        labels = signed_in.locator(f"#chart-{chart}").get_attribute("data-y-labels")
        assert labels, chart
        shown = labels.split("|")
        assert len(shown) >= 2 and len(set(shown)) == len(shown), (chart, shown)


def test_the_totals_table_fits_at_1280_pixels(stack: UiStack, signed_in: Page) -> None:
    """Every column of the totals table, latencies included, is inside the page at the
    browser's 1280 px width: nothing to scroll sideways to."""
    _one_request(stack)
    for group_by in ("none", "tier", "tenant"):
        signed_in.goto(f"/ui/usage?range=24h&group_by={group_by}")
        table = signed_in.locator("#usage-table")
        expect(table).to_be_visible()
        sizes = signed_in.evaluate(
            """() => {
                const wrap = document.querySelector('#usage-table').parentElement;
                return [wrap.scrollWidth, wrap.clientWidth];
            }"""
        )
        assert sizes[0] <= sizes[1], (group_by, sizes)
        last = signed_in.locator("#usage-table thead th").last.bounding_box()
        assert last is not None and last["x"] + last["width"] <= 1280, (group_by, last)
