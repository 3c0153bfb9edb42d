"""Latency the gateway adds to streaming requests: direct to an emulated engine vs through it.

    python bench/gateway_overhead.py [--rps R] [--duration S] [--warmup S] [--json] [--pin]
        [--block S] [--max-tokens N] [--profile NAME] [--policy NAME] [--time-scale X]
        [--workers N] [--relay gateway|asgi|raw|granian|granian-asgi]
    python bench/gateway_overhead.py --find-max [--rates 25,50,...] [--max-added-p99-ms 5]

One emulated engine and one gateway in front of it (SQLite seeded with an unlimited tier) run in
child processes of their own; this process generates the load: one open-loop Poisson stream at
``--rps`` requests/s whose arrivals go, in alternating blocks of ``--block`` seconds, straight to
the engine or through the gateway (each pair of blocks in an order drawn by a coin). Both paths
thus carry the same load, at the same rate, to the same engine, interleaved second by second in
one run so that they share the machine's noise; the engine only ever sees ``--rps``. Every
request streams a short chat completion of exactly ``--max-tokens`` tokens.

At the client: TTFT is request start to the first event carrying content; inter-token latency
(ITL) is the gap between successive content events (the emulated engine sends one event per
token unless it falls behind). Added latency at a percentile is the gateway path's percentile
minus the direct path's; a 95% bootstrap interval for the added TTFT p99 shows how much of it
is sampling noise. Also reported: the gateway's own ``tiergate_gateway_overhead_seconds``
histogram over the measured window (a bucket bound; processing before the upstream request is
sent), and each process's CPU use (``gateway_cpu_ms_per_request`` is the gateway's CPU time over
the window per gateway request).

``--find-max`` steps through ``--rates`` until one is not sustained — more than 1% errors, added
TTFT p99 above ``--max-added-p99-ms``, or the client unable to keep its own schedule — and
reports the last sustained rate. ``--json`` prints one object for a single rate and a list of
objects (one per rate tried) with ``--find-max``; the required keys come first, in the order
``rps, requests, direct_ttft_p50_ms, direct_ttft_p99_ms, gateway_ttft_p50_ms,
gateway_ttft_p99_ms, added_ttft_p50_ms, added_ttft_p99_ms, errors``, then extras. ``requests``
and ``errors`` count both paths.

``--workers N`` (N > 1) runs the gateway as ``tiergate serve --workers N`` does: a supervisor
and N worker processes on one socket (:mod:`gateway.workers`), metrics merged; the gateway's CPU
is then that of the supervisor and all its workers.

The gateway (and the ASGI relay) is served with ``tiergate serve``'s uvicorn options
(:func:`gateway.app.http_limits.http_options`: the head-limited parser, no forwarded-header
rewriting unless proxies are trusted), so the bench measures the server that ships.

``--relay asgi|raw|...`` puts a bare relay (:mod:`relay_floor`, ``bench/relay_floor.py``) in the
gateway's place: no auth, admission, event parsing or accounting — an ASGI app under the same
uvicorn configuration and upstream client, or asyncio protocols without ASGI; ``granian`` and
``granian-asgi`` serve the same upstream client through granian's RSGI or ASGI interface (when
granian is installed; it is no dependency of the project). Everything else
(load, engine, CPU accounting) is unchanged, so ``gateway_cpu_ms_per_request`` then measures
the floor a Python relay costs on this machine; the ``relay`` key says which ran.

Setting ``TIERGATE_BENCH_PROFILE=<file>`` runs the gateway process under cProfile and dumps its
stats to ``<file>`` when it stops (read them with ``python -m pstats``). The profiler's clock is
the event loop thread's CPU time, not the wall clock: with engine, gateway and load generator
sharing the CPUs, a wall clock charges a socket write with the time the process then waited for
a CPU, and the idle loop with its sleep. That clock is a system call, though (no vDSO for a
thread's CPU time): cProfile then reports every Python call as about 2 µs (measured on the
2-core bench machine; a trivial call costs 0.07 µs), so a function's cumulative time grows with
the number of calls under it. Compare functions with their call counts in mind, and measure a
cut with the profiler off (``gateway_cpu_ms_per_request``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
import drills_common as common  # the drills' shared child-process helpers

_process_tree = common.process_tree
_process_cpu_seconds = common.process_cpu_seconds
_tree_cpu_seconds = common.tree_cpu_seconds
_free_port = common.free_port
_run = common.run_on_uvloop
_has_content = common.has_content


def _spawn(
    role_args: list[str], env: dict[str, str], log: IO[bytes]
) -> tuple[subprocess.Popen[bytes], int]:
    """Start this script in a server role; it prints ``PORT <n>`` once it accepts connections."""
    proc, port = common.spawn_ready(
        __file__, role_args, env, log, marker="PORT", timeout_s=STARTUP_TIMEOUT_S, stop=_stop
    )
    return proc, int(port)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Closing stdin asks a server child to stop (so it also stops if this process dies)."""
    common.stop_child(proc)


def _report_server_log(path: Path, tail: int = 12) -> None:
    common.report_server_log(path, tail)


MODEL = "bench-model"
SECRET = "gateway-overhead-bench-secret"
TENANT = "bench"
PROMPT = "Say hello to the benchmark."
DEFAULT_RATES = (25, 50, 100, 150, 200, 300, 400, 500, 600, 800)
TARGET_ADDED_P99_MS = 5.0
"""The issue's target: p99 added TTFT at most 5 ms (at 300 requests/s)."""
DEFAULT_TIME_SCALE = 4.0
"""The emulated A100 runs 4x faster than its profile: at 1x it saturates near 200 streamed
requests/s of this load (direct TTFT p99 173 ms at 200, 513 ms at 300, measured), and TTFT
would then measure the engine's queue rather than the gateway. At 4x one engine keeps a tight
TTFT at 300 requests/s (direct p50 / p99 5.1 / 9.3 ms, measured)."""
MAX_ERROR_RATE = 0.01
MAX_CLIENT_LAG_MS = 50.0
"""Client lag p99 above this: the load generator, not the system under test, is the limit."""
STARTUP_TIMEOUT_S = 30.0
GRANIAN_RELAYS = ("granian", "granian-asgi")
"""Relays under granian (an optional install): its RSGI interface, or the ASGI relay."""
MAX_IDLE_S = 3.0
"""Idle keep-alive connections older than this are not reused (uvicorn closes them at 5 s)."""
PROFILE_ENV = "TIERGATE_BENCH_PROFILE"
REQUIRED_KEYS = (
    "rps",
    "requests",
    "direct_ttft_p50_ms",
    "direct_ttft_p99_ms",
    "gateway_ttft_p50_ms",
    "gateway_ttft_p99_ms",
    "added_ttft_p50_ms",
    "added_ttft_p99_ms",
    "errors",
)


@dataclass(frozen=True)
class Setup:
    """What the servers run and how the load looks."""

    profile: str = "a100-qwen2-7b"
    policy: str = "vllm-v1"
    """FCFS: the engine ignores the priority and SLO the gateway attaches, so both paths are
    scheduled alike."""
    time_scale: float = DEFAULT_TIME_SCALE
    max_tokens: int = 16
    warmup_s: float = 3.0
    block_s: float = 1.0
    """Length of the alternating blocks in which arrivals go straight to the engine or through
    the gateway (each pair of blocks in an order drawn by a coin)."""
    seed: int = 0
    pin: bool = False
    workers: int = 1
    """Gateway worker processes (``tiergate serve --workers``)."""
    relay: str = "gateway"
    """What serves the gateway path: the gateway, or a bare relay (``asgi``, ``raw``,
    ``granian``, ``granian-asgi``)."""


# ---- servers (child processes) ------------------------------------------------------------


@dataclass
class Servers:
    engine_url: str
    gateway_url: str
    api_key: str
    metrics_url: str
    """The gateway's operator listener (``/metrics`` is not served on the API port)."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    """The engine's, then the gateway's."""

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time used so far by each process (servers from ``/proc``; NaN where unreadable),
        and the gateway's part of it spent in the kernel (``gateway_system``: socket writes
        and reads, wake-ups)."""
        gateway = _process_tree(self.processes[1].pid)
        return {
            "engine": _process_cpu_seconds(self.processes[0].pid),
            "gateway": sum(_process_cpu_seconds(p) for p in gateway),
            "gateway_system": sum(_process_cpu_seconds(p, user=False) for p in gateway),
            "client": time.process_time(),
        }


def _seed_database(url: str) -> str:
    """An unlimited tier (best effort allowed, so nothing is shed), a tenant and its key."""
    from gateway.db import crud
    from gateway.db.models import Base
    from gateway.db.session import make_engine, make_session_factory

    engine = make_engine(url)
    try:
        Base.metadata.create_all(engine)
        with make_session_factory(engine).begin() as session:
            crud.create_tier(
                session,
                actor="bench",
                name="bench",
                weight=1.0,
                ttft_ms=60_000.0,
                tpot_ms=10_000.0,
                best_effort_allowed=True,
            )
            crud.create_tenant(session, actor="bench", name=TENANT, tier="bench")
            return crud.create_key(session, actor="bench", tenant=TENANT, secret=SECRET).plaintext
    finally:
        engine.dispose()


def _pin(pid: int, cpus: set[int]) -> None:
    with contextlib.suppress(OSError):
        os.sched_setaffinity(pid, cpus)


@contextlib.contextmanager
def running_servers(setup: Setup) -> Iterator[Servers]:
    """Engine and gateway in child processes, on free ports, against a temporary database."""
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-") as tmp:
        db_url = f"sqlite:///{Path(tmp) / 'tiergate.db'}"
        key = _seed_database(db_url)
        env = dict(os.environ)
        env.update(TIERGATE_DATABASE_URL=db_url, TIERGATE_SECRET=SECRET, TIERGATE_DATA_DIR=tmp)
        env.pop("TIERGATE_REDIS_URL", None)  # in-process limits: no Redis round trip
        cpus = sorted(os.sched_getaffinity(0))
        procs: list[subprocess.Popen[bytes]] = []
        log_path = Path(tmp) / "servers.log"
        log = log_path.open("wb")
        try:
            engine, engine_port = _spawn(
                [
                    "--role",
                    "engine",
                    "--profile",
                    setup.profile,
                    "--policy",
                    setup.policy,
                    "--time-scale",
                    str(setup.time_scale),
                    "--seed",
                    str(setup.seed),
                ],
                env,
                log,
            )
            procs.append(engine)
            engine_url = f"http://127.0.0.1:{engine_port}"
            metrics_port = _free_port()
            gateway, gateway_port = _spawn(
                [
                    "--role",
                    "gateway",
                    "--engine-url",
                    engine_url,
                    "--profile",
                    setup.profile,
                    "--workers",
                    str(setup.workers),
                    "--relay",
                    setup.relay,
                ],
                {**env, "TIERGATE_METRICS_ADDR": f"127.0.0.1:{metrics_port}"},
                log,
            )
            procs.append(gateway)
            if setup.pin and len(cpus) >= 2:  # the gateway alone on the last CPU
                _pin(os.getpid(), set(cpus[:-1]))
                _pin(engine.pid, set(cpus[:-1]))
                for pid in _process_tree(gateway.pid):  # with its workers
                    _pin(pid, {cpus[-1]})
            bare = setup.relay != "gateway"  # a relay: no metrics, nothing to get ready
            servers = Servers(
                engine_url,
                f"http://127.0.0.1:{gateway_port}",
                key,
                "" if bare else f"http://127.0.0.1:{metrics_port}/metrics",
                procs,
            )
            if not bare:
                _wait_ready(servers.gateway_url)
            yield servers
        finally:
            for proc in reversed(procs):
                _stop(proc)
            log.close()
            _report_server_log(log_path)
            if setup.pin:
                _pin(os.getpid(), set(cpus))


def _wait_ready(gateway_url: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{gateway_url}/health/readiness", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("the gateway never saw its engine healthy")


def _serve_role(args: argparse.Namespace) -> int:
    """Child process: serve the engine or the gateway until stdin closes."""
    import socket

    import uvicorn

    app: Any  # the engine's or the gateway's FastAPI app, or the bare ASGI relay
    served: dict[str, Any] = {}  # the gateway's uvicorn options (the relay's: the same)
    if args.role == "engine":
        from engine_emulated.serve import EngineSpec

        app = EngineSpec(
            args.profile, args.policy, MODEL, seed=args.seed, time_scale=args.time_scale
        ).create_app()
    elif args.relay == "raw":
        _profiled(args, lambda: _serve_raw_relay(args))
        return 0
    elif args.relay in GRANIAN_RELAYS:
        _profiled(args, lambda: _serve_granian_relay(args))
        return 0
    elif args.relay == "asgi":
        from relay_floor import AsgiRelay

        from gateway.app.http_limits import http_options
        from gateway.settings import get_settings

        app = AsgiRelay(args.engine_url)
        served = http_options(get_settings())
    elif args.workers > 1:
        _run(_serve_gateway_workers(args))
        return 0
    else:
        from gateway.app import BackendSpec, create_app
        from gateway.app.http_limits import http_options

        backend = BackendSpec("bench-engine", args.engine_url, MODEL, args.profile, kind="emulated")
        app = create_app(backends=[backend])
        served = http_options(app.state.settings)  # as `tiergate serve` serves it
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
            backlog=4096,
            **served,
        )
    )

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stdin = sys.stdin.buffer

        def on_stdin() -> None:
            if not os.read(stdin.fileno(), 4096):
                loop.remove_reader(stdin.fileno())
                server.should_exit = True

        loop.add_reader(stdin.fileno(), on_stdin)
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        print(f"PORT {sock.getsockname()[1]}", flush=True)
        await task

    _profiled(args, serve)
    return 0


def _profiled(args: argparse.Namespace, serve: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``serve()`` on uvloop; the gateway's role under cProfile if :data:`PROFILE_ENV` says."""
    profile_path = os.environ.get(PROFILE_ENV) if args.role == "gateway" else None
    if profile_path:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        try:
            _run(serve())
        finally:
            profiler.disable()
            profiler.dump_stats(profile_path)
    else:
        _run(serve())


async def _serve_raw_relay(args: argparse.Namespace) -> None:
    """Child process: the ``raw`` relay (:class:`relay_floor.RawRelay`) until stdin closes."""
    import socket

    from relay_floor import RawRelay

    relay = RawRelay(args.engine_url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = await relay.start(sock, backlog=4096)
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()
    stdin = sys.stdin.buffer.fileno()

    def on_stdin() -> None:
        if not os.read(stdin, 4096):
            loop.remove_reader(stdin)
            if not stopped.done():
                stopped.set_result(None)

    loop.add_reader(stdin, on_stdin)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await stopped
    server.close()
    relay.close()


async def _serve_granian_relay(args: argparse.Namespace) -> None:
    """Child process: a relay under granian's embedded server (RSGI for ``granian``, the ASGI
    relay for ``granian-asgi``) on this process's uvloop, until stdin closes."""
    from relay_floor import AsgiRelay, RsgiRelay, granian_server

    relay = RsgiRelay(args.engine_url) if args.relay == "granian" else AsgiRelay(args.engine_url)
    port = _free_port()  # granian binds the socket itself
    server = granian_server(relay, port, backlog=4096)
    task = asyncio.ensure_future(server.serve())
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:  # listening once a connection is accepted
        if task.done():
            task.result()
            raise RuntimeError("granian stopped before it served")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
            continue
        writer.close()
        break
    stdin = sys.stdin.buffer.fileno()

    def on_stdin() -> None:
        if not os.read(stdin, 4096):
            loop.remove_reader(stdin)
            server.stop()

    loop.add_reader(stdin, on_stdin)
    print(f"PORT {port}", flush=True)
    await task
    if isinstance(relay, RsgiRelay):
        await relay.aclose()


async def _serve_gateway_workers(args: argparse.Namespace) -> None:
    """Child process: the gateway as ``tiergate serve --workers N`` runs it, until stdin closes."""
    import socket

    from gateway.app import BackendSpec
    from gateway.settings import get_settings
    from gateway.workers import BACKLOG, Supervisor, WorkerSpec, multiprocess_metrics

    backend = BackendSpec("bench-engine", args.engine_url, MODEL, args.profile, kind="emulated")
    settings = get_settings()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(BACKLOG)
    port = sock.getsockname()[1]
    async with multiprocess_metrics(settings.metrics_addr) as path:
        spec = WorkerSpec(
            settings.model_copy(update={"metrics_addr": None, "workers": args.workers}),
            [backend],
            "warning",
        )
        supervisor = Supervisor(spec, sock, args.workers, metrics_path=path)
        supervisor.on_ready = lambda _: print(f"PORT {port}", flush=True)
        loop = asyncio.get_running_loop()
        stdin = sys.stdin.buffer.fileno()

        def on_stdin() -> None:
            if not os.read(stdin, 4096):
                loop.remove_reader(stdin)
                supervisor.stop()

        loop.add_reader(stdin, on_stdin)
        await supervisor.run()


# ---- load ---------------------------------------------------------------------------------


@dataclass
class Sample:
    """One request as the client saw it (times in seconds, ``time.perf_counter``)."""

    via_gateway: bool
    scheduled: float
    start: float = 0.0
    first: float | None = None
    gaps: list[float] = field(default_factory=list)
    error: str | None = None


class SseClient:
    """A minimal keep-alive HTTP/1.1 client for streamed POSTs to one host.

    Not httpx: httpcore's pool rescans every pooled connection for every idle one on each
    request start and end (O(n²); encode/httpcore#1035), which at a few hundred streams in
    flight made the load generator, not the servers, the bottleneck. This client does only what
    the benchmark needs — fixed headers, ``Content-Length`` bodies, chunked or sized responses —
    so the client's own CPU time stays small next to the servers' on a shared machine.
    """

    def __init__(self, url: str, path: str, headers: dict[str, str], body: bytes) -> None:
        host, port = httpx.URL(url).host, httpx.URL(url).port
        assert port is not None
        self.host, self.port = host, port
        lines = [
            f"POST {path} HTTP/1.1",
            f"host: {host}:{port}",
            f"content-length: {len(body)}",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        """Kept-alive connections, most recently used last, with the time each became idle."""
        self.opened: list[asyncio.StreamWriter] = []

    async def stream(self, sample: Sample, timeout_s: float = 60.0) -> None:
        """Send the request; record the first content event's time and the gaps after it."""
        sample.start = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                await self._exchange(sample)
        except (
            OSError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
            TimeoutError,
        ) as exc:
            sample.error = type(exc).__name__
        if sample.first is None and sample.error is None:
            sample.error = "no content"

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """An idle connection the server has not timed out yet, else a new one; and whether it
        was reused."""
        if self.idle and time.perf_counter() - self.idle[-1][2] > MAX_IDLE_S:
            for _, stale, _ in self.idle:  # the freshest is too old: so are all the others
                stale.close()
            self.idle.clear()
        if self.idle:
            reader, writer, _ = self.idle.pop()
            return reader, writer, True
        reader, writer = await asyncio.open_connection(self.host, self.port)
        self.opened.append(writer)
        return reader, writer, False

    async def _exchange(self, sample: Sample) -> None:
        reader, writer, reused = await self._connection()
        writer.write(self.request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError):
            if not reused:
                raise
            writer.close()  # closed by the server as we reused it: once more on a new one
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self.opened.append(writer)
            writer.write(self.request)
            head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        headers = head.lower()
        if status != 200:
            sample.error = f"HTTP {status}"
            writer.close()
            return
        if b"transfer-encoding: chunked" not in headers:
            raise ValueError("expected a chunked event stream")
        buffer, last = b"", 0.0
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";", 1)[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            now = time.perf_counter()
            buffer += data[:-2]
            while (end := buffer.find(b"\n\n")) >= 0:
                event, buffer = buffer[:end], buffer[end + 2 :]
                if not _has_content(event):
                    if b'"error"' in event:
                        sample.error = "stream error event"
                    continue
                if sample.first is None:
                    sample.first = now
                else:
                    sample.gaps.append(now - last)
                last = now
        if b"connection: close" in headers:
            writer.close()
        else:
            self.idle.append((reader, writer, time.perf_counter()))

    async def aclose(self) -> None:
        for writer in self.opened:
            writer.close()
        for writer in self.opened:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


@dataclass
class LoadRun:
    """What one rate's load produced, over its measured window (warm-up excluded)."""

    samples: list[Sample]
    overhead_before: dict[str, float]
    overhead_after: dict[str, float]
    cpu_s: dict[str, float]
    """CPU seconds per process from the end of warm-up until the last stream ended."""
    window_s: float


async def generate_load(
    servers: Servers, rps: float, duration_s: float, setup: Setup, rng: np.random.Generator
) -> LoadRun:
    """Open-loop Poisson arrivals for ``warmup + duration``, then wait for every stream."""
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": setup.max_tokens,
            "stream": True,
        }
    ).encode()
    path = "/v1/chat/completions"
    json_type = {"content-type": "application/json"}
    direct = SseClient(servers.engine_url, path, json_type, body)
    gateway = SseClient(
        servers.gateway_url,
        path,
        {**json_type, "authorization": f"Bearer {servers.api_key}"},
        body,
    )
    total = setup.warmup_s + duration_s
    pairs = int(total / (2 * setup.block_s)) + 1
    gateway_first = rng.random(pairs) < 0.5  # per pair of blocks: which path goes first
    samples: list[Sample] = []
    tasks: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(timeout=10.0) as scraper:
        scrape: asyncio.Task[dict[str, float]] | None = None
        cpu_start: dict[str, float] = {}
        window_start = 0.0
        t0 = time.perf_counter()
        offset = float(rng.exponential(1.0 / rps))
        try:
            while offset < total:
                delay = t0 + offset - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if scrape is None and offset >= setup.warmup_s:
                    scrape = asyncio.ensure_future(
                        _overhead_histogram(scraper, servers.metrics_url)
                    )
                    cpu_start, window_start = servers.cpu_seconds(), time.perf_counter()
                block = int(offset / setup.block_s)
                via_gateway = bool(gateway_first[block // 2]) == (block % 2 == 0)
                sample = Sample(via_gateway, t0 + offset)
                if offset >= setup.warmup_s:
                    samples.append(sample)
                task = asyncio.ensure_future((gateway if via_gateway else direct).stream(sample))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                offset += float(rng.exponential(1.0 / rps))
            if tasks:
                await asyncio.wait(set(tasks))
        finally:
            await direct.aclose()
            await gateway.aclose()
        cpu_end, window_end = servers.cpu_seconds(), time.perf_counter()
        before = await scrape if scrape is not None else {}
        after = await _overhead_histogram(scraper, servers.metrics_url)
    cpu = {k: cpu_end[k] - cpu_start.get(k, math.nan) for k in cpu_end}
    return LoadRun(samples, before, after, cpu, window_end - window_start)


async def _overhead_histogram(client: httpx.AsyncClient, metrics_url: str) -> dict[str, float]:
    """Cumulative bucket counts of ``tiergate_gateway_overhead_seconds`` by upper bound."""
    from prometheus_client.parser import text_string_to_metric_families

    if not metrics_url:  # a bare relay has no metrics
        return {}
    try:
        text = (await client.get(metrics_url)).text
    except httpx.HTTPError:
        return {}
    buckets: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "tiergate_gateway_overhead_seconds":
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets[s.labels["le"]] = s.value
    return buckets


# ---- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    rps: float
    requests: int
    errors: int
    direct_ttft_ms: np.ndarray
    gateway_ttft_ms: np.ndarray
    direct_itl_ms: np.ndarray
    gateway_itl_ms: np.ndarray
    achieved_rps: float
    client_lag_p99_ms: float
    added_ttft_p99_ci_ms: tuple[float, float]
    gateway_overhead_p99_ms: float | None
    error_kinds: dict[str, int]
    cpu_util: dict[str, float]
    """Cores' worth of CPU each process used over the measured window."""
    gateway_cpu_ms_per_request: float
    gateway_cpu_system_ms_per_request: float
    """The part of it spent in the kernel."""
    relay: str = "gateway"
    """What served the gateway path (``--relay``)."""

    def sustained(self, max_added_p99_ms: float) -> bool:
        return (
            self.errors <= MAX_ERROR_RATE * max(1, self.requests)
            and self.client_lag_p99_ms <= MAX_CLIENT_LAG_MS
            and math.isfinite(self.added_ttft_p99_ms)
            and self.added_ttft_p99_ms <= max_added_p99_ms
        )

    @property
    def added_ttft_p99_ms(self) -> float:
        return _pct(self.gateway_ttft_ms, 99) - _pct(self.direct_ttft_ms, 99)

    def as_dict(self, max_added_p99_ms: float) -> dict[str, Any]:
        d_ttft, g_ttft = self.direct_ttft_ms, self.gateway_ttft_ms
        d_itl, g_itl = self.direct_itl_ms, self.gateway_itl_ms
        out: dict[str, Any] = {
            "rps": self.rps,
            "requests": self.requests,
            "direct_ttft_p50_ms": _pct(d_ttft, 50),
            "direct_ttft_p99_ms": _pct(d_ttft, 99),
            "gateway_ttft_p50_ms": _pct(g_ttft, 50),
            "gateway_ttft_p99_ms": _pct(g_ttft, 99),
            "added_ttft_p50_ms": _pct(g_ttft, 50) - _pct(d_ttft, 50),
            "added_ttft_p99_ms": self.added_ttft_p99_ms,
            "errors": self.errors,
            "relay": self.relay,
            "added_ttft_p99_ci95_ms": list(self.added_ttft_p99_ci_ms),
            "direct_itl_p50_ms": _pct(d_itl, 50),
            "direct_itl_p99_ms": _pct(d_itl, 99),
            "gateway_itl_p50_ms": _pct(g_itl, 50),
            "gateway_itl_p99_ms": _pct(g_itl, 99),
            "added_itl_p50_ms": _pct(g_itl, 50) - _pct(d_itl, 50),
            "added_itl_p99_ms": _pct(g_itl, 99) - _pct(d_itl, 99),
            "direct_requests": int(d_ttft.size),
            "gateway_requests": int(g_ttft.size),
            "achieved_rps": self.achieved_rps,
            "client_lag_p99_ms": self.client_lag_p99_ms,
            "gateway_overhead_p99_ms": self.gateway_overhead_p99_ms,
            "gateway_cpu_ms_per_request": self.gateway_cpu_ms_per_request,
            "gateway_cpu_system_ms_per_request": self.gateway_cpu_system_ms_per_request,
            "cpu_util": {k: _round(v) for k, v in self.cpu_util.items()},
            "error_kinds": self.error_kinds,
            "sustained": self.sustained(max_added_p99_ms),
        }
        return {k: _round(v) for k, v in out.items()}


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    if isinstance(value, list):
        return [_round(v) for v in value]
    return value


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def summarize(
    run: LoadRun, rps: float, duration_s: float, rng: np.random.Generator, relay: str = "gateway"
) -> Result:
    samples = run.samples
    ok = [s for s in samples if s.error is None and s.first is not None]
    kinds: dict[str, int] = {}
    for s in samples:
        if s.error is not None:
            kind = f"{'gateway' if s.via_gateway else 'direct'}: {s.error}"
            kinds[kind] = kinds.get(kind, 0) + 1

    def ttft(gw: bool) -> np.ndarray:
        return np.array([(s.first - s.start) * 1e3 for s in ok if s.via_gateway is gw and s.first])

    def itl(gw: bool) -> np.ndarray:
        return np.array([g * 1e3 for s in ok if s.via_gateway is gw for g in s.gaps])

    direct, gateway = ttft(False), ttft(True)
    lag = np.array([(s.start - s.scheduled) * 1e3 for s in samples])
    span = (samples[-1].scheduled - samples[0].scheduled) if len(samples) > 1 else duration_s
    via_gateway = sum(s.via_gateway for s in samples)  # both paths run at the same rate
    window = max(run.window_s, 1e-9)
    return Result(
        rps=rps,
        requests=len(samples),
        errors=len(samples) - len(ok),
        direct_ttft_ms=direct,
        gateway_ttft_ms=gateway,
        direct_itl_ms=itl(False),
        gateway_itl_ms=itl(True),
        achieved_rps=len(samples) / max(span, 1e-9),
        client_lag_p99_ms=_pct(lag, 99),
        added_ttft_p99_ci_ms=_bootstrap_added_p99(direct, gateway, rng),
        gateway_overhead_p99_ms=_histogram_p99_ms(run.overhead_before, run.overhead_after),
        error_kinds=kinds,
        cpu_util={k: v / window for k, v in run.cpu_s.items()},
        gateway_cpu_ms_per_request=run.cpu_s["gateway"] * 1e3 / max(1, via_gateway),
        gateway_cpu_system_ms_per_request=run.cpu_s["gateway_system"] * 1e3 / max(1, via_gateway),
        relay=relay,
    )


def _bootstrap_added_p99(
    direct: np.ndarray, gateway: np.ndarray, rng: np.random.Generator, rounds: int = 500
) -> tuple[float, float]:
    """95% percentile-bootstrap interval of p99(gateway) - p99(direct)."""
    if direct.size < 2 or gateway.size < 2:
        return (math.nan, math.nan)
    d = np.percentile(rng.choice(direct, (rounds, direct.size)), 99, axis=1)
    g = np.percentile(rng.choice(gateway, (rounds, gateway.size)), 99, axis=1)
    lo, hi = np.percentile(g - d, [2.5, 97.5])
    return (float(lo), float(hi))


def _histogram_p99_ms(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Upper bound of the bucket holding the window's 99th percentile (None if unavailable)."""
    if not after:
        return None
    bounds = sorted((float(le), after[le] - before.get(le, 0.0)) for le in after)
    total = bounds[-1][1]
    if total <= 0:
        return None
    for bound, count in bounds:
        if count >= 0.99 * total:
            return bound * 1e3 if math.isfinite(bound) else math.inf
    return None


def measure(servers: Servers, rps: float, duration_s: float, setup: Setup) -> Result:
    rng = np.random.default_rng([setup.seed, int(rps * 1000)])
    run = _run(generate_load(servers, rps, duration_s, setup, rng))
    return summarize(run, rps, duration_s, rng, setup.relay)


# ---- command line -------------------------------------------------------------------------


def _print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(v: Any) -> str:
        return "—" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)

    table = Table(title=title)
    columns = (
        ("rps", "rps"),
        ("achieved", "achieved_rps"),
        ("requests", "requests"),
        ("errors", "errors"),
        ("direct TTFT p50/p99", ("direct_ttft_p50_ms", "direct_ttft_p99_ms")),
        ("gateway TTFT p50/p99", ("gateway_ttft_p50_ms", "gateway_ttft_p99_ms")),
        ("added TTFT p50/p99", ("added_ttft_p50_ms", "added_ttft_p99_ms")),
        ("added p99 95% CI", "added_ttft_p99_ci95_ms"),
        ("added ITL p50/p99", ("added_itl_p50_ms", "added_itl_p99_ms")),
        ("overhead hist p99 ≤", "gateway_overhead_p99_ms"),
        ("gateway CPU ms/req", "gateway_cpu_ms_per_request"),
        ("client lag p99", "client_lag_p99_ms"),
        ("sustained", "sustained"),
    )
    for name, _ in columns:
        table.add_column(name, justify="right")
    for row in rows:
        cells = []
        for _, key in columns:
            if isinstance(key, tuple):
                cells.append(" / ".join(fmt(row[k]) for k in key))
            elif isinstance(row[key], list):
                cells.append("[" + ", ".join(fmt(v) for v in row[key]) + "]")
            else:
                cells.append(fmt(row[key]))
        table.add_row(*cells)
    console = Console(width=max(Console().width, 180))
    console.print(table)
    console.print("latencies in ms; added = gateway percentile − direct percentile")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rps", type=float, default=300.0, help="request rate through the gateway (per second)"
    )
    parser.add_argument(
        "--block", type=float, default=1.0, help="seconds per block of one path (they alternate)"
    )
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds first")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--profile", default="a100-qwen2-7b", help="emulated engine's profile")
    parser.add_argument("--policy", default="vllm-v1", help="emulated engine's policy")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULT_TIME_SCALE,
        help="emulated engine's speed relative to its profile",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workers", type=int, default=1, help="gateway worker processes (tiergate serve --workers)"
    )
    parser.add_argument(
        "--relay",
        choices=("gateway", "asgi", "raw", *GRANIAN_RELAYS),
        default="gateway",
        help="what serves the gateway path: the gateway, or a bare relay (bench/relay_floor.py)",
    )
    parser.add_argument(
        "--pin", action="store_true", help="the gateway alone on the last CPU, the rest elsewhere"
    )
    parser.add_argument("--find-max", action="store_true", help="step up --rates until one fails")
    parser.add_argument("--rates", help=f"comma-separated (default {DEFAULT_RATES})")
    parser.add_argument(
        "--max-added-p99-ms",
        type=float,
        default=TARGET_ADDED_P99_MS,
        help="--find-max: a rate whose added TTFT p99 exceeds this fails",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--role", choices=("engine", "gateway"), help=argparse.SUPPRESS)
    parser.add_argument("--engine-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is not None:
        return _serve_role(args)
    if args.relay != "gateway" and args.workers > 1:
        parser.error("--relay runs one process: no --workers")
    if args.relay in GRANIAN_RELAYS:
        from relay_floor import GRANIAN_MISSING

        if GRANIAN_MISSING is not None:
            parser.exit(2, f"--relay {args.relay}: {GRANIAN_MISSING}\n")

    setup = Setup(
        profile=args.profile,
        policy=args.policy,
        time_scale=args.time_scale,
        max_tokens=args.max_tokens,
        block_s=args.block,
        warmup_s=args.warmup,
        seed=args.seed,
        pin=args.pin,
        workers=args.workers,
        relay=args.relay,
    )
    if args.find_max:
        rates = [float(r) for r in args.rates.split(",")] if args.rates else list(DEFAULT_RATES)
    else:
        rates = [args.rps]
    rows: list[dict[str, Any]] = []
    with running_servers(setup) as servers:
        for rate in rates:
            result = measure(servers, rate, args.duration, setup)
            rows.append(result.as_dict(args.max_added_p99_ms))
            if not args.json:
                print(
                    f"{rate:g} rps: added TTFT p99 {rows[-1]['added_ttft_p99_ms']} ms, "
                    f"errors {result.errors}/{result.requests}",
                    file=sys.stderr,
                )
            if args.find_max and not rows[-1]["sustained"]:
                break
            time.sleep(1.0)  # let the engine drain before the next rate
    if args.json:
        json.dump(rows if args.find_max else rows[0], sys.stdout, indent=2)
        print()
        return 0
    _print_table(
        rows,
        f"Gateway overhead ({args.relay}, {args.profile}, {args.policy}, "
        f"max_tokens {args.max_tokens}, {args.duration:g} s per rate)",
    )
    if args.find_max:
        sustained = [r["rps"] for r in rows if r["sustained"]]
        print(f"highest sustained rate: {max(sustained) if sustained else 'none'} requests/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
