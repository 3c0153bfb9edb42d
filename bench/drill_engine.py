"""Engine-fault drill: engines killed, frozen, hung, stalled and garbling under load.

    python bench/drill_engine.py [--engines 3] [--rps 30] [--fault-s 15] [--settle-s 6]
        [--faults kill,freeze,hang,stall,garbage,garbage-mid] [--baseline-s 5]
        [--max-tokens 64] [--unary-share 0.2] [--profile a100-qwen2-7b] [--time-scale 1]
        [--seed 0] [--json]

``--engines`` emulated engines, each in a child process of its own (so that it can be killed
and stopped) with fault injection on (:mod:`engine_emulated.faults`), and one gateway (a
child process; SQLite seeded with the default tiers, a premium and a standard tenant, the
gateway's default timeouts and breaker) run as in ``bench/gateway_overhead.py``; this process
sends open-loop Poisson load at ``--rps``: chat requests of ``--max-tokens`` tokens, premium and
standard alternately, ``--unary-share`` of them not streamed. After ``--baseline-s`` seconds of
calm, the faults of ``--faults`` hit engine-0 in turn, each for ``--fault-s`` seconds and then
``--settle-s`` seconds of recovery:

* ``kill``: ``SIGKILL``, then a new engine process on the same port;
* ``freeze``: ``SIGSTOP``, then ``SIGCONT``;
* ``hang``: the engine core stops stepping (``/health`` still answers), then resumes;
* ``stall``: accepts requests, never streams (running streams stop too), then streams again;
* ``garbage``: every stream sends text that is not JSON instead of its first token;
* ``garbage-mid``: every stream sends that after 2 good tokens.

Per fault (the requests sent from the fault until the next one): requests, ok, errors before
the first token (a non-200 answer), errors after it (an error event, or a stream cut short),
hung requests (no answer in 60 s), failovers and timeouts (the gateway's counters), the time
from the fault to engine-0's breaker opening and from its recovery to the breaker closing
(``/health/readiness`` polled every 40 ms), and requests that missed their TTFT objective (at
the client; an error counts as a miss) against the baseline's share. At the end, with the load
stopped: dispatch slots in flight, requests awaiting a first token and engine load (all 0).
``--json`` prints one object with ``baseline``, ``faults`` (a list) and ``after``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
import drills_common as common  # the drills' shared child-process helpers

_free_port = common.free_port
_run = common.run_on_uvloop
_has_content = common.has_content
_code = common.error_code


def _spawn(
    args: list[str], env: dict[str, str], log: IO[bytes]
) -> tuple[subprocess.Popen[bytes], str]:
    """This script in a server role; it prints ``READY <value>`` once it accepts connections."""
    return common.spawn_ready(
        __file__, args, env, log, marker="READY", timeout_s=STARTUP_TIMEOUT_S, stop=_stop
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    common.stop_child(proc, timeout_s=15.0, resume=True)


def _report_server_log(path: Path, tail: int = 8) -> None:
    common.report_server_log(path, tail)


MODEL = "drill-model"
SECRET = "drill-engine-secret"
TIERS = ("premium", "standard")
FAULTS = ("kill", "freeze", "hang", "stall", "garbage", "garbage-mid")
TARGET = "engine-0"
STARTUP_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 60.0
POLL_S = 0.04
PROMPT = "Tell me, briefly, what a circuit breaker is for."


@dataclass(frozen=True)
class Setup:
    engines: int = 3
    profile: str = "a100-qwen2-7b"
    policy: str = "vllm-v1-priority"
    time_scale: float = 1.0
    rps: float = 30.0
    max_tokens: int = 64
    unary_share: float = 0.2
    baseline_s: float = 5.0
    fault_s: float = 15.0
    settle_s: float = 6.0
    faults: tuple[str, ...] = FAULTS
    seed: int = 0


# ---- servers (child processes) ------------------------------------------------------------


@dataclass
class Servers:
    setup: Setup
    root: Path
    env: dict[str, str]
    log: IO[bytes]
    gateway_url: str = ""
    metrics_url: str = ""
    keys: dict[str, str] = field(default_factory=dict)
    engine_ports: list[int] = field(default_factory=list)
    engines: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gateway: subprocess.Popen[bytes] | None = None

    def engine_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.engine_ports[index]}"

    def start_engine(self, index: int) -> None:
        s = self.setup
        proc, _ = _spawn(
            [
                "--role",
                "engine",
                "--port",
                str(self.engine_ports[index]),
                "--profile",
                s.profile,
                "--policy",
                s.policy,
                "--time-scale",
                str(s.time_scale),
                "--seed",
                str(s.seed + index),
            ],
            self.env,
            self.log,
        )
        self.engines[index] = proc


def _seed(url: str) -> dict[str, str]:
    """The default tiers and a tenant (with a key) on each drilled tier."""
    from gateway.db import crud
    from gateway.db.models import Base
    from gateway.db.seed import seed_defaults
    from gateway.db.session import make_engine, make_session_factory

    engine = make_engine(url)
    keys: dict[str, str] = {}
    try:
        Base.metadata.create_all(engine)
        with make_session_factory(engine).begin() as session:
            seed_defaults(session)
            for tier in TIERS:
                crud.create_tenant(session, actor="drill", name=f"drill-{tier}", tier=tier)
                keys[tier] = crud.create_key(
                    session, actor="drill", tenant=f"drill-{tier}", secret=SECRET
                ).plaintext
    finally:
        engine.dispose()
    return keys


@contextlib.contextmanager
def running_servers(setup: Setup, root: Path) -> Iterator[Servers]:
    db_url = f"sqlite:///{root / 'tiergate.db'}"
    env = dict(os.environ)
    env.update(TIERGATE_DATABASE_URL=db_url, TIERGATE_SECRET=SECRET, TIERGATE_DATA_DIR=str(root))
    env.pop("TIERGATE_REDIS_URL", None)
    log_path = root / "servers.log"
    with log_path.open("wb") as log:
        servers = Servers(setup, root, env, log, keys=_seed(db_url))
        servers.engine_ports = [_free_port() for _ in range(setup.engines)]
        servers.engines = [None] * setup.engines  # type: ignore[list-item]
        try:
            for index in range(setup.engines):
                servers.start_engine(index)
            metrics_port = _free_port()
            urls = ",".join(servers.engine_url(i) for i in range(setup.engines))
            gateway, port = _spawn(
                ["--role", "gateway", "--engine-urls", urls, "--profile", setup.profile],
                {**env, "TIERGATE_METRICS_ADDR": f"127.0.0.1:{metrics_port}"},
                log,
            )
            servers.gateway = gateway
            servers.gateway_url = f"http://127.0.0.1:{port}"
            servers.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            _wait_ready(servers.gateway_url, setup.engines)
            yield servers
        finally:
            for proc in [servers.gateway, *servers.engines]:
                if proc is not None:
                    _stop(proc)
    _report_server_log(log_path)


def _wait_ready(url: str, engines: int) -> None:
    import httpx

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            body = httpx.get(f"{url}/health/readiness", timeout=2).json()
            if len(body.get("healthy_backends", ())) == engines:
                return
        time.sleep(0.1)
    raise RuntimeError("the gateway never saw its engines healthy")


def _serve_role(args: argparse.Namespace) -> int:
    """Child process: serve one engine or the gateway until stdin closes."""

    async def engine() -> None:
        from engine_emulated.serve import EngineSpec, serve_engine, stop_engines

        spec = EngineSpec(
            args.profile,
            args.policy,
            MODEL,
            seed=args.seed,
            time_scale=args.time_scale,
            port=args.port,
            fault_injection=True,
        )
        running = await serve_engine(spec)
        print(f"READY {running.url}", flush=True)
        try:
            await common.until_stdin_closes()
        finally:
            await stop_engines([running])

    if args.role == "engine":
        _run(engine())
    else:
        _run(common.serve_gateway_until_stdin_closes(args.engine_urls, MODEL, args.profile))
    return 0


# ---- load ---------------------------------------------------------------------------------


@dataclass
class Shot:
    """One request as the client saw it (seconds since the drill's start)."""

    sent: float
    tier: str
    stream: bool
    status: int | None = None
    first: float | None = None
    error: str | None = None
    """None (ok), ``before`` / ``after`` the first token, or ``hung``."""
    code: str | None = None
    done: float = math.inf
    """When the answer ended (or the client gave up)."""


async def shoot(
    session: aiohttp.ClientSession, url: str, key: str, shot: Shot, max_tokens: int, t0: float
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": shot.stream,
    }
    headers = {"authorization": f"Bearer {key}"}
    try:
        await _exchange(session, url, body, headers, shot, t0)
    finally:
        shot.done = time.monotonic() - t0


async def _exchange(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    shot: Shot,
    t0: float,
) -> None:
    try:
        async with (
            asyncio.timeout(REQUEST_TIMEOUT_S),
            session.post(url, json=body, headers=headers) as response,
        ):
            shot.status = response.status
            if response.status != 200:
                shot.error, shot.code = "before", _code(await response.read())
                return
            if not shot.stream:
                payload = json.loads(await response.read())
                if not payload.get("choices"):
                    shot.error, shot.code = "before", "no choices"
                shot.first = time.monotonic() - t0
                return
            done = False
            async for line in response.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b'data: {"error"'):
                    shot.error = "after" if shot.first is not None else "before"
                    shot.code = _code(line[6:])
                elif shot.first is None and _has_content(line):
                    shot.first = time.monotonic() - t0
            if shot.error is None and not done:
                shot.error = "after" if shot.first is not None else "before"
                shot.code = "cut short"
    except TimeoutError:
        shot.error, shot.code = "hung", "no answer"
    except (aiohttp.ClientError, ValueError) as exc:
        shot.error = "after" if shot.first is not None else "before"
        shot.code = type(exc).__name__


# ---- what the gateway says ----------------------------------------------------------------


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, str], float]:
    """Every sample of the gateway's exposition, by name and sorted label text."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(url) as response:
        text = await response.text()
    samples: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[(s.name, labels)] = s.value
    return samples


def _sum(samples: dict[tuple[str, str], float], name: str, **labels: str) -> float:
    wanted = [f"{k}={v}" for k, v in labels.items()]
    return sum(
        v
        for (n, text), v in samples.items()
        if n == name and all(w in text.split(",") for w in wanted)
    )


@dataclass
class Health:
    """Whether the target backend was healthy, polled from the gateway's readiness."""

    samples: list[tuple[float, bool]] = field(default_factory=list)

    async def poll(self, session: aiohttp.ClientSession, url: str, t0: float) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, ValueError, TimeoutError):
                async with asyncio.timeout(1.0), session.get(url) as response:
                    body = await response.json(content_type=None)
                    healthy = TARGET in body.get("healthy_backends", ())
                    self.samples.append((time.monotonic() - t0, healthy))
            await asyncio.sleep(POLL_S)

    def first(self, after: float, healthy: bool) -> float | None:
        return next((t for t, h in self.samples if t >= after and h is healthy), None)


# ---- the faults ---------------------------------------------------------------------------


async def _inject(session: aiohttp.ClientSession, url: str, **fault: Any) -> None:
    async with session.post(f"{url}/fault-injection", json=fault) as response:
        response.raise_for_status()


async def apply_fault(name: str, servers: Servers, session: aiohttp.ClientSession) -> None:
    engine = servers.engines[0]
    url = servers.engine_url(0)
    if name == "kill":
        engine.kill()
        engine.wait()
    elif name == "freeze":
        os.kill(engine.pid, signal.SIGSTOP)
    elif name == "hang":
        await _inject(session, url, mode="hang")
    elif name == "stall":
        await _inject(session, url, mode="stall")
    elif name == "garbage":
        await _inject(session, url, mode="garbage", garbage="text")
    elif name == "garbage-mid":
        await _inject(session, url, mode="garbage", garbage="text", after_tokens=2)
    else:
        raise ValueError(f"unknown fault {name!r}")


async def clear_fault(name: str, servers: Servers, session: aiohttp.ClientSession) -> None:
    if name == "kill":
        await asyncio.to_thread(servers.start_engine, 0)  # returns once it accepts
    elif name == "freeze":
        os.kill(servers.engines[0].pid, signal.SIGCONT)
    else:
        await _inject(session, servers.engine_url(0), mode="none")


@dataclass
class Phase:
    name: str
    start: float
    recovered: float = math.nan
    end: float = math.nan
    before: dict[tuple[str, str], float] = field(default_factory=dict)
    after: dict[tuple[str, str], float] = field(default_factory=dict)


async def drill(servers: Servers, setup: Setup) -> dict[str, Any]:
    rng = np.random.default_rng(setup.seed)
    url = f"{servers.gateway_url}/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.monotonic()
        health = Health()
        poller = asyncio.ensure_future(
            health.poll(session, f"{servers.gateway_url}/health/readiness", t0)
        )
        shots: list[Shot] = []
        tasks: set[asyncio.Task[None]] = set()
        stop = asyncio.Event()

        async def load() -> None:
            offset, count = 0.0, 0
            while not stop.is_set():
                offset += float(rng.exponential(1.0 / setup.rps))
                delay = t0 + offset - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tier = TIERS[count % len(TIERS)]
                count += 1
                shot = Shot(offset, tier, stream=bool(rng.random() >= setup.unary_share))
                shots.append(shot)
                task = asyncio.ensure_future(
                    shoot(session, url, servers.keys[tier], shot, setup.max_tokens, t0)
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        loader = asyncio.ensure_future(load())
        phases: list[Phase] = []
        await asyncio.sleep(setup.baseline_s)
        for name in setup.faults:
            phase = Phase(name, time.monotonic() - t0)
            phase.before = await scrape(session, servers.metrics_url)
            await apply_fault(name, servers, session)
            phase.start = time.monotonic() - t0
            await asyncio.sleep(setup.fault_s)
            await clear_fault(name, servers, session)
            phase.recovered = time.monotonic() - t0
            await asyncio.sleep(setup.settle_s)
            phase.end = time.monotonic() - t0
            phase.after = await scrape(session, servers.metrics_url)
            phases.append(phase)
        stop.set()
        await loader
        if tasks:
            await asyncio.wait(set(tasks))
        await asyncio.sleep(1.0)  # a scrape and a probe round after the last request
        final = await scrape(session, servers.metrics_url)
        engines_load = 0.0
        for number in range(setup.engines):
            engine_metrics = await scrape(session, f"{servers.engine_url(number)}/metrics")
            engines_load += _sum(engine_metrics, "vllm:num_requests_running")
            engines_load += _sum(engine_metrics, "vllm:num_requests_waiting")
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
    # a request belongs to the last fault that began before it ended (a stream sent just
    # before a fault and cut by it is that fault's); the baseline is what ended before any
    owner: dict[int, list[Shot]] = {i: [] for i in range(len(phases))}
    baseline: list[Shot] = []
    for shot in shots:
        index = next(
            (i for i in reversed(range(len(phases))) if phases[i].start <= shot.done), None
        )
        if index is not None:
            owner[index].append(shot)
        elif not phases or shot.done < phases[0].start:
            baseline.append(shot)
    base_summary = summarize(baseline)
    return {
        "setup": {
            "engines": setup.engines,
            "profile": setup.profile,
            "time_scale": setup.time_scale,
            "rps": setup.rps,
            "max_tokens": setup.max_tokens,
            "unary_share": setup.unary_share,
            "fault_s": setup.fault_s,
            "settle_s": setup.settle_s,
        },
        "baseline": base_summary,
        "faults": [
            report_phase(p, owner[i], health, base_summary["ttft_slo_missed_share"])
            for i, p in enumerate(phases)
        ],
        "after": {
            "in_flight": _sum(final, "tiergate_in_flight"),
            "awaiting_first_token": _sum(final, "tiergate_backend_prefill_queue"),
            "engines_running_or_waiting": engines_load,
            "unanswered_requests": sum(1 for s in shots if s.status is None and s.error is None),
        },
    }


SLO_TTFT_S = {"premium": 1.0, "standard": 2.0}
"""The default tiers' TTFT objectives (gateway.db.seed)."""


def summarize(shots: list[Shot]) -> dict[str, Any]:
    """Counts, and TTFT percentiles of the streamed requests (a non-streamed one's "first
    token" is its whole answer; it counts as a miss only if that came after the objective)."""
    ttfts = [s.first - s.sent for s in shots if s.first is not None and s.stream]
    missed = sum(
        1
        for s in shots
        if s.error in ("before", "hung") or s.first is None or s.first - s.sent > SLO_TTFT_S[s.tier]
    )
    codes: dict[str, int] = {}
    for s in shots:
        if s.error is not None:
            codes[f"{s.error}:{s.code}"] = codes.get(f"{s.error}:{s.code}", 0) + 1
    return {
        "requests": len(shots),
        "ok": sum(1 for s in shots if s.error is None),
        "errors_before_first_token": sum(1 for s in shots if s.error == "before"),
        "errors_after_first_token": sum(1 for s in shots if s.error == "after"),
        "hung": sum(1 for s in shots if s.error == "hung"),
        "error_codes": codes,
        "ttft_p50_ms": _pct_ms(ttfts, 50),
        "ttft_p99_ms": _pct_ms(ttfts, 99),
        "ttft_max_ms": _pct_ms(ttfts, 100),
        "ttft_slo_missed": missed,
        "ttft_slo_missed_share": round(missed / len(shots), 4) if shots else 0.0,
    }


def _pct_ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1e3, 1) if values else None


def report_phase(
    phase: Phase, mine: list[Shot], health: Health, base_share: float
) -> dict[str, Any]:
    summary = summarize(mine)
    opened = health.first(phase.start, healthy=False)
    closed = health.first(max(phase.recovered, opened or phase.recovered), healthy=True)

    def delta(name: str, **labels: str) -> float:
        return _sum(phase.after, name, **labels) - _sum(phase.before, name, **labels)

    return {
        "fault": phase.name,
        **summary,
        "ttft_slo_missed_by_fault": max(
            0, round(summary["ttft_slo_missed"] - base_share * summary["requests"])
        ),
        "failovers": delta("tiergate_failovers_total"),
        "failed_attempts_on_target": delta("tiergate_upstream_failures_total", backend=TARGET),
        "timeouts_on_target": {
            phase_name: delta("tiergate_upstream_timeouts_total", backend=TARGET, phase=phase_name)
            for phase_name in ("first_token", "response", "stall")
        },
        "breaker_opens": {
            reason: delta("tiergate_breaker_opens_total", backend=TARGET, reason=reason)
            for reason in ("unreachable", "unresponsive")
        },
        "breaker_open_after_s": round(opened - phase.start, 3) if opened is not None else None,
        "breaker_closed_after_recovery_s": (
            round(closed - phase.recovered, 3)
            if closed is not None and opened is not None
            else None
        ),
    }


# ---- entry point --------------------------------------------------------------------------


def run_drill(setup: Setup) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="tiergate-drill-engine-") as tmp,
        running_servers(setup, Path(tmp)) as servers,
    ):
        return _run(drill(servers, setup))


def _print(result: dict[str, Any]) -> None:
    s = result["setup"]
    print(
        f"{s['engines']} engines ({s['profile']}, x{s['time_scale']:g}), {s['rps']:g} req/s, "
        f"{s['max_tokens']} tokens, {s['unary_share']:.0%} unary; faults on {TARGET} for "
        f"{s['fault_s']:g} s, then {s['settle_s']:g} s"
    )
    b = result["baseline"]
    print(
        f"baseline: {b['requests']} requests, {b['ok']} ok, TTFT p50/p99 {b['ttft_p50_ms']}/"
        f"{b['ttft_p99_ms']} ms, {b['ttft_slo_missed']} missed TTFT"
    )
    header = (
        f"{'fault':<12}{'reqs':>6}{'ok':>6}{'err<1st':>8}{'err>1st':>8}{'hung':>6}"
        f"{'failover':>9}{'open s':>8}{'close s':>8}{'missed':>8}{'by fault':>9}{'p99 ms':>9}"
    )
    print(header)
    for f in result["faults"]:
        print(
            f"{f['fault']:<12}{f['requests']:>6}{f['ok']:>6}{f['errors_before_first_token']:>8}"
            f"{f['errors_after_first_token']:>8}{f['hung']:>6}{f['failovers']:>9.0f}"
            f"{_fmt(f['breaker_open_after_s']):>8}{_fmt(f['breaker_closed_after_recovery_s']):>8}"
            f"{f['ttft_slo_missed']:>8}{f['ttft_slo_missed_by_fault']:>9}"
            f"{_fmt(f['ttft_p99_ms']):>9}"
        )
    a = result["after"]
    print(
        f"after: in flight {a['in_flight']:g}, awaiting first token {a['awaiting_first_token']:g}, "
        f"engine load {a['engines_running_or_waiting']:g}, unanswered {a['unanswered_requests']}"
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["engine", "gateway"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--engine-urls", help=argparse.SUPPRESS)
    parser.add_argument("--engines", type=int, default=Setup.engines)
    parser.add_argument("--rps", type=float, default=Setup.rps)
    parser.add_argument("--fault-s", type=float, default=Setup.fault_s)
    parser.add_argument("--settle-s", type=float, default=Setup.settle_s)
    parser.add_argument("--baseline-s", type=float, default=Setup.baseline_s)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--max-tokens", type=int, default=Setup.max_tokens)
    parser.add_argument("--unary-share", type=float, default=Setup.unary_share)
    parser.add_argument("--profile", default=Setup.profile)
    parser.add_argument("--policy", default=Setup.policy)
    parser.add_argument("--time-scale", type=float, default=Setup.time_scale)
    parser.add_argument("--seed", type=int, default=Setup.seed)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role is not None:
        return _serve_role(args)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = set(faults) - set(FAULTS)
    if unknown or args.engines < 2:
        parser.error(f"unknown faults {sorted(unknown)}" if unknown else "--engines must be >= 2")
    setup = Setup(
        engines=args.engines,
        profile=args.profile,
        policy=args.policy,
        time_scale=args.time_scale,
        rps=args.rps,
        max_tokens=args.max_tokens,
        unary_share=args.unary_share,
        baseline_s=args.baseline_s,
        fault_s=args.fault_s,
        settle_s=args.settle_s,
        faults=faults,
        seed=args.seed,
    )
    result = run_drill(setup)
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
