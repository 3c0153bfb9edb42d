"""The gateway in front of real vLLM servers (vLLM's CPU build, a tiny random-weight model).

Two engines, each on its own core: ``vllm-slide`` runs ``TiergateScheduler`` with SlideBatching,
``vllm-stock`` vLLM's own scheduler. Both were registered with a profile that says 256 seats;
both run 16. The gateway is driven with the official ``openai`` client. In file order: what the
engines say they are, serving (unary, streamed, usage rows, routing across both), the engines'
estimator in the router, then faults — SIGSTOP of one, ``kill -9`` of one under load, and its
restart (as ``gmax``). No assertion is about how long anything took; waits are on states and
bound only a failing test.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.app import BackendSpec, create_app
from gateway.app.engine_facts import parse_engine_facts, parse_labels
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.models import Base, UsageRecord
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from tests.real_engine.vllm_server import MODEL, SEATS, VllmServer, serving

SECRET = "real-engine-secret"
ADMIN_KEY = "real-engine-admin-key-0123456789abcdef"
PROFILE = "h100-llama3.1-8b"
"""Registered for both engines: its engine block says 256 seats, 8,192 blocks of 16."""
SETTINGS: dict[str, Any] = {
    "scrape_interval_s": 0.5,
    "probe_interval_s": 0.25,
    "probe_timeout_s": 2.0,
    "first_token_timeout_min_s": 2.0,
    "stall_timeout_min_s": 10.0,
}
LINE = "    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
PROMPT = "def fibonacci(n):\n" + LINE * 8


def _wait_for(
    condition: Callable[[], bool],
    timeout_s: float = 120.0,
    what: str = "",
    state: Callable[[], object] | None = None,
) -> None:
    """Wait on a state; ``state`` says what was seen instead when it does not come."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            seen = f"; seen: {state()}" if state is not None else ""
            raise AssertionError(f"not in time: {what}{seen}")
        time.sleep(0.05)


def _load_of(gateway: GatewayThread) -> dict[str, dict[str, Any]]:
    """Each backend's load as the gateway sees it (for a failing wait's message)."""
    return {
        b.name: {
            "healthy": b.view.healthy,
            "prefills": len(b.view.prefill_queue),
            "decoding": b.own_decoding,
            "scraped_running": b.running,
            "scraped_waiting": b.waiting,
        }
        for b in gateway.state.pool.backends
    }


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    servers = {
        "vllm-slide": VllmServer("vllm-slide", "slide", core=0, log_dir=logs),
        "vllm-stock": VllmServer("vllm-stock", None, core=1, log_dir=logs),
    }
    with serving(servers):
        yield servers


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sessionmaker[Session]]:
    path = tmp_path_factory.mktemp("db") / "tiergate.db"
    engine = make_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()


TENANTS = {"acme": "premium", "router": "premium", "frozen": "patient", "killed": "patient"}
"""``acme`` for single requests, ``router`` for the routing load, ``frozen`` and ``killed`` for
the fault loads, in a tier whose objectives a loaded CPU engine still meets (60 s TTFT): neither
shed nor demoted (a demoted request waits in the gateway for an idle engine), so under a fault
every error a client sees is the fault's. Each load's usage rows are its own tenant's (the usage
writer is asynchronous: rows of an earlier test may still land)."""


@pytest.fixture(scope="module")
def keys(factory: sessionmaker[Session]) -> dict[str, str]:
    with factory.begin() as session:
        seed_defaults(session)
        crud.create_tier(
            session, actor="test", name="patient", weight=1, ttft_ms=60_000, tpot_ms=1_000
        )
        for name, tier in TENANTS.items():
            crud.create_tenant(session, actor="test", name=name, tier=tier)
        return {
            name: crud.create_key(session, actor="test", tenant=name, secret=SECRET).plaintext
            for name in TENANTS
        }


@pytest.fixture(scope="module")
def key(keys: dict[str, str]) -> str:
    return keys["acme"]


def _rows_of(factory: sessionmaker[Session], tenant: str) -> list[UsageRecord]:
    with factory() as session:
        tenant_id = crud.get_tenant(session, tenant).id
        query = select(UsageRecord).where(UsageRecord.tenant_id == tenant_id)
        return list(session.scalars(query.order_by(UsageRecord.id)).all())


@contextmanager
def _gateway(
    factory: sessionmaker[Session], servers: dict[str, VllmServer], tmp: Path
) -> Iterator[GatewayThread]:
    settings = Settings(
        database_url=str(factory.kw["bind"].url),
        secret=SecretStr(SECRET),
        admin_key=SecretStr(ADMIN_KEY),
        data_dir=tmp,
        redis_url=None,
        **SETTINGS,
    )
    backends = [BackendSpec(name, s.url, MODEL, PROFILE) for name, s in servers.items()]
    with GatewayThread(create_app(settings, backends=backends)) as gateway:
        _wait_for(lambda: all(b.facts is not None for b in gateway.state.pool.backends))
        yield gateway


@pytest.fixture(scope="module")
def gateway(
    factory: sessionmaker[Session],
    engines: dict[str, VllmServer],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayThread]:
    with _gateway(factory, engines, tmp_path_factory.mktemp("gw")) as gw:
        yield gw


def _client(gateway: GatewayThread, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=300)


def _chat(client: openai.OpenAI, max_tokens: int = 16, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=max_tokens,
        extra_body={"ignore_eos": True},
        **extra,
    )


def _stream(client: openai.OpenAI, max_tokens: int = 16) -> tuple[int, str | None, Any]:
    """Chunks with content, the error an error event carried (None: none), the usage."""
    pieces, error, usage = 0, None, None
    try:
        for chunk in _chat(client, max_tokens, stream=True, stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces += 1
            usage = chunk.usage or usage
    except openai.APIError as exc:
        error = str(exc)
    return pieces, error, usage


def _backend(gateway: GatewayThread, name: str) -> Any:
    return next(b for b in gateway.state.pool.backends if b.name == name)


# ---- what the engines say they are ---------------------------------------------------------


def test_the_engine_is_the_source_of_truth_for_its_seats(gateway: GatewayThread) -> None:
    pool = gateway.state.pool
    for name, policy in (("vllm-slide", "slide"), ("vllm-stock", "vllm-fcfs")):
        backend = _backend(gateway, name)
        assert backend.profile.engine.max_num_seqs == SEATS  # not the profile's 256
        assert backend.facts.policy == policy
        assert backend.max_model_len == 2048
        assert backend.mismatches["max_num_seqs"].startswith("max_num_seqs: profile says 256")
    assert pool.capacity == 2 * SEATS
    assert gateway.state.queue.max_in_flight == 2 * SEATS
    listed = httpx.get(
        f"{gateway.url}/admin/v1/backends",
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
        timeout=10,
    ).json()["data"]
    for row in listed:
        assert row["seats"] == SEATS
        assert any("max_num_seqs" in m for m in row["config_mismatches"])
    mismatch = gateway.state.metrics.registry.get_sample_value(
        "tiergate_backend_config_mismatch", {"backend": "vllm-stock", "field": "max_num_seqs"}
    )
    assert mismatch == 1.0


# ---- serving --------------------------------------------------------------------------------


def test_unary_and_streamed_chat_with_usage(gateway: GatewayThread, key: str) -> None:
    client = _client(gateway, key)
    answer = _chat(client, max_tokens=12)
    assert answer.choices[0].message.content
    assert answer.usage.completion_tokens == 12
    assert answer.usage.prompt_tokens > 50
    pieces, error, usage = _stream(client, max_tokens=12)
    assert error is None
    assert pieces > 0
    assert usage is not None and usage.completion_tokens == 12


def test_routing_across_both_engines_with_usage_and_gain_rows(
    gateway: GatewayThread, keys: dict[str, str], factory: sessionmaker[Session], engines: dict
) -> None:
    before = {name: _successes(server) for name, server in engines.items()}
    client = _client(gateway, keys["router"])
    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(lambda _: _stream(client, max_tokens=24), range(24)))
    assert all(error is None and pieces > 0 for pieces, error, _ in results)
    served = {name: _successes(server) - before[name] for name, server in engines.items()}
    assert all(count > 0 for count in served.values()), served
    assert sum(served.values()) == 24
    _wait_for(lambda: len(_rows_of(factory, "router")) == 24, what="usage rows written")
    rows = _rows_of(factory, "router")
    assert {r.status for r in rows} == {"ok"}, [
        (r.request_id, r.backend, r.status, r.completion_tokens, r.reject_reason) for r in rows
    ]
    assert {r.backend for r in rows} == set(engines)
    assert all(r.completion_tokens == 24 and r.ideal_gain > 0 for r in rows)
    assert sum(r.gain for r in rows) > 0


def _successes(server: VllmServer) -> float:
    total = 0.0
    for line in server.metrics().splitlines():
        if line.startswith("vllm:request_success_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_engines_gauges_and_estimator(gateway: GatewayThread, engines: dict) -> None:
    text = engines["vllm-slide"].metrics()
    for gauge in (
        "tiergate:urgent_requests",
        "tiergate:normal_requests",
        "tiergate:estimator_beta",
        "tiergate:estimator_refits",
        "tiergate:engine_config_info",
    ):
        assert gauge + "{" in text, gauge
    facts = parse_engine_facts(text)
    assert facts.coefficients is not None and facts.max_num_seqs == SEATS
    # idle: the policy's split reads 0, like vLLM's own gauges (not the last step's value)
    _wait_for(lambda: _gauge(engines["vllm-slide"], "vllm:num_requests_running") == 0)
    _wait_for(lambda: _gauge(engines["vllm-slide"], "tiergate:normal_requests") == 0)
    # the router predicts with the engine's own estimator (refitted from its real steps: a
    # refit every 64 steps, so the engine is given steps of its own until it has one)
    slide = engines["vllm-slide"]
    for _ in range(6):
        if _gauge(slide, "tiergate:estimator_refits") >= 1:
            break
        httpx.post(
            f"{slide.url}/v1/completions",
            json={"model": MODEL, "prompt": PROMPT, "max_tokens": 80, "ignore_eos": True},
            timeout=300,
        ).raise_for_status()
    _wait_for(lambda: _gauge(slide, "tiergate:estimator_refits") >= 1)
    backend = _backend(gateway, "vllm-slide")
    _wait_for(
        lambda: (
            backend.view.estimator.coefficients
            == parse_engine_facts(engines["vllm-slide"].metrics()).coefficients
        ),
        what="the router's estimator is the engine's",
    )
    assert backend.view.estimator.coefficients != backend.configured.coefficients
    # stock vLLM states its seats too (the plugin's stat logger loads with any scheduler)
    stock = parse_engine_facts(engines["vllm-stock"].metrics())
    assert stock.max_num_seqs == SEATS and stock.policy == "vllm-fcfs"


def test_tiers_kinds_and_objectives_reach_the_policy(
    gateway: GatewayThread, key: str, engines: dict
) -> None:
    """What the gateway's headers said arrives in the engine's scheduler: the plugin counts
    each request by the tier, kind and objective its metadata carried."""
    slide = engines["vllm-slide"]
    client = _client(gateway, key)
    sent = {
        "latency": {},
        "deadline": {"x-slo-deadline-ms": "60000"},
        "compound": {
            "x-tiergate-workflow-id": "wf-real-engine",
            "x-tiergate-workflow-deadline-ms": "60000",
        },
    }
    for kind, headers in sent.items():
        labels = {"tier": "premium", "kind": kind, "objective": "slo"}
        before = _labelled(slide, "tiergate:requests_received", labels)
        for _ in range(8):  # idle engines: the router's tie goes to the first, the plugin's
            _chat(client, max_tokens=2, extra_headers=headers)
            if _labelled(slide, "tiergate:requests_received", labels) > before:
                break
        else:
            raise AssertionError(f"no {kind} request reached the policy as such")


def _labelled(server: VllmServer, name: str, labels: dict[str, str]) -> float:
    """The sample of ``name`` whose labels include ``labels`` (0 if none)."""
    for line in server.metrics().splitlines():
        if line.startswith(name + "{"):
            have = parse_labels(line[len(name) :])
            if all(have.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _gauge(server: VllmServer, name: str) -> float:
    total = 0.0
    for line in server.metrics().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---- faults -----------------------------------------------------------------------------------


def test_a_frozen_engine_leaves_routing_and_its_seats_leave_admission(
    gateway: GatewayThread, keys: dict[str, str], engines: dict
) -> None:
    frozen = engines["vllm-stock"]
    backend = _backend(gateway, "vllm-stock")
    frozen.signal(signal.SIGSTOP)
    try:
        _wait_for(lambda: not backend.view.healthy, what="breaker open on the frozen engine")
        assert gateway.state.pool.capacity == SEATS
        assert gateway.state.queue.max_in_flight == SEATS
        client = _client(gateway, keys["frozen"])
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _: _stream(client, max_tokens=8), range(8)))
        assert [error for _, error, _ in results] == [None] * 8
    finally:
        frozen.signal(signal.SIGCONT)
    _wait_for(lambda: backend.view.healthy, what="the engine back in routing")
    _wait_for(lambda: gateway.state.pool.capacity == 2 * SEATS)


def test_kill_9_under_load_fails_only_what_was_on_the_dead_engine(
    gateway: GatewayThread, keys: dict[str, str], engines: dict, factory: sessionmaker[Session]
) -> None:
    """Two engines kept busy; ``kill -9`` of one. Requests that had not reached it are served
    (0 client errors); its streams end with an OpenAI error event; nothing fails on the
    survivor; its last scraped load is not shown as if it were alive."""
    victim, victim_name = engines["vllm-stock"], "vllm-stock"
    backend = _backend(gateway, victim_name)
    client = _client(gateway, keys["killed"])
    errors: list[str] = []

    def one(_: int) -> None:
        _, error, _ = _stream(client, max_tokens=160)
        if error is not None:
            errors.append(error)

    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(one, i) for i in range(32)]
        # the gateway's own count of what it has on the victim, not the engine's scraped one:
        # a /metrics scrape of a core busy with 16 streams may time out, and the router's
        # count is exact
        _wait_for(
            lambda: backend.own_decoding + len(backend.view.prefill_queue) >= 4,
            what="load on the victim",
            state=lambda: _load_of(gateway),
        )
        victim.kill()
        # more arrive after the kill: all of them must be served by the survivor
        futures += [pool.submit(one, i) for i in range(16)]
        for future in futures:
            future.result()
    _wait_for(lambda: not backend.view.healthy)
    assert backend.running is None  # the dead engine's last numbers are gone
    assert gateway.state.pool.capacity == SEATS
    _wait_for(lambda: gateway.state.queue.in_flight == 0)
    deadline = time.monotonic() + 120  # the usage writer is asynchronous
    while len(rows := _rows_of(factory, "killed")) < 48 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(rows) == 48, [(r.backend, r.status, r.reject_reason) for r in rows]  # none lost
    failed = [r for r in rows if r.status != "ok"]
    # every failure was a stream the dead engine held; none on the survivor
    assert all(r.backend == victim_name for r in failed), [(r.backend, r.status) for r in failed]
    assert len(errors) == len(failed)


def test_a_restarted_engine_comes_back_as_what_it_now_is(
    gateway: GatewayThread, key: str, engines: dict
) -> None:
    """The killed engine restarts on the same port with another policy: the gateway takes it
    back, with the seats and policy it now states."""
    old = engines["vllm-stock"]
    old.kill()  # already dead unless the kill test stopped before its kill
    restarted = VllmServer("vllm-stock", "gmax", core=old.core, log_dir=old.log_dir, port=old.port)
    engines["vllm-stock"] = restarted.start()
    restarted.wait_ready()
    backend = _backend(gateway, "vllm-stock")
    _wait_for(lambda: backend.view.healthy, what="back in routing")
    _wait_for(lambda: backend.facts is not None and backend.facts.policy == "gmax")
    _wait_for(lambda: gateway.state.pool.capacity == 2 * SEATS)
    pieces, error, _ = _stream(_client(gateway, key), max_tokens=8)
    assert error is None and pieces > 0
