"""Several gateway workers behind one port: limits, merged metrics, graceful drain.

The unit tests check each piece on its own (the per-worker share of limits, multiprocess metrics
merged over real processes, the drain middleware and server); the end-to-end ones run
``tiergate serve`` in a subprocess and talk to it through the official ``openai`` client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from gateway.app.drain import SHUTTING_DOWN, Drain, DrainMiddleware
from gateway.app.multiproc import forget_process, observe_many, render_multiprocess
from gateway.graceful import DrainingServer
from gateway.limits import InMemoryRateLimiter, LimitExceeded, Limits, RejectReason
from gateway.worker_limits import WorkerShareLimiter, per_worker_limits, worker_share
from gateway.workers import default_workers
from tiergate_cli import MODEL_NAME

ROOT = Path(__file__).resolve().parents[2]

# ---- limits: each worker its share ----------------------------------------------------------


def test_worker_share_rounds_down_and_leaves_limits_below_n_to_the_shared_table() -> None:
    assert worker_share(Limits(rpm=101, tpm=1000, max_concurrency=3), 2) == Limits(50, 500, 1)
    # below N: no share (1 each would admit N in all); the workers' shared table counts it
    assert worker_share(Limits(rpm=1, max_concurrency=4), 4) == Limits(max_concurrency=1)
    assert worker_share(Limits(), 8) == Limits()


@pytest.mark.asyncio
async def test_share_limiter_admits_its_share_and_says_which() -> None:
    limiter = WorkerShareLimiter(InMemoryRateLimiter(), workers=4)
    limits = Limits(rpm=10)
    for _ in range(2):  # 10 // 4
        await limiter.reserve("t", limits, 1)
    with pytest.raises(LimitExceeded) as refused:
        await limiter.reserve("t", limits, 1)
    assert refused.value.reason is RejectReason.RATE_LIMIT_RPM
    assert "share, 2 of the tenant's 10" in refused.value.message
    assert refused.value.retry_after_s is not None
    for _ in range(50):  # unlimited tenants are untouched
        await limiter.reserve("u", Limits(), 1)
    assert (await limiter.usage("t")).requests == 2


def test_limits_are_wrapped_only_for_several_workers_without_redis() -> None:
    inner = InMemoryRateLimiter()
    assert per_worker_limits(inner, workers=1, shared=False) is inner
    assert per_worker_limits(inner, workers=4, shared=True) is inner
    wrapped = per_worker_limits(inner, workers=4, shared=False)
    assert isinstance(wrapped, WorkerShareLimiter) and wrapped.workers == 4


def test_default_workers_is_one_per_cpu_capped() -> None:
    assert default_workers() == min(len(os.sched_getaffinity(0)), 8)


# ---- backends changed through another worker ---------------------------------------------------


@pytest.mark.asyncio
async def test_a_backend_added_elsewhere_is_picked_up_by_refresh(
    session_factory: sessionmaker[Session],
) -> None:
    from gateway.app.backends import BackendPool
    from gateway.app.metrics import GatewayMetrics
    from gateway.app.upstream import Upstream
    from gateway.db import crud
    from gateway.settings import Settings

    def add(name: str) -> None:
        with session_factory.begin() as session:
            crud.create_backend(
                session,
                actor="test",
                name=name,
                base_url=f"http://127.0.0.1:1/{name}",
                model="m",
                profile="a100-qwen2-7b",
            )

    add("first")
    upstream = Upstream(read_timeout_s=1, connect_timeout_s=1)
    pool = BackendPool(Settings(), upstream, GatewayMetrics(), session_factory=session_factory)
    try:
        await pool.reload()
        assert not await pool.refresh()  # unchanged: routing state kept
        add("second")  # e.g. through the admin API of another worker
        assert await pool.refresh()
        assert sorted(b.name for b in pool.backends) == ["first", "second"]
        assert not await pool.refresh()
    finally:
        await upstream.aclose()


# ---- metrics merged over processes ----------------------------------------------------------


def test_observe_many_equals_observing_each_value() -> None:
    values = [0.005, 0.01, 0.011, 0.3, 0.3, 2.0, 1e6]
    one, each = CollectorRegistry(), CollectorRegistry()
    batch = Histogram("h", "h", buckets=(0.01, 0.1, 1.0), registry=one)
    single = Histogram("h", "h", buckets=(0.01, 0.1, 1.0), registry=each)
    observe_many(batch, values)
    for value in values:
        single.observe(value)

    def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
        return {
            (s.name, s.labels.get("le", "")): s.value
            for family in registry.collect()
            for s in family.samples
            if not s.name.endswith("_created")
        }

    assert samples(one) == samples(each)


CHILD = """
import os, sys
from gateway.app.metrics import GatewayMetrics
n, running = int(sys.argv[1]), float(sys.argv[2])
m = GatewayMetrics()
for i in range(n):
    m.requests.labels("", "standard", "200").inc()
    m.ttft.labels("standard").observe(0.01 * (i + 1))
m.observe_itl("standard", [0.02] * n)
m.in_flight.set(n)
m.backend_running.labels("b").set(running)
m.backend_healthy.labels("b").set(1.0 if running < 10 else 0.0)
print(os.getpid())
"""


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(family: Any, name: str, **labels: str) -> float:
    found = [s.value for s in family.samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, family.samples)
    return float(found[0])


def test_multiprocess_metrics_sum_counters_merge_histograms_and_combine_gauges(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    pids = []
    for n, running in ((3, 5.0), (4, 12.0)):  # run one after the other: 12 is the most recent
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(n), str(running)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        pids.append(int(done.stdout.strip()))
    merged = _families(render_multiprocess(str(tmp_path)).decode())
    assert (
        _value(
            merged["tiergate_requests"], "tiergate_requests_total", tier="standard", status="200"
        )
        == 7
    )
    ttft = merged["tiergate_time_to_first_token_seconds"]
    assert _value(ttft, "tiergate_time_to_first_token_seconds_count", tier="standard") == 7
    # bucket le=0.025: 0.01, 0.02 of the first worker and 0.01, 0.02 of the second
    assert (
        _value(ttft, "tiergate_time_to_first_token_seconds_bucket", tier="standard", le="0.025")
        == 4
    )
    itl = merged["tiergate_inter_token_latency_seconds"]
    assert _value(itl, "tiergate_inter_token_latency_seconds_count", tier="standard") == 7
    assert _value(merged["tiergate_in_flight"], "tiergate_in_flight") == 7  # livesum
    running = merged["tiergate_backend_running"]
    assert _value(running, "tiergate_backend_running", backend="b") == 12  # livemostrecent
    assert _value(merged["tiergate_backend_healthy"], "tiergate_backend_healthy", backend="b") == 0
    # a worker creating its file for a new kind of metric (opened, not yet sized) is left
    # out, not a failed exposition
    (tmp_path / "gauge_livemax_424242.db").write_bytes(b"")
    assert _families(render_multiprocess(str(tmp_path)).decode()).keys() == merged.keys()
    forget_process(pids[1], str(tmp_path))  # the second worker exited
    after = _families(render_multiprocess(str(tmp_path)).decode())
    assert _value(after["tiergate_in_flight"], "tiergate_in_flight") == 3  # live workers only
    assert (
        _value(after["tiergate_requests"], "tiergate_requests_total", tier="standard", status="200")
        == 7
    )


# ---- the drain --------------------------------------------------------------------------------


class FakeConnection:
    """The server side of one request as uvicorn behaves: once the response is complete, the
    app's ``receive`` says the client is gone."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.complete = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        assert not self.complete.is_set(), f"sent after the response was complete: {message}"
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete.set()

    async def receive(self) -> dict[str, Any]:
        await self.complete.wait()
        return {"type": "http.disconnect"}


SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}


@pytest.mark.asyncio
async def test_drain_ends_a_stream_with_an_error_event_and_the_app_sees_the_client_leave() -> None:
    drain, first_chunk = Drain(), asyncio.Event()
    app_saw: list[str] = []

    async def relay(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        first_chunk.set()
        app_saw.append((await receive())["type"])  # as RelayStream listens for the client
        await send({"type": "http.response.body", "body": b"late", "more_body": True})

    conn = FakeConnection()
    task = asyncio.ensure_future(DrainMiddleware(relay, drain)(SCOPE, conn.receive, conn.send))
    await first_chunk.wait()
    assert drain.in_flight == 1
    assert await drain.abort_all() == 1
    await task
    assert app_saw == ["http.disconnect"]
    bodies = [m.get("body", b"") for m in conn.sent if m["type"] == "http.response.body"]
    assert bodies[0] == b"data: {}\n\n" and bodies[-1] == b"" and b"late" not in bodies
    event = json.loads(bodies[1].removeprefix(b"data: "))
    assert event["error"]["code"] == SHUTTING_DOWN
    assert not drain.requests and drain.taken == 1


@pytest.mark.asyncio
async def test_drain_answers_a_request_not_yet_answered_with_503_and_retry_after() -> None:
    drain, waiting = Drain(), asyncio.Event()

    async def unary(scope: Any, receive: Any, send: Any) -> None:
        waiting.set()
        await receive()  # as _serve_unary waits for the engine or the client to leave
        await send({"type": "http.response.start", "status": 499, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    conn = FakeConnection()
    task = asyncio.ensure_future(DrainMiddleware(unary, drain)(SCOPE, conn.receive, conn.send))
    await waiting.wait()
    await drain.abort_all()
    await task
    start, body = conn.sent
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert json.loads(body["body"])["error"]["code"] == SHUTTING_DOWN
    assert await drain.abort_all() == 0  # nothing left in flight


@pytest.mark.asyncio
async def test_drain_leaves_finished_requests_alone() -> None:
    drain = Drain()

    async def done(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    conn = FakeConnection()
    await DrainMiddleware(done, drain)(SCOPE, conn.receive, conn.send)
    assert await drain.abort_all() == 0 and len(conn.sent) == 2


def test_first_signal_drains_a_second_ctrl_c_forces() -> None:
    drain = Drain()
    server = DrainingServer(uvicorn.Config(lambda: None), drain, drain_s=7.0)
    assert server.config.timeout_graceful_shutdown == 9  # the drain, then the clean endings
    server.handle_exit(signal.SIGTERM, None)
    assert drain.draining and server.should_exit and not server.force_exit
    server.handle_exit(signal.SIGTERM, None)  # the supervisor's after a Ctrl-C: still graceful
    assert not server.force_exit
    server.handle_exit(signal.SIGINT, None)
    assert server.force_exit

    delayed = DrainingServer(uvicorn.Config(lambda: None), Drain(), drain_s=1, shutdown_delay_s=60)
    delayed.handle_exit(signal.SIGTERM, None)
    assert delayed.drain.draining and not delayed.should_exit  # still accepting for a while


# ---- the supervisor ------------------------------------------------------------------------------


@pytest.mark.slow
def test_workers_that_cannot_start_stop_the_server_instead_of_restarting_forever() -> None:
    from gateway.embedded import bind
    from gateway.settings import Settings
    from gateway.workers import Supervisor, WorkerSpec

    # nothing listens on port 1: the workers' lifespan cannot read the backends table
    broken = Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:1/none", workers=2)
    sock = bind("127.0.0.1", 0)
    supervisor = Supervisor(WorkerSpec(broken, None, "critical"), sock, 2)
    try:
        assert asyncio.run(supervisor.run()) == 1
    finally:
        sock.close()
    assert supervisor.failed and not supervisor.ever_served
    assert len(supervisor.workers) == 2  # one per slot: none was started again


# ---- end to end: tiergate serve --workers 2 ---------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    base: str
    metrics_url: str
    log: Path
    workdir: Path

    @property
    def output(self) -> str:
        return self.log.read_text()

    @property
    def key(self) -> str:
        keys = [ln.strip() for ln in self.output.splitlines() if ln.strip().startswith("tg-")]
        assert len(keys) == 1, self.output
        return keys[0]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=self.key, max_retries=0)

    def metrics(self) -> dict[str, Any]:
        return _families(httpx.get(self.metrics_url, timeout=5).text)

    def usage(self) -> dict[str, int]:
        with sqlite3.connect(self.workdir / "tiergate.db") as db:
            rows = db.execute("SELECT status, count(*) FROM usage_records GROUP BY status")
            return dict(rows.fetchall())


@contextmanager
def serving(workdir: Path, *, workers: int, **env: str) -> Iterator[Served]:
    """``tiergate serve --workers N`` on the embedded default, in ``workdir``."""
    port, metrics_port = _free_port(), _free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")}
    environ.update(TIERGATE_DATA_DIR=str(workdir), **env)
    log = workdir / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tiergate_cli",
                "serve",
                "--port",
                str(port),
                "--metrics-addr",
                f"127.0.0.1:{metrics_port}",
                "--workers",
                str(workers),
                "--log-level",
                "info",
            ],
            cwd=workdir,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    served = Served(
        proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", log, workdir
    )
    try:
        _wait_for(lambda: _ready(served), "ready", served)
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ready(served: Served) -> bool:
    if served.proc.poll() is not None:
        pytest.fail(f"tiergate serve exited ({served.proc.returncode}): {served.output}")
    try:
        return httpx.get(f"{served.base}/health/readiness", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_for(condition: Any, what: str, served: Served, limit_s: float = 90) -> None:
    """Poll ``condition`` until it holds (a generous bound against a hang, not a timing claim)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never {what}: {served.output[-4000:]}")
        time.sleep(0.2)


def _readiness(served: Served) -> tuple[int, str]:
    answer = httpx.get(f"{served.base}/health/readiness", timeout=5)
    return answer.status_code, answer.json()["status"]


def _refused(served: Served) -> bool:
    """No longer accepting: refused, or (a connection the kernel queued as the listening socket
    closed) closed without an answer or reset."""
    try:
        httpx.get(f"{served.base}/health/liveliness", timeout=5)
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
        return True
    return False


def _worker_requests(served: Served) -> dict[str, float]:
    """``tiergate_worker_requests`` by pid: the live workers and what each has taken."""
    family = served.metrics().get("tiergate_worker_requests")
    return {} if family is None else {s.labels["pid"]: s.value for s in family.samples}


def _chat(client: openai.OpenAI, max_tokens: int = 4) -> int:
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None
    return chunks[-1].usage.completion_tokens


def _requests_total(served: Served) -> float:
    family = served.metrics()["tiergate_requests"]
    return sum(s.value for s in family.samples if s.name == "tiergate_requests_total")


@pytest.mark.slow
def test_two_workers_serve_one_port_with_merged_metrics_restart_and_drain(tmp_path: Path) -> None:
    with serving(tmp_path, workers=2, TIERGATE_SHUTDOWN_DELAY_S="3") as served:
        assert "2 worker processes" in served.output
        sent = 0
        # fresh connections, several at once, until the kernel has handed some to each worker
        while len([n for n in _worker_requests(served).values() if n > 1]) < 2:
            clients = [served.client() for _ in range(6)]
            threads = [threading.Thread(target=_chat, args=(c,)) for c in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            sent += len(clients)
            assert sent <= 300, f"one worker took every connection: {_worker_requests(served)}"
            time.sleep(1.1)  # the workers write their request counts every second
        _wait_for(lambda: _requests_total(served) == sent, "counted every request", served)
        merged = served.metrics()
        ttft = merged["tiergate_time_to_first_token_seconds"]
        assert _value(ttft, "tiergate_time_to_first_token_seconds_count", tier="standard") == sent
        # 4 tokens and the finishing chunk: 4 gaps a request, fewer where the engine merged some
        itl = merged["tiergate_inter_token_latency_seconds"]
        gaps = _value(itl, "tiergate_inter_token_latency_seconds_count", tier="standard")
        assert sent <= gaps <= 4 * sent
        _wait_for(lambda: served.usage().get("ok") == sent, "wrote every usage record", served)

        # a worker that dies is replaced; the port never stops serving
        pids = set(_worker_requests(served))
        os.kill(int(next(iter(pids))), signal.SIGKILL)
        _wait_for(
            lambda: len(set(_worker_requests(served)) - pids) == 1, "restarted a worker", served
        )
        assert _chat(served.client()) == 4
        sent += 1

        # SIGTERM during a stream: readiness goes false, the stream completes, usage is flushed
        stream = served.client().chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "a long answer"}],
            max_tokens=400,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [next(stream)]
        served.proc.send_signal(signal.SIGTERM)
        # readiness goes false while connections are still accepted (the 3 s delay)
        _wait_for(lambda: _readiness(served) == (503, "draining"), "said draining", served)
        _wait_for(lambda: _refused(served), "stopped accepting connections", served)
        chunks.extend(stream)  # ... and the stream in flight still completes
        sent += 1
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 400
        assert served.proc.wait(timeout=60) == 0
        assert served.usage() == {"ok": sent}
        assert "stopping 2 worker(s)" in served.output


@pytest.mark.slow
def test_requests_left_at_the_drain_deadline_end_cleanly(tmp_path: Path) -> None:
    """One process (``--workers 1``): SIGTERM with a 1 s drain and a stream that needs longer."""
    with serving(tmp_path, workers=1, TIERGATE_SHUTDOWN_DRAIN_S="1") as served:
        assert "worker processes" not in served.output
        stream = served.client().chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "a very long answer"}],
            max_tokens=2000,
            stream=True,
        )
        next(stream)
        served.proc.send_signal(signal.SIGTERM)
        with pytest.raises(openai.APIError) as ended:
            for _ in stream:
                pass
        assert ended.value.code == SHUTTING_DOWN
        assert served.proc.wait(timeout=60) == 0
        assert served.usage() == {"cancelled": 1}


# ---- the benches' short forms ------------------------------------------------------------------


def _load_bench(name: str) -> Any:
    import importlib.util

    path = ROOT / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gateway_overhead_bench_runs_two_workers(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load_bench("gateway_overhead")
    argv = ["--rps", "6", "--duration", "2", "--warmup", "0.5", "--workers", "2", "--json"]
    assert bench.main(argv) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["errors"] == 0, row["error_kinds"]
    assert row["gateway_requests"] > 0
    # read from the supervisor's listener: the workers' histograms, merged
    assert row["gateway_overhead_p99_ms"] is not None and row["gateway_overhead_p99_ms"] > 0
    assert row["gateway_cpu_ms_per_request"] > 0  # the workers' CPU, not the idle supervisor's


@pytest.mark.slow
def test_worker_routing_bench_reports_the_split(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load_bench("worker_routing")
    argv = ["--workers", "1,2", "--rps", "4", "--duration", "2", "--max-tokens", "4", "--json"]
    assert bench.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["workers"] for r in rows] == [1, 2]
    for row in rows:
        assert row["errors"] == 0 and row["requests"] > 0
        served = sum(b["requests"] for b in row["backends"].values())
        assert served == row["requests"]  # every answered request has its usage record
        assert sum(b["share"] for b in row["backends"].values()) == pytest.approx(1, abs=0.01)


def _prefills_seen_from_others(served: Served) -> float:
    """The largest number of another worker's queued prefills any worker's router sees."""
    family = served.metrics().get("tiergate_backend_prefill_queue_others")
    return 0.0 if family is None else max((s.value for s in family.samples), default=0.0)


def _long_prefill(client: openai.OpenAI, prompt: str) -> None:
    """One request that spends most of its time in prefill (shedding it under the burst is
    fine: the test looks at the ones dispatched)."""
    with contextlib.suppress(openai.APIStatusError):
        client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": prompt}], max_tokens=2
        )


@pytest.mark.slow
def test_each_worker_routes_with_the_other_workers_queued_prefills(tmp_path: Path) -> None:
    """Bursts of long prompts over fresh connections (so both workers dispatch) until a
    worker's sampled gauge shows prefills the *other* worker queued, read from the shared
    table; then, all answered, nobody sees any."""
    prompt = "tell me about the weather " * 600
    with serving(tmp_path, workers=2) as served:
        assert _prefills_seen_from_others(served) == 0.0
        seen, bursts = 0.0, 0
        while seen == 0.0:
            bursts += 1
            assert bursts <= 15, f"no worker saw the other's prefills: {served.metrics()}"
            clients = [served.client() for _ in range(16)]
            threads = [threading.Thread(target=_long_prefill, args=(c, prompt)) for c in clients]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads) and seen == 0.0:
                seen = _prefills_seen_from_others(served)
                time.sleep(0.2)
            for t in threads:
                t.join()
        assert seen >= 1.0
        # every request answered: the workers' rows are empty again (gauges sampled each 1 s)
        _wait_for(lambda: _prefills_seen_from_others(served) == 0.0, "emptied the table", served)


# ---- state shared by the workers (no Redis) ---------------------------------------------------


def _both_workers_served(served: Served, before: dict[str, float]) -> bool:
    """Whether each live worker took a request since ``before`` (counts written every 1 s)."""
    now = _worker_requests(served)
    return len(now) == 2 and all(n > before.get(pid, 0.0) for pid, n in now.items())


def _workflow_call(served: Served, workflow: str, first: bool) -> httpx.Response:
    headers = {"authorization": f"Bearer {served.key}", "x-tiergate-workflow-id": workflow}
    if first:
        headers["x-tiergate-workflow-deadline-ms"] = "600000"
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with httpx.Client(timeout=30) as fresh:  # a new connection: any worker may take it
        return fresh.post(f"{served.base}/v1/chat/completions", json=body, headers=headers)


@pytest.mark.slow
def test_workflow_calls_and_small_limits_hold_across_workers(tmp_path: Path) -> None:
    """Without Redis: a workflow's later calls find it whichever worker takes them, and a limit
    below the number of workers (rpm 1, concurrency 1) is not multiplied by it."""
    with serving(tmp_path, workers=2, TIERGATE_ADMIN_KEY="admin-key-for-tests") as served:
        assert _workflow_call(served, "wf-1", first=True).status_code == 200
        before, rounds = _worker_requests(served), 0
        while not _both_workers_served(served, before):
            rounds += 1
            assert rounds <= 40, f"one worker took every connection: {_worker_requests(served)}"
            answers = [_workflow_call(served, "wf-1", first=False) for _ in range(4)]
            assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
            time.sleep(1.1)  # the workers write their request counts every second

        admin = {"authorization": "Bearer admin-key-for-tests"}
        patch = {"rpm_limit": 1, "max_concurrency": 1}
        httpx.patch(f"{served.base}/admin/v1/tenants/demo", json=patch, headers=admin, timeout=10)
        time.sleep(2.5)  # the auth cache's TTL (2 s): every worker sees the new limits
        held = served.client().chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "a long answer"}],
            max_tokens=4000,
            stream=True,
        )
        next(iter(held))  # admitted; the stream stays open, holding the one slot
        before, rounds = _worker_requests(served), 0
        while not _both_workers_served(served, before):
            rounds += 1
            assert rounds <= 40, f"one worker took every connection: {_worker_requests(served)}"
            for _ in range(4):
                body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]}
                with httpx.Client(timeout=30) as fresh:
                    answer = fresh.post(
                        f"{served.base}/v1/chat/completions",
                        json=body,
                        headers={"authorization": f"Bearer {served.key}"},
                    )
                assert answer.status_code == 429, answer.text
                message = answer.json()["error"]["message"]
                assert "limit of 1" in message and "1/2" not in message, message
            time.sleep(1.1)
        held.close()
