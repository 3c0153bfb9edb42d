"""Screenshots of every dashboard page for the README: ``docs/img/ui-<page>.png`` at 1280×800.

The same stack as the browser tests (:mod:`tests.browser.stack`: a migrated, seeded database,
emulated engines, the gateway in a thread, Debian's Chromium through Playwright), with demo data
on top so that the pages are not empty: a few tenants on each tier and their keys (one revoked),
a day of usage records, and some live traffic through the official ``openai`` client so that the
overview's rates move. Run from the repository root::

    .venv/bin/python scripts/screenshots.py            # all pages into docs/img/
    .venv/bin/python scripts/screenshots.py --out /tmp/shots --page usage

Needs ``chromium`` (``bash .ci/browser.sh``); uses PostgreSQL when it answers, else SQLite.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.browser.stack` from a script run by path
    sys.path.insert(0, str(ROOT))

import openai  # noqa: E402
from playwright.sync_api import Page, sync_playwright  # noqa: E402
from sqlalchemy.orm import Session, sessionmaker  # noqa: E402

from gateway.db import crud  # noqa: E402
from gateway.db.models import UsageRecord, utcnow  # noqa: E402
from tests.browser.helpers import form_field, sign_in  # noqa: E402
from tests.browser.stack import (  # noqa: E402
    MODEL,
    SECRET,
    UiStack,
    chromium_path,
    ui_stack,
)

VIEWPORT = {"width": 1280, "height": 800}
DEMO_TENANTS = (  # name, tier, status
    ("acme", "premium", "active"),
    ("globex", "premium", "active"),
    ("initech", "standard", "active"),
    ("hooli", "standard", "active"),
    ("umbrella", "batch", "active"),
    ("soylent", "standard", "suspended"),
)
BACKENDS = ("emulated-0-a100-qwen2-7b", "emulated-1-910b-qwen2-7b")
REJECTIONS = ("rate_limit_rpm", "queue_full", "slo_unattainable", "concurrency")
USAGE_HOURS = 24
USAGE_RECORDS = 3000
ACTOR = "cli:platform"
"""The demo data is made as the CLI would make it; the screenshots' own changes are the UI's."""


@dataclass(frozen=True)
class Shot:
    """One page to capture: its file name, its path, and what to do before the capture."""

    name: str
    path: str
    prepare: Callable[[Page, UiStack], None] | None = None


def seed_demo(factory: sessionmaker[Session]) -> None:
    """Tenants, keys and a day of usage, through the CRUD layer (so the audit log has them)."""
    rng = random.Random(11)
    with factory.begin() as session:
        crud.create_tier(
            session,
            actor=ACTOR,
            name="realtime",
            description="voice agents: tight first token",
            weight=8.0,
            ttft_ms=400.0,
            tpot_ms=40.0,
            rpm_limit=600,
            max_concurrency=32,
        )
        tenant_ids: dict[str, tuple[int, str]] = {}
        key_ids: dict[str, list[int]] = {}
        for name, tier, status in DEMO_TENANTS:
            tenant = crud.create_tenant(session, actor=ACTOR, name=name, tier=tier, status=status)
            tenant_ids[name] = (tenant.id, tier)
            keys = [
                crud.create_key(session, actor=ACTOR, tenant=name, secret=SECRET, name=label)
                for label in ("production", "staging")
            ]
            key_ids[name] = [created.api_key.id for created in keys]
        session.flush()
        crud.revoke_key(session, key_ids["globex"][1], actor=ACTOR)
        now = utcnow()
        rows = []
        for _ in range(USAGE_RECORDS):
            name = rng.choice([t[0] for t in DEMO_TENANTS[:5]])
            tenant_id, tier = tenant_ids[name]
            at = now - timedelta(seconds=rng.uniform(60, USAGE_HOURS * 3600))
            rejected = rng.random() < 0.04
            ttft = rng.lognormvariate(5.6 if tier == "premium" else 6.2, 0.5)
            tpot = rng.lognormvariate(3.4, 0.3)
            completion = 0 if rejected else rng.randint(16, 512)
            ideal = completion * {"premium": 4.0, "standard": 2.0, "batch": 1.0}[tier]
            slo_met = not rejected and ttft < {"premium": 1000, "standard": 2000}.get(tier, 5000)
            rows.append(
                UsageRecord(
                    request_id=f"demo-{uuid.UUID(int=rng.getrandbits(128))}",
                    tenant_id=tenant_id,
                    api_key_id=key_ids[name][0],
                    tier=tier,
                    model=MODEL,
                    backend=None if rejected else rng.choice(BACKENDS),
                    prompt_tokens=0 if rejected else rng.randint(32, 2048),
                    completion_tokens=completion,
                    ttft_ms=None if rejected else ttft,
                    tpot_ms=None if rejected else tpot,
                    gain=(ideal if slo_met else ideal * rng.uniform(0.2, 0.8)) if completion else 0,
                    ideal_gain=ideal,
                    slo_met=slo_met,
                    status="rejected" if rejected else "ok",
                    reject_reason=rng.choice(REJECTIONS) if rejected else None,
                    created_at=at,
                )
            )
        session.add_all(rows)


def live_traffic(stack: UiStack, requests: int = 24) -> None:
    """A few real requests through the gateway, so that the overview's live numbers move."""
    client = openai.OpenAI(base_url=stack.openai_base_url, api_key=stack.tenant_key, max_retries=0)

    def one(i: int) -> None:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Summarise report {i} in one line."}],
            max_tokens=24,
        )

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(one, range(requests)))


def _show_new_key(page: Page, stack: UiStack) -> None:
    """The page right after a key was created: its secret, shown this once."""
    page.goto("/ui/keys")
    form = page.locator("form[action='/ui/keys/new']")
    form.get_by_label("Tenant").fill("acme")
    form.get_by_label("Key name").fill("ci-pipeline")
    form.get_by_role("button", name="Create key").click()
    page.locator("#new-secret").wait_for()


def _tier_validation_error(page: Page, stack: UiStack) -> None:
    """A tier form refused beside its field, with the API's message."""
    page.goto("/ui/tiers/-/new")
    form_field(page, "Name").fill("interactive")
    form_field(page, "Weight").fill("0")
    form_field(page, "TTFT ms").fill("800")
    form_field(page, "TPOT ms").fill("60")
    page.get_by_role("button", name="Create tier").click()
    page.locator("#error-weight").wait_for()


def _usage_by_tenant(page: Page, stack: UiStack) -> None:
    """The usage page grouped by tenant, its charts drawn."""
    page.goto("/ui/usage?range=24h&group_by=tenant")
    page.locator("#usage-charts[data-drawn='true']").wait_for()


def _usage_by_tier(page: Page, stack: UiStack) -> None:
    page.goto("/ui/usage?range=24h&group_by=tier")
    page.locator("#usage-charts[data-drawn='true']").wait_for()


def _overview(page: Page, stack: UiStack) -> None:
    """The overview while requests flow, once its live panel has measured a request rate."""
    traffic = threading.Thread(target=live_traffic, args=(stack, 120), daemon=True)
    traffic.start()
    page.goto("/ui/")
    page.wait_for_function(
        "() => parseFloat(document.getElementById('live-rate')?.textContent) > 0",
        timeout=60_000,
    )
    traffic.join()


def _docs(page: Page, stack: UiStack) -> None:
    """The API reference, Swagger UI drawn from the gateway's own files."""
    page.goto("/docs")
    page.locator(".swagger-ui .opblock").first.wait_for()


SHOTS = (
    Shot("login", "/ui/login"),
    Shot("overview", "/ui/", _overview),
    Shot("usage", "/ui/usage", _usage_by_tier),
    Shot("usage-tenants", "/ui/usage", _usage_by_tenant),
    Shot("tiers", "/ui/tiers"),
    Shot("tier-error", "/ui/tiers/-/new", _tier_validation_error),
    Shot("tenants", "/ui/tenants"),
    Shot("keys", "/ui/keys"),
    Shot("key-created", "/ui/keys", _show_new_key),
    Shot("backends", "/ui/backends"),
    Shot("profiles", "/ui/profiles"),
    Shot("audit", "/ui/audit"),
    Shot("docs", "/docs", _docs),
)


def capture(stack: UiStack, out: Path, only: set[str] | None) -> list[Path]:
    """Sign in and save each page; the login page from a fresh, signed-out context."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium_path(), headless=True, args=args)
        try:
            for signed_in in (False, True):
                context = browser.new_context(base_url=stack.origin, viewport=VIEWPORT)  # type: ignore[arg-type]
                page = context.new_page()
                if signed_in:
                    sign_in(page, stack.operator_credential)
                    page.wait_for_url("**/ui/")
                for shot in SHOTS:
                    if (shot.name == "login") == signed_in:
                        continue
                    if only is not None and shot.name not in only:
                        continue
                    if shot.prepare is not None:
                        shot.prepare(page, stack)
                    else:
                        page.goto(shot.path)
                    page.wait_for_load_state("networkidle")
                    target = out / f"ui-{shot.name}.png"
                    page.screenshot(path=str(target))
                    written.append(target)
                    shown = target.relative_to(ROOT) if target.is_relative_to(ROOT) else target
                    print(f"wrote {shown}")
                context.close()
        finally:
            browser.close()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--page", action="append", help="only these (e.g. usage); repeatable")
    options = parser.parse_args()
    if chromium_path() is None:
        print("chromium is not installed: bash .ci/browser.sh", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp, ui_stack(Path(tmp), seed=seed_demo) as stack:
        live_traffic(stack)
        capture(stack, options.out, set(options.page) if options.page else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
