"""Engine faults: stalls, garbage, hangs, freezes and crashes, before and after the
first token — failover within a first-token timeout from the request's own SLO, a clean OpenAI
error event after it, the breaker opening on probes or the watchdog and closing on evidence,
nothing left held. The short form of ``bench/drill_engine.py``.

Two emulated engines with fault injection (``/fault-injection``): engine-0 (A100 profile) wins
idle ties, so a request's first attempt goes to it, and engine-1 (910B) is the healthy one.
Each test runs its own gateway with short timeouts (``FAST``). No assertion is about how long
something took: tests wait on states (``_wait_for`` bounds only a failing test) and count
what happened (metrics, usage rows). The pure parts — breaker, budgets, watchdog, event
checks — are tested without servers at the end.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread, RunningEngine
from gateway.app import BackendSpec, create_app
from gateway.app.backends import BackendPool
from gateway.app.breaker import Breaker, OpenReason
from gateway.app.deadlines import attempt_budget, stall_timeout
from gateway.app.metrics import GatewayMetrics
from gateway.app.server import GatewayThread
from gateway.app.upstream import Upstream, UpstreamError, UpstreamTimeout
from gateway.app.watchdog import StreamWatch, stalled_backends
from gateway.dataplane.answers import EngineRefused, UpstreamFailed, has_output, well_formed
from gateway.db import crud
from gateway.db.models import UsageRecord
from gateway.db.seed import seed_defaults
from gateway.settings import Settings
from priority.request import SLO, Request, RequestMeta
from tests.gateway.polling import wait_for

MODEL = "qwen2-7b"
SECRET = "engine-faults-secret"
SLO_HEADERS = {"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "25"}  # the premium tier's floors
FAST: dict[str, Any] = {
    "first_token_timeout_factor": 4.0,  # 1 s for a 250 ms TTFT objective
    "first_token_timeout_min_s": 0.2,
    "stall_timeout_factor": 1.0,
    "stall_timeout_min_s": 1.0,
    "probe_interval_s": 0.05,
    "probe_timeout_s": 1.0,
    "breaker_trial_timeout_s": 1.0,
    "scrape_interval_s": 0.2,
}
KINDS = ["text", "binary", "empty", "oversized", "truncated"]


@pytest.fixture(scope="module")
def engines() -> Iterator[list[RunningEngine]]:
    specs = [
        EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL, fault_injection=True),
        EngineSpec("910b-qwen2-7b", "vllm-v1-priority", MODEL, fault_injection=True),
    ]
    with EngineThread(specs) as running:
        yield running


@pytest.fixture(autouse=True)
def _healthy_engines(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every integration test leaves its engines healthy and idle for the next one."""
    yield
    if "engines" in request.fixturenames:
        running: list[RunningEngine] = request.getfixturevalue("engines")
        for engine in running:
            _inject(engine, mode="none")
        wait_for(lambda: all(e.sim.core.num_running + e.sim.core.num_waiting == 0 for e in running))


@pytest.fixture
def key(factory: sessionmaker[Session]) -> str:
    with factory.begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name="faulty", tier="premium")
        return crud.create_key(session, actor="test", tenant="faulty", secret=SECRET).plaintext


@contextmanager
def _gateway(
    factory: sessionmaker[Session],
    engines: list[RunningEngine],
    tmp_path: Path,
    **overrides: Any,
) -> Iterator[GatewayThread]:
    settings = Settings(
        database_url=str(factory.kw["bind"].url),
        secret=SecretStr(SECRET),
        data_dir=tmp_path,
        redis_url=None,
        **(FAST | overrides),
    )
    backends = [
        BackendSpec(f"engine-{i}", e.url, MODEL, e.spec.profile) for i, e in enumerate(engines)
    ]
    with GatewayThread(create_app(settings, backends=backends)) as gateway:
        wait_for(lambda: gateway.state.pool.ready)
        yield gateway
        _assert_released(gateway)


def _inject(engine: RunningEngine, **fault: Any) -> None:
    response = httpx.post(f"{engine.url}/fault-injection", json=fault, timeout=10)
    assert response.status_code == 200, response.text


def _request(
    gateway: GatewayThread, key: str, *, stream: bool = True, max_tokens: int = 4
) -> tuple[int, list[str], list[dict[str, Any]]]:
    """One chat request: status, the content pieces received, the error events received."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello there."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    headers = {"authorization": f"Bearer {key}", **SLO_HEADERS}
    url = f"{gateway.base_url}/chat/completions"
    with httpx.Client(timeout=60) as client:
        if not stream:
            response = client.post(url, json=body, headers=headers)
            if response.status_code != 200:
                return response.status_code, [], [response.json()["error"]]
            return 200, [response.json()["choices"][0]["message"]["content"]], []
        with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                response.read()
                return response.status_code, [], [response.json()["error"]]
            return (200, *_events(response.iter_lines()))


def _events(lines: Iterator[str]) -> tuple[list[str], list[dict[str, Any]]]:
    content: list[str] = []
    errors: list[dict[str, Any]] = []
    for line in lines:
        if not line.startswith("data: {"):
            continue
        data = json.loads(line[6:])
        if "error" in data:
            errors.append(data["error"])
        for choice in data.get("choices") or ():
            if choice["delta"].get("content"):
                content.append(choice["delta"]["content"])
    return content, errors


def _count(gateway: GatewayThread, name: str, **labels: str) -> float:
    value = gateway.state.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def _assert_released(gateway: GatewayThread) -> None:
    """Nothing held after the fault: dispatch slots, routing state, watchdog entries."""
    state = gateway.state
    wait_for(lambda: state.queue.in_flight == 0)
    wait_for(lambda: not state.pool.streams)
    for backend in state.pool.backends:
        wait_for(lambda b=backend: not b.attempts and not b.view.prefill_queue)  # type: ignore[misc]
        assert backend.own_decoding == 0


def _usage(factory: sessionmaker[Session]) -> list[tuple[str, str | None]]:
    with factory() as session:
        rows = session.scalars(select(UsageRecord).order_by(UsageRecord.id)).all()
        return [(r.status, r.backend) for r in rows]


# ---- before the first token: failover ------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_a_stalled_engine_is_left_for_another_within_the_first_token_timeout(
    factory: sessionmaker[Session],
    engines: list[RunningEngine],
    key: str,
    tmp_path: Path,
    stream: bool,
) -> None:
    _inject(engines[0], mode="stall")  # accepts, never streams
    with _gateway(factory, engines, tmp_path) as gateway:
        status, content, errors = _request(gateway, key, stream=stream)
        assert status == 200 and content and not errors
        phase = "first_token" if stream else "response"
        timeouts = "tiergate_upstream_timeouts_total"
        assert _count(gateway, timeouts, backend="engine-0", phase=phase) == 1
        assert _count(gateway, "tiergate_failovers_total", tier="premium") == 1
        backend = gateway.state.pool.backends[0]
        assert backend.breaker.failures == 1 and backend.view.healthy  # 1 of 3: still routed
    assert _usage(factory) == [("ok", "engine-1")]


@pytest.mark.parametrize("kind", KINDS)
def test_garbage_before_the_first_token_fails_over(
    factory: sessionmaker[Session],
    engines: list[RunningEngine],
    key: str,
    tmp_path: Path,
    kind: str,
) -> None:
    _inject(engines[0], mode="garbage", garbage=kind)
    with _gateway(factory, engines, tmp_path) as gateway:
        status, content, errors = _request(gateway, key)
        assert status == 200 and content and not errors
        assert _count(gateway, "tiergate_upstream_failures_total", backend="engine-0") == 1
        assert _count(gateway, "tiergate_failovers_total", tier="premium") == 1
    assert _usage(factory) == [("ok", "engine-1")]


def test_a_non_json_answer_fails_over(
    factory: sessionmaker[Session], engines: list[RunningEngine], key: str, tmp_path: Path
) -> None:
    _inject(engines[0], mode="garbage")
    with _gateway(factory, engines, tmp_path) as gateway:
        status, content, _ = _request(gateway, key, stream=False)
        assert status == 200 and content
        assert _count(gateway, "tiergate_upstream_failures_total", backend="engine-0") == 1
    assert _usage(factory) == [("ok", "engine-1")]


def test_every_backend_failing_is_a_503_with_retry_after(
    factory: sessionmaker[Session], engines: list[RunningEngine], key: str, tmp_path: Path
) -> None:
    for engine in engines:
        _inject(engine, mode="garbage")
    with _gateway(factory, engines, tmp_path) as gateway:
        response = httpx.post(
            f"{gateway.base_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        )
    assert response.status_code == 503 and response.headers["retry-after"]
    assert response.json()["error"]["code"] == "upstream_unavailable"
    assert _usage(factory) == [("error", None)]


def test_no_healthy_backend_is_a_503_with_retry_after(
    factory: sessionmaker[Session], engines: list[RunningEngine], key: str, tmp_path: Path
) -> None:
    with _gateway(factory, engines, tmp_path) as gateway:
        for engine in engines:
            _inject(engine, mode="crash")  # /health answers 503: every breaker opens
        wait_for(lambda: not any(b.view.healthy for b in gateway.state.pool.backends))
        response = httpx.post(
            f"{gateway.base_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        )
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "no_healthy_backend"


# ---- after the first token: a clean error event ----------------------------------------------


def test_a_stream_that_stalls_after_its_first_token_ends_with_an_error_event(
    factory: sessionmaker[Session], engines: list[RunningEngine], key: str, tmp_path: Path
) -> None:
    _inject(engines[0], mode="stall", after_tokens=2)
    with _gateway(factory, engines, tmp_path) as gateway:
        status, content, errors = _request(gateway, key, max_tokens=50)
        assert status == 200 and len(content) == 2
        assert [e["code"] for e in errors] == ["upstream_error"]
        assert "no event for" in errors[0]["message"]
        timeouts = "tiergate_upstream_timeouts_total"
        assert _count(gateway, timeouts, backend="engine-0", phase="stall") == 1
    assert _usage(factory) == [("error", "engine-0")]


@pytest.mark.parametrize("kind", KINDS)
def test_garbage_after_the_first_token_ends_with_an_error_event(
    factory: sessionmaker[Session],
    engines: list[RunningEngine],
    key: str,
    tmp_path: Path,
    kind: str,
) -> None:
    _inject(engines[0], mode="garbage", garbage=kind, after_tokens=2)
    with _gateway(factory, engines, tmp_path) as gateway:
        status, content, errors = _request(gateway, key, max_tokens=50)
        assert status == 200 and len(content) == 2
        assert [e["code"] for e in errors] == ["upstream_error"]
        assert _count(gateway, "tiergate_upstream_failures_total", backend="engine-0") == 1
    assert _usage(factory) == [("error", "engine-0")]


# ---- the breaker: probes, watchdog, recovery ---------------------------------------------------


def test_a_frozen_engine_is_taken_out_by_its_probe_and_its_waiting_attempts_fail_over(
    factory: sessionmaker[Session], engines: list[RunningEngine], key: str, tmp_path: Path
) -> None:
    """The first attempt waits on engine-0 (stalled) with a first-token timeout of minutes;
    the engine then freezes: its liveness probe times out, the breaker opens, and the waiting
    attempt is abandoned at once and served by engine-1 (no timeout ever fired). Thawed, the
    engine answers ``/health`` and its breaker closes."""
    _inject(engines[0], mode="stall")
    patient = {"first_token_timeout_min_s": 600.0, "first_token_timeout_max_s": 600.0}
    with (
        _gateway(factory, engines, tmp_path, probe_timeout_s=0.2, **patient) as gateway,
        ThreadPoolExecutor(1) as pool,
    ):
        backend = gateway.state.pool.backends[0]
        reply = pool.submit(_request, gateway, key)
        wait_for(lambda: len(backend.attempts) == 1)
        _inject(engines[0], mode="freeze")
        status, content, errors = reply.result(timeout=60)
        assert status == 200 and content and not errors
        assert backend.breaker.reason is OpenReason.UNREACHABLE
        assert _count(gateway, "tiergate_upstream_timeouts_total", backend="engine-0",
                      phase="first_token") == 0  # fmt: skip
        assert _count(gateway, "tiergate_failovers_total", tier="premium") == 1
        _inject(engines[0], mode="none")
        wait_for(lambda: backend.view.healthy)
        assert backend.breaker.reason is None
    assert _usage(factory) == [("ok", "engine-1")]


def test_a_hung_engine_is_taken_out_by_the_watchdog_and_back_after_a_trial(
    factory: sessionmaker[Session], engines: list[RunningEngine], key: str, tmp_path: Path
) -> None:
    """A stream decodes on engine-0; its engine core hangs (``/health`` still answers). The
    watchdog sees every stream there wait with no event and opens the breaker for
    unresponsiveness; the stream ends with an error event at its stall timeout; new requests
    go to engine-1. Resumed, a 1-token trial succeeds and closes the breaker."""
    with _gateway(factory, engines, tmp_path) as gateway:
        backend = gateway.state.pool.backends[0]
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hello there."}],
            "max_tokens": 5000,
            "stream": True,
        }
        headers = {"authorization": f"Bearer {key}", **SLO_HEADERS}
        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "POST", f"{gateway.base_url}/chat/completions", json=body, headers=headers
            ) as response,
        ):
            lines = response.iter_lines()
            first, _ = _events(iter([next(line for line in lines if '"content"' in line)]))
            assert first
            _inject(engines[0], mode="hang")
            wait_for(lambda: not backend.view.healthy)
            assert backend.breaker.reason is OpenReason.UNRESPONSIVE
            _, errors = _events(lines)
        assert [e["code"] for e in errors] == ["upstream_error"]
        assert _count(gateway, "tiergate_breaker_opens_total", backend="engine-0",
                      reason="unresponsive") == 1  # fmt: skip
        status, content, _ = _request(gateway, key)
        assert status == 200 and content
        _inject(engines[0], mode="none")
        wait_for(lambda: backend.view.healthy)
        assert backend.breaker.reason is None
    assert _usage(factory) == [("error", "engine-0"), ("ok", "engine-1")]


def test_a_crashed_engine_core_ends_its_streams_and_is_out_until_it_serves_again(
    factory: sessionmaker[Session], engines: list[RunningEngine], key: str, tmp_path: Path
) -> None:
    with (
        _gateway(factory, engines, tmp_path) as gateway,
        ThreadPoolExecutor(1) as pool,
    ):
        backend = gateway.state.pool.backends[0]
        reply = pool.submit(_request, gateway, key, max_tokens=5000)
        wait_for(lambda: backend.own_decoding == 1)
        _inject(engines[0], mode="crash")
        status, content, errors = reply.result(timeout=60)
        assert status == 200 and content and [e["code"] for e in errors] == ["upstream_error"]
        wait_for(lambda: backend.breaker.reason is OpenReason.UNREACHABLE)  # /health: 503
        assert _request(gateway, key)[0] == 200
        _inject(engines[0], mode="none")
        wait_for(lambda: backend.view.healthy)
    assert _usage(factory) == [("error", "engine-0"), ("ok", "engine-1")]


def test_fault_injection_is_off_unless_asked_for() -> None:
    with EngineThread([EngineSpec("a100-qwen2-7b", "vllm-v1", MODEL)]) as (engine,):
        assert httpx.get(f"{engine.url}/fault-injection").status_code == 404
        assert engine.sim.faults is None


def test_a_fault_is_checked_before_it_is_applied(engines: list[RunningEngine]) -> None:
    url = f"{engines[0].url}/fault-injection"
    assert httpx.post(url, json={"mode": "explode"}).status_code == 422
    assert httpx.post(url, json={"mode": "stall", "after_tokens": -1}).status_code == 422
    assert httpx.get(url).json() == {"mode": "none", "after_tokens": 0, "garbage": "text"}


@pytest.mark.slow
def test_the_drill_script_runs_and_leaves_nothing_held() -> None:
    """``bench/drill_engine.py`` in short: engine processes frozen (SIGSTOP) and garbling."""
    script = Path(__file__).resolve().parents[2] / "bench" / "drill_engine.py"
    args = ["--engines", "2", "--rps", "8", "--baseline-s", "1", "--fault-s", "1.5"]
    args += ["--settle-s", "1.5", "--faults", "freeze,garbage", "--json"]
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, timeout=300, check=True
    )
    result = json.loads(done.stdout)
    assert [f["fault"] for f in result["faults"]] == ["freeze", "garbage"]
    for fault in result["faults"]:
        assert fault["hung"] == 0 and fault["errors_before_first_token"] == 0
        assert fault["breaker_open_after_s"] is not None
        assert fault["breaker_closed_after_recovery_s"] is not None
    assert sum(result["faults"][0]["breaker_opens"].values()) == 1  # probe or watchdog first
    assert result["after"] == {
        "in_flight": 0,
        "awaiting_first_token": 0,
        "engines_running_or_waiting": 0,
        "unanswered_requests": 0,
    }


# ---- pure parts -------------------------------------------------------------------------------


def test_breaker_opens_after_consecutive_failures_and_a_success_resets_the_count() -> None:
    breaker = Breaker(threshold=3, cooldown_s=5.0)
    assert not breaker.failure(0.0) and not breaker.failure(0.1)
    breaker.success()
    assert not breaker.failure(0.2) and not breaker.failure(0.3)  # counted from zero again
    assert breaker.failure(0.4) and breaker.reason is OpenReason.UNRESPONSIVE
    assert not breaker.routable(5.3) and breaker.routable(5.4)  # half-open after the cooldown
    assert breaker.failure(5.5) and not breaker.routable(5.6)  # one failure re-opens it
    assert not breaker.alive()  # /health answering proves nothing for an unresponsive engine
    assert breaker.success() and breaker.reason is None and breaker.routable(5.6)


def test_breaker_opened_by_a_probe_closes_on_the_next_good_probe() -> None:
    breaker = Breaker(threshold=3, cooldown_s=5.0)
    assert breaker.trip(1.0, OpenReason.UNREACHABLE)
    assert not breaker.trip(1.5, OpenReason.UNRESPONSIVE)  # already out: nothing to abandon
    assert breaker.reason is OpenReason.UNREACHABLE  # the stronger finding stays
    assert breaker.alive() and breaker.routable(1.6) and not breaker.alive()


def _slo(ttft_ms: float = 1000.0, tpot_ms: float = 50.0, deadline_ms: float | None = None) -> Any:
    deadline_s = deadline_ms / 1e3 if deadline_ms is not None else None
    slo = SLO(ttft_s=ttft_ms / 1e3, tpot_s=tpot_ms / 1e3, deadline_s=deadline_s)
    return RequestMeta(slo, weight=1.0, tier="t", tenant="a")


def test_first_token_budget_comes_from_the_ttft_objective_and_shrinks_across_attempts() -> None:
    settings = Settings()  # factor 2, bounds [0.5, 60] s
    common: dict[str, Any] = {"expected_output": 100, "arrival": 10.0, "first_dispatch": 12.0}
    budget = attempt_budget(settings, _slo(), stream=True, best_effort=False, **common)
    assert budget.timeout(12.0) == pytest.approx(2.0)  # 2 x 1 s
    assert budget.timeout(13.5) == pytest.approx(0.5)  # a retry gets what is left ...
    assert budget.timeout(20.0) == pytest.approx(0.5)  # ... but never less than the floor
    tight = attempt_budget(settings, _slo(ttft_ms=100), stream=True, best_effort=False, **common)
    assert tight.timeout(12.0) == pytest.approx(0.5)
    loose = attempt_budget(settings, _slo(), stream=True, best_effort=True, **common)
    assert loose.timeout(12.0) == pytest.approx(60.0)  # best effort: the maximum
    capped = attempt_budget(
        settings, _slo(deadline_ms=2500), stream=True, best_effort=False, **common
    )
    assert capped.timeout(12.0) == pytest.approx(0.5)  # deadline at 12.5: only the floor left
    given_up = attempt_budget(
        settings, _slo(deadline_ms=2500), stream=True, best_effort=True, **common
    )
    assert given_up.timeout(12.0) == pytest.approx(60.0)  # best effort gave its deadline up


def test_a_non_streamed_request_is_given_its_whole_answer_time() -> None:
    settings = Settings()
    common: dict[str, Any] = {"arrival": 0.0, "first_dispatch": 0.0, "best_effort": False}
    budget = attempt_budget(settings, _slo(), stream=False, expected_output=100, **common)
    assert budget.timeout(0.0) == pytest.approx(2 * (1.0 + 0.05 * 100))
    best = attempt_budget(
        settings, _slo(), stream=False, expected_output=100, **(common | {"best_effort": True})
    )
    assert best.timeout(0.0) == settings.upstream_timeout_s


def test_stall_timeout_is_bounded() -> None:
    settings = Settings()  # 20 x TPOT within [2, 30] s
    assert stall_timeout(settings, _slo(tpot_ms=50)) == pytest.approx(2.0)
    assert stall_timeout(settings, _slo(tpot_ms=200)) == pytest.approx(4.0)
    assert stall_timeout(settings, _slo(tpot_ms=5000)) == pytest.approx(30.0)


class _Probed(Upstream):
    """An upstream whose liveness probes answer what the test says."""

    def __init__(self) -> None:
        super().__init__(read_timeout_s=5, connect_timeout_s=1)
        self.answer: int | UpstreamError = 200

    async def status(self, url: str, timeout_s: float) -> int:
        if isinstance(self.answer, UpstreamError):
            raise self.answer
        return self.answer


def test_liveness_probe_verdicts() -> None:
    """Any answer below 500 is alive (an engine without ``/health`` answers 404); a 5xx, a
    refused connection or a timeout is not — unless the gateway's own event loop was late,
    which makes a timeout inconclusive: probed again at once instead."""
    upstream = _Probed()
    pool = BackendPool(Settings(), upstream, GatewayMetrics())
    pool.configure([BackendSpec("a", "http://a:8000", MODEL, "a100-qwen2-7b")])
    backend = pool.backends[0]
    verdicts: list[tuple[int | UpstreamError, OpenReason | None]] = [
        (404, None),
        (503, OpenReason.UNREACHABLE),
        (200, None),
        (UpstreamError("ClientConnectorError"), OpenReason.UNREACHABLE),
        (204, None),
    ]
    for answer, reason in verdicts:
        upstream.answer = answer
        asyncio.run(pool.health.check(backend))
        assert backend.breaker.reason is reason
        assert backend.view.healthy is (reason is None)
    upstream.answer = UpstreamTimeout("TimeoutError")
    pool.health.lagged_at = time.monotonic()
    backend.next_probe = 1e9
    asyncio.run(pool.health.check(backend))
    assert backend.breaker.reason is None and backend.next_probe == 0.0
    pool.health.lagged_at = -1e9
    asyncio.run(pool.health.check(backend))
    assert backend.breaker.reason is OpenReason.UNREACHABLE


class _SlowHealth(_Probed):
    """``/health`` times out; ``on_probe`` runs while it waits (a stream's read stamping the
    backend's ``last_event``, as the proxy does on every read)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = UpstreamTimeout("TimeoutError")
        self.on_probe: Callable[[], None] | None = None

    async def status(self, url: str, timeout_s: float) -> int:
        if self.on_probe is not None:
            self.on_probe()
        return await super().status(url, timeout_s)


def test_a_slow_health_answer_from_an_engine_still_streaming_is_busy_not_dead() -> None:
    """A loaded engine answers ``/health`` behind its tokens: a probe that times out while its
    streams deliver leaves the breaker closed (counted as a slow probe); one with nothing
    delivered meanwhile opens it (a frozen or dead engine sends nothing)."""
    for streaming in (True, False):
        upstream = _SlowHealth()
        metrics = GatewayMetrics()
        pool = BackendPool(Settings(), upstream, metrics)
        pool.configure([BackendSpec("a", "http://a:8000", MODEL, "a100-qwen2-7b")])
        backend = pool.backends[0]
        pool.health.lagged_at = -1e9
        if streaming:
            upstream.on_probe = lambda b=backend: setattr(b, "last_event", time.monotonic())
        asyncio.run(pool.health.check(backend))
        slow = metrics.registry.get_sample_value("tiergate_slow_probes_total", {"backend": "a"})
        if streaming:
            assert backend.breaker.reason is None and backend.view.healthy and slow == 1
        else:
            assert backend.breaker.reason is OpenReason.UNREACHABLE and not slow


class _Timeout:
    def __init__(self) -> None:
        self.when: float | None = None

    def expired(self) -> bool:
        return self.when is not None

    def reschedule(self, when: float) -> None:
        self.when = when


def test_watchdog_expires_stalled_streams_and_finds_silent_backends() -> None:
    quiet, busy = object(), object()
    watches = {
        StreamWatch(quiet, stall_s=5.0, read_since=100.0),  # type: ignore[arg-type]
        StreamWatch(quiet, stall_s=1.5, read_since=100.5),  # type: ignore[arg-type]
        StreamWatch(busy, stall_s=5.0, read_since=101.8),  # type: ignore[arg-type]
        StreamWatch(busy, stall_s=5.0, read_since=100.0),  # type: ignore[arg-type]
        StreamWatch(busy, stall_s=0.1, read_since=0.0),  # type: ignore[arg-type]  # writing
    }
    deadlines = {}
    for watch in watches:
        deadlines[id(watch)] = watch.deadline = _Timeout()  # type: ignore[assignment]
    silent = stalled_backends(watches, now=102.1, loop_now=7.0, floor_s=1.0)
    assert silent == {quiet: pytest.approx(1.6)}  # busy has a stream that waited only 0.3 s
    expired = [w.stall_s for w in watches if deadlines[id(w)].when == 7.0]
    assert expired == [1.5]  # only the stream past its own stall timeout; not the writer


def test_the_hang_threshold_follows_the_longest_step_the_engine_may_be_running() -> None:
    pool = BackendPool(
        Settings(), Upstream(read_timeout_s=5, connect_timeout_s=1), GatewayMetrics()
    )
    pool.configure([BackendSpec("a", "http://a:8000", MODEL, "a100-qwen2-7b")])
    backend = pool.backends[0]
    assert pool.stall_threshold(backend) == Settings().backend_stall_min_s  # decodes only
    prompt = Request("r", arrival_s=0.0, prompt_tokens=24000, slo=SLO(ttft_s=1.0, tpot_s=0.1))
    backend.view.prefill_queue["r"] = prompt
    long_prompt = pool.stall_threshold(backend)  # its last 8192-token chunk: ~1 s on an A100
    assert long_prompt > 1.0
    del backend.view.prefill_queue["r"]
    for i in range(40):  # many short prompts fill a step's token budget together
        short = Request(f"s{i}", arrival_s=0.0, prompt_tokens=500, slo=SLO(1.0, 0.1))
        backend.view.prefill_queue[short.request_id] = short
    assert pool.stall_threshold(backend) > 1.5 * 0.5  # a full 8192-token step: ~0.56 s
    backend.view.prefill_queue.clear()
    backend.external = 3  # work someone else sent: assume the longest prompt
    assert pool.stall_threshold(backend) > long_prompt


@pytest.mark.parametrize(
    "event",
    [
        b"data: not json\n\n",
        b"data:\n\n",
        b"\x00\xff\x13binary\n\n",
        b"data: [1, 2]\n\n",
        b'data: {"choices": "nope"}\n\n',
        b'data: {"choices": [{"delta": 3}]}\n\n',
        b'data: {"error": {"message": "boom", "code": 500}}\n\n',
    ],
)
def test_garbage_before_the_first_token_is_a_failed_attempt(event: bytes) -> None:
    with pytest.raises(UpstreamFailed):
        has_output(event)


def test_events_before_the_first_token_that_are_not_garbage() -> None:
    assert not has_output(b": keep-alive\n\n")
    assert not has_output(b"data: [DONE]\n\n")
    assert not has_output(b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n')
    assert has_output(b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n\n')
    with pytest.raises(EngineRefused):
        has_output(b'data: {"error": {"message": "too long", "code": 400}}\n\n')


def test_relayed_events_are_checked_for_shape() -> None:
    assert well_formed(b'data: {"choices": []}\n\n')
    for garbage in (b"data: nope\n\n", b"data: {\n\n", b'data: {"a": 1}\ndata: {}\n\n', b"{}\n\n"):
        assert not well_formed(garbage)


def test_an_engine_that_breaks_every_stream_after_its_first_token_is_taken_out(
    factory: sessionmaker[Session], engines: list[RunningEngine], key: str, tmp_path: Path
) -> None:
    """A first token is no proof: only whole streams reset the failure count, so three broken
    streams in a row open the breaker and the fourth request goes to engine-1."""
    _inject(engines[0], mode="garbage", after_tokens=1)
    with _gateway(factory, engines, tmp_path) as gateway:
        backend = gateway.state.pool.backends[0]
        for _ in range(3):
            # idle ties go to engine-0 only if the router has seen it idle: the broken stream's
            # request is aborted there, and a scrape taken before the abort shows it busy
            wait_for(lambda: engines[0].sim.core.num_running + engines[0].sim.core.num_waiting == 0)
            wait_for(lambda: backend.running == 0 and backend.waiting == 0)
            status, content, errors = _request(gateway, key, max_tokens=50)
            assert status == 200 and content and errors
        assert backend.breaker.reason is OpenReason.UNRESPONSIVE
        status, content, errors = _request(gateway, key)
        assert status == 200 and content and not errors
    assert _usage(factory) == [("error", "engine-0")] * 3 + [("ok", "engine-1")]
