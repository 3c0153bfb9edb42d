"""The series the dashboards and alert rules read, on a real gateway and engine.

Per-objective SLO attainment (what a TTFT or TPOT burn-rate alert counts), tokens and
rejections by tenant (where tenant labels are on), routing decisions per backend, breaker
state, event-loop lag, failure counters exported at zero from the start, and the emulated
engines' ``tiergate:*`` policy gauges under the vLLM plugin's names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import SecretStr

from engine_emulated import EngineSpec, EngineThread
from engine_emulated.metrics import POLICY_GAUGES
from gateway.app import create_app
from gateway.app.backends import BackendSpec
from gateway.app.breaker import Breaker, OpenReason, breaker_state
from gateway.app.metrics import objectives_met
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.models import Base
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from priority.request import SLO

MODEL = "qwen2-7b"
SECRET = "dashboard-metrics-secret"
TENANT = "t-dash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


def samples(text: str) -> dict[str, float]:
    """An exposition as ``{"name{labels}": value}``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def value(scraped: dict[str, float], name: str, **labels: str) -> float | None:
    """Sum of the samples of ``name`` whose labels include ``labels``; None if there is none."""
    total, found = 0.0, False
    for key, v in scraped.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if all(have.get(k) == want for k, want in labels.items()):
            total, found = total + v, True
    return total if found else None


# ---- pure parts ----------------------------------------------------------------------------


def test_objectives_met_splits_strict_attainment_by_objective() -> None:
    slo = SLO(ttft_s=0.5, tpot_s=0.1, deadline_s=2.0)
    # first token at 0.4 s (met), 0.2 s per token after (missed), last at 1.0 s (met)
    assert objectives_met(0.0, slo, [0.4, 0.6, 0.8, 1.0]) == [
        ("ttft", True),
        ("tpot", False),
        ("deadline", True),
    ]
    assert objectives_met(10.0, slo, [10.6]) == [
        ("ttft", False),
        ("tpot", True),
        ("deadline", True),
    ]
    # nothing delivered: every objective the SLO sets is missed
    assert objectives_met(0.0, slo, []) == [("ttft", False), ("tpot", False), ("deadline", False)]
    assert objectives_met(0.0, SLO(deadline_s=1.0), [0.5, 1.5]) == [("deadline", False)]


def test_breaker_state_is_closed_half_open_or_open() -> None:
    breaker = Breaker(threshold=1, cooldown_s=5.0)
    assert breaker_state(breaker, 0.0) == 0
    breaker.trip(10.0, OpenReason.UNREACHABLE)
    assert breaker_state(breaker, 12.0) == 2  # in its cooldown: out of routing
    assert breaker_state(breaker, 15.0) == 1  # past it: half-open, routed to again
    breaker.alive()
    assert breaker_state(breaker, 15.0) == 0


# ---- a gateway in front of an emulated engine ----------------------------------------------


@dataclass
class Env:
    gateway: GatewayThread
    engine_metrics_url: str
    key: str

    def scrape(self) -> dict[str, float]:
        url = self.gateway.app.state.metrics_listener.metrics_url
        return samples(httpx.get(url).text)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("dashboard-metrics")
    url = f"sqlite:///{root / 'tiergate.db'}"
    db = make_engine(url)
    Base.metadata.create_all(db)
    with make_session_factory(db).begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name=TENANT, tier="standard")
        key = crud.create_key(session, actor="test", tenant=TENANT, secret=SECRET).plaintext
    settings = Settings(
        database_url=url,
        secret=SecretStr(SECRET),
        data_dir=root,
        redis_url=None,
        metrics_addr="127.0.0.1:0",
        metrics_tenant_labels=True,
    )
    with EngineThread([EngineSpec("a100-qwen2-7b", "slide", MODEL)]) as engines:
        backends = [BackendSpec("engine-0", e.url, MODEL, e.spec.profile) for e in engines]
        with GatewayThread(create_app(settings, backends=backends)) as gateway:
            yield Env(gateway, f"{engines[0].url}/metrics", key)
    db.dispose()


def test_failure_counters_and_breaker_state_exist_before_any_failure(env: Env) -> None:
    scraped = env.scrape()
    assert value(scraped, "tiergate_upstream_failures_total", backend="engine-0") == 0
    for phase in ("first_token", "response", "stall"):
        assert value(scraped, "tiergate_upstream_timeouts_total", phase=phase) == 0
    for reason in ("unreachable", "unresponsive"):
        assert value(scraped, "tiergate_breaker_opens_total", reason=reason) == 0
    assert value(scraped, "tiergate_backend_breaker_state", backend="engine-0") == 0


def test_a_served_request_counts_tokens_objectives_and_its_backend(env: Env) -> None:
    before = env.scrape()
    client = openai.OpenAI(base_url=f"{env.gateway.url}/v1", api_key=env.key, max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    after = env.scrape()

    def delta(name: str, **labels: str) -> float:
        return (value(after, name, **labels) or 0.0) - (value(before, name, **labels) or 0.0)

    labels = {"tenant": TENANT, "tier": "standard"}
    assert delta("tiergate_tokens_total", kind="completion", **labels) == usage.completion_tokens
    assert delta("tiergate_tokens_total", kind="prompt", **labels) == usage.prompt_tokens
    for objective in ("ttft", "tpot"):  # the tier's SLO sets both: one sample each
        assert delta("tiergate_slo_objective_requests_total", objective=objective, **labels) == 1
    # the strict sample agrees with its parts: met only if every objective it had was met
    name = "tiergate_slo_objective_requests_total"
    objectives = ("ttft", "tpot", "deadline")
    had = {o: delta(name, objective=o, **labels) for o in objectives}
    met = {o: delta(name, objective=o, attained="true", **labels) for o in objectives}
    strict = delta("tiergate_slo_requests_total", tier="standard", attained="true")
    assert strict == (1.0 if met == had else 0.0)
    assert delta("tiergate_routed_requests_total", backend="engine-0", tier="standard") == 1
    assert (value(after, "tiergate_event_loop_lag_seconds_count") or 0) > 0


def test_rejections_carry_the_tenant_where_tenant_labels_are_on(env: Env) -> None:
    client = openai.OpenAI(base_url=f"{env.gateway.url}/v1", api_key=env.key, max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10**12)
    rejected = {k: v for k, v in env.scrape().items() if k.startswith("tiergate_rejections_total{")}
    assert rejected and all(f'tenant="{TENANT}"' in k for k in rejected), rejected


def test_the_emulated_engine_exports_the_plugins_policy_gauges(env: Env) -> None:
    client = openai.OpenAI(base_url=f"{env.gateway.url}/v1", api_key=env.key, max_retries=0)
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    scraped = samples(httpx.get(env.engine_metrics_url).text)
    for name, _ in POLICY_GAUGES.values():
        assert value(scraped, name, engine="0") is not None, name
    assert (value(scraped, "tiergate:policy_steps") or 0) > 0  # the requests above were planned
    assert value(scraped, "tiergate:plan_deviations") == 0  # the emulation runs every plan
    beta = value(scraped, "tiergate:estimator_beta")
    assert beta is not None and 0.5 < beta < 2.0  # an exact profile: no drift to correct
    assert (value(scraped, "tiergate:latency_budget_seconds") or 0) > 0  # SlideBatching's budget
