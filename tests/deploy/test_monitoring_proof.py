"""The monitoring proof: every dashboard panel and every rule has data on a real Prometheus.

``deploy/local/stack.py`` starts the deployment that runs here: two gateway processes on
PostgreSQL and Redis sharing two emulated engines (an Ascend 910B and an A100 profile), and
Debian's Prometheus scraping them every second with ``deploy/prometheus/``'s jobs and rules.
Tenants on every default tier send a short mixed load through the official ``openai`` client:
streamed and unary, chat and completions, to both gateways; one tenant past its RPM limit, one
past its concurrency limit, requests whose TTFT objective no engine can meet (refused for
premium, demoted for batch). Then, through Prometheus's HTTP API:

* every template variable of every dashboard in ``deploy/grafana/dashboards/`` lists values;
* every target of every panel returns a finite number over the load, its variables substituted
  twice: as Grafana's default view does ("All": the variable's ``allValue``), and as the real
  values the variable lists, all picked (a panel without data fails, named with its query);
* every rule is healthy with no evaluation error; every recording rule's series exists; every
  alert's expression is evaluated, and where it is (rightly) quiet, the quantities it compares
  with its thresholds are evaluated instead and must have data.

Skipped without ``prometheus`` unless ``CI`` is set (``bash .ci/prometheus.sh`` installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from promql_harness import (
    Prometheus,
    dashboard_queries,
    dashboard_values,
    has_data,
    substitute,
    underlying,
)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deploy/local/stack.py"
# the shipped files; the variables point the proof at others (while writing new ones)
DASHBOARDS = Path(os.environ.get("TIERGATE_PROOF_DASHBOARDS", ROOT / "deploy/grafana/dashboards"))
RULES = Path(os.environ.get("TIERGATE_PROOF_RULES", ROOT / "deploy/prometheus/rules"))
SCRAPE = Path(os.environ.get("TIERGATE_PROOF_SCRAPE", ROOT / "deploy/prometheus/prometheus.yml"))
POSTGRES = os.environ.get(
    "TIERGATE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS = os.environ.get("TIERGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
MODEL = "qwen2-7b"
LOAD_S = float(os.environ.get("TIERGATE_PROOF_LOAD_S", "40"))
SETTLE_EVALUATIONS = 5
"""Rule evaluations (1 s apart) to wait for after the load, so that rules built on other
rules' series have been evaluated on the last scrape too."""
LONG_PROMPT = "tiergate " * 6000  # thousands of tokens: no engine prefills them in 250 ms

pytestmark = pytest.mark.slow


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _need(what: str, ok: bool) -> None:
    if ok:
        return
    if _in_ci():
        pytest.fail(f"{what} (CI=true: the monitoring proof must run)")
    pytest.skip(what)


# ---- the stack ---------------------------------------------------------------------------------


@dataclass
class Stack:
    gateways: list[str]
    prometheus: Prometheus
    admin_key: str
    home: Path


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """A database of its own on the test PostgreSQL, dropped afterwards."""
    server = make_url(POSTGRES)
    admin = create_engine(
        server.set(database="postgres"),
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": 3},
    )
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        admin.dispose()
        _need(f"PostgreSQL unreachable at {server.render_as_string()}: {exc}", False)
    name = f"tiergate_proof_{uuid.uuid4().hex[:10]}"
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def stack(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _need("prometheus is not installed (bash .ci/prometheus.sh)", bool(shutil.which("prometheus")))
    _need("no dashboards in deploy/grafana/dashboards", any(DASHBOARDS.glob("*.json")))
    _need("no rules in deploy/prometheus/rules", any(RULES.glob("*.yml")))
    home = tmp_path_factory.mktemp("stack")
    command = [sys.executable, str(STACK)]
    started = subprocess.run(
        [
            *command,
            "start",
            f"--dir={home}",
            "--api-port=0",
            "--metrics-port=0",
            "--engine-port=0",
            "--prometheus-port=0",
            "--engines=910b-qwen2-7b,a100-qwen2-7b",
            f"--database-url={database_url}",
            f"--redis-url={REDIS}",
            f"--redis-prefix=proof-{uuid.uuid4().hex[:8]}",
            f"--prometheus-config={SCRAPE}",
            f"--rules={RULES}",
            "--scrape-interval=1s",
            "--evaluation-interval=1s",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert started.returncode == 0, f"stack start failed:\n{started.stderr[-4000:]}"
        status = subprocess.run(
            [*command, "status", f"--dir={home}", "--json"], capture_output=True, text=True
        )
        assert status.returncode == 0, status.stdout + status.stderr  # every process healthy
        info = json.loads(status.stdout)["info"]
        secrets = json.loads((home / "secrets.json").read_text())
        yield Stack(
            gateways=[g["url"] for g in info["gateways"]],
            prometheus=Prometheus(info["prometheus"]),
            admin_key=secrets["TIERGATE_ADMIN_KEY"],
            home=home,
        )
    finally:
        stopped = subprocess.run(
            [*command, "stop", f"--dir={home}"], capture_output=True, text=True, timeout=180
        )
        assert stopped.returncode == 0, stopped.stderr


# ---- tenants and load ---------------------------------------------------------------------


TENANTS: dict[str, tuple[str, dict[str, float]]] = {
    "acme": ("premium", {}),
    "globex": ("standard", {}),
    "initech": ("standard", {"rpm_limit": 20}),  # hits its RPM limit
    "hooli": ("premium", {"max_concurrency": 1}),  # hits its concurrency limit
    "umbrella": ("batch", {"ttft_ms": 250}),  # below batch's header floor (its 5 s default)
}
UNATTAINABLE = {"acme": {"x-slo-ttft-ms": "250"}, "umbrella": {}}
"""Tenants that sometimes send a prompt no engine prefills within their 250 ms TTFT objective:
premium's are refused (503), batch's demoted to best effort and served."""


def create_tenants(stack: Stack) -> dict[str, str]:
    """The tenants through the admin API; returns an API key per tenant."""
    keys = {}
    headers = {"Authorization": f"Bearer {stack.admin_key}"}
    with httpx.Client(base_url=f"{stack.gateways[0]}/admin/v1", headers=headers) as admin:
        for name, (tier, limits) in TENANTS.items():
            response = admin.post("/tenants", json={"name": name, "tier": tier, **limits})
            assert response.status_code == 201, response.text
            response = admin.post("/keys", json={"tenant": name, "name": "proof"})
            assert response.status_code == 201, response.text
            keys[name] = response.json()["key"]
    return keys


@dataclass
class Outcomes:
    by_tenant: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, tenant: str, outcome: str) -> None:
        self.by_tenant.setdefault(tenant, Counter())[outcome] += 1


async def one_request(
    client: openai.AsyncOpenAI, rng: random.Random, *, prompt: str, headers: dict[str, str]
) -> str:
    """One request, streamed or not, chat or completion; returns ``"ok"`` or the status."""
    max_tokens = rng.randint(8, 48)
    stream = rng.random() < 0.5
    try:
        if rng.random() < 0.7:
            messages: Any = [{"role": "user", "content": prompt}]
            if stream:
                chunks = await client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=max_tokens,
                    stream=True,
                    extra_headers=headers,
                )
                async for _ in chunks:
                    pass
            else:
                await client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=max_tokens, extra_headers=headers
                )
        elif stream:
            pieces = await client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=max_tokens,
                stream=True,
                extra_headers=headers,
            )
            async for _ in pieces:
                pass
        else:
            await client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=max_tokens, extra_headers=headers
            )
    except openai.APIStatusError as exc:
        return str(exc.status_code)
    except openai.APIError:  # an error event inside a stream
        return "stream error"
    return "ok"


async def tenant_load(
    tenant: str, key: str, gateways: list[str], until: float, outcomes: Outcomes, seed: int
) -> None:
    """A tenant's clients, alternating gateways, until ``until`` (monotonic)."""
    rng = random.Random(seed)
    clients = [
        openai.AsyncOpenAI(base_url=f"{g}/v1", api_key=key, max_retries=0, timeout=60)
        for g in gateways
    ]
    i = 0
    try:
        while time.monotonic() < until:
            client = clients[i % len(clients)]
            i += 1
            prompt = f"request {i} of {tenant}: " + "word " * rng.randint(20, 400)
            headers: dict[str, str] = {}
            if tenant in UNATTAINABLE and rng.random() < 0.15:
                prompt, headers = LONG_PROMPT, UNATTAINABLE[tenant]
            outcomes.add(tenant, await one_request(client, rng, prompt=prompt, headers=headers))
            await asyncio.sleep(rng.uniform(0.05, 0.4))
    finally:
        for client in clients:
            await client.close()


async def run_load(keys: dict[str, str], gateways: list[str], seconds: float) -> Outcomes:
    outcomes = Outcomes()
    until = time.monotonic() + seconds
    streams = {"acme": 2, "globex": 2, "initech": 2, "hooli": 3, "umbrella": 2}
    await asyncio.gather(
        *(
            tenant_load(tenant, keys[tenant], gateways, until, outcomes, seed=100 * n + j)
            for n, (tenant, count) in enumerate(streams.items())
            for j in range(count)
        )
    )
    return outcomes


# ---- the proof ----------------------------------------------------------------------------


def wait_evaluations(prom: Prometheus, count: int) -> None:
    """Until every rule group has been evaluated ``count`` more times (1 s apart)."""
    groups = prom.get("/api/v1/rules")["groups"]
    if not groups:
        return
    first = {g["name"]: g.get("lastEvaluation") for g in groups}
    seen = 0
    for _ in range(30 * count):  # bounded: a group that stopped evaluating shows in its health
        if seen >= count:
            return
        time.sleep(1.0)
        now = {g["name"]: g.get("lastEvaluation") for g in prom.get("/api/v1/rules")["groups"]}
        if all(now[name] != first[name] for name in first):
            seen += 1
            first = now


def test_every_panel_and_rule_has_data_on_a_real_prometheus(stack: Stack) -> None:
    keys = create_tenants(stack)
    start = time.time()
    outcomes = asyncio.run(run_load(keys, stack.gateways, LOAD_S))
    wait_evaluations(stack.prometheus, SETTLE_EVALUATIONS)
    end = time.time()
    prom = stack.prometheus
    summary = {t: dict(c) for t, c in outcomes.by_tenant.items()}
    (stack.home / "load.json").write_text(json.dumps(summary, indent=2))

    # the load did what it is for: served on every tier, refused for each limit
    for tenant in TENANTS:
        assert outcomes.by_tenant[tenant]["ok"] > 0, summary
    assert outcomes.by_tenant["initech"]["429"] > 0, summary  # RPM
    assert outcomes.by_tenant["hooli"]["429"] > 0, summary  # concurrency
    assert outcomes.by_tenant["acme"]["503"] > 0, summary  # unattainable TTFT: refused
    assert set(outcomes.by_tenant["umbrella"]) == {"ok"}, summary  # batch: demoted, served
    demoted = prom.query('sum(tiergate_demotions_total{tier="batch"})')
    assert demoted and float(demoted[0]["value"][1]) > 0, demoted

    # every scrape target up, both gateways and both engines among them
    targets = prom.get("/api/v1/targets", state="active")["activeTargets"]
    assert targets and all(t["health"] == "up" for t in targets), targets

    failures: list[str] = []
    report: list[str] = []
    step = 2.0

    # dashboards: the default view ("All": the variables' allValue), then every variable set
    # to the values it lists, picked one by one (what a user who ticks them all sees)
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        dashboard = dashboard.get("dashboard", dashboard)  # an export wrapped for the API
        try:
            values = dashboard_values(prom, dashboard)
        except (LookupError, ValueError, RuntimeError) as exc:
            failures.append(f"{path.name}: {exc}")
            continue
        picked = {name: replace(value, all_value=None) for name, value in values.items()}
        views = [("All", dashboard_queries(path.name, dashboard, values))]
        views.append(("picked", dashboard_queries(path.name, dashboard, picked)))
        for view, queries in views:
            for query in queries:
                if view == "picked" and query.expr == substitute(query.raw, values):
                    continue  # no variable that lists values: evaluated above already
                ok, why = _panel_has_data(prom, query.expr, start, end, step)
                where = f"{path.name} / {query.panel} [{query.ref}] ({view})"
                report.append(f"{'data' if ok else why}: {where}")
                if not ok:
                    failures.append(f"{where}: {why}: {query.expr}")

    # rules
    rules = prom.rules()
    assert rules, "Prometheus loaded no rules"
    for rule in rules:
        label = f"{rule['group']} / {rule['type']} {rule['name']}"
        if rule.get("health") != "ok" or rule.get("lastError"):
            failures.append(f"{label}: health {rule.get('health')} {rule.get('lastError')}")
            continue
        if rule["type"] == "recording":
            ok = has_data(prom.query_range(rule["name"], start, end, step))
            report.append(f"{'data' if ok else 'no data'}: rule {label}")
            if not ok:
                failures.append(f"{label}: no series recorded ({rule['query']})")
            continue
        if has_data(prom.query_range(rule["query"], start, end, step)):
            report.append(f"fires: rule {label}")
            continue
        quiet = [q for q in underlying(rule["query"]) if not has_data(_range(prom, q, start, end))]
        report.append(f"{'quiet, data' if not quiet else 'no data'}: rule {label}")
        for q in quiet:
            failures.append(f"{label}: quiet, and what it compares has no data: {q}")

    (stack.home / "proof.txt").write_text("\n".join(report) + "\n")
    print("\n".join(report))
    assert not failures, "\n".join(failures)


def _panel_has_data(
    prom: Prometheus, expr: str, start: float, end: float, step: float
) -> tuple[bool, str]:
    try:
        return has_data(prom.query_range(expr, start, end, step)), "no data"
    except RuntimeError as exc:  # a query Prometheus refuses: as bad as no data
        return False, f"error {exc}"


def _range(prom: Prometheus, expr: str, start: float, end: float) -> list[Any]:
    try:
        return prom.query_range(expr, start, end, 2.0)
    except RuntimeError:
        return []
