"""Redis outage drill: the limits' Redis is killed for ~10 s under open-loop load, and comes back
empty (no persistence).

    python bench/drill_redis.py [--duration 90] [--rps 40] [--outage-at 30] [--outage-s 10]
        [--fault kill|freeze] [--workers 2] [--rpm 600] [--max-concurrency 20] [--json]

A redis-server of this run (a free port, ``--save '' --appendonly no``, never the machine's
shared one), an emulated engine and the gateway (``--workers N`` processes behind one port,
:func:`gateway.serve.run_workers`, when N > 1; limits in that Redis, each process's degraded
share ``1/N``) run in processes of their own, on a SQLite database seeded with one tier and two
tenants: ``limited`` (``--rpm`` requests per minute, ``--max-concurrency``) and ``free`` (no
limits). This process sends streamed chat completions as an open-loop Poisson stream at
``--rps``, half for each tenant (``limited`` is offered twice its limit by default, so the limit
binds all along), and polls readiness and the operator metrics every 0.25 s. At
``--outage-at`` seconds Redis is killed (SIGKILL), and ``--outage-s`` later started again, empty;
with ``--fault freeze`` it is stopped (SIGSTOP: connections open, nothing answered, so every
call runs into its timeout) and resumed with its data (and the calls it had queued).

Reported (``--json``: one object): answers by tenant, phase (before, during, after the outage)
and status; 5xx answers (must be 0) and the unlimited tenant's non-200s (must be 0) and TTFT by
phase (unaffected); the limited tenant's admissions in every minute of the run and the most in
any 60 s (sliding, by the client's send times) against ``--rpm``; readiness and the
``tiergate_limiter_degraded`` gauge during the outage, how soon after the kill readiness said
``degraded-local`` and after the restart ``redis`` again, ``tiergate_limiter_fallbacks_total``;
after the load: concurrency leases left in Redis (must be 0) and the limited tenant's window in
Redis against what the client saw admitted in the last 60 s (the window survived the restart).
The short form is ``tests/gateway/test_redis_outage.py`` (in-process, and this script briefly);
what it checks is in ``docs/operations/redis-outage.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
import drills_common as common  # the drills' shared child-process helpers

_free_port = common.free_port


MODEL = "drill-model"
SECRET = "redis-drill-secret"
TIER = "drill"
PROMPT = "Say hello to the drill."
STARTUP_TIMEOUT_S = 60.0
POLL_S = 0.25
REDIS_PREFIX = "tiergate"


# ---- servers -------------------------------------------------------------------------------


class OwnRedis:
    """A non-persistent redis-server of this run, killed and restarted on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import redis

        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError):
                    client.ping()
                    return
                time.sleep(0.02)
        finally:
            client.close()
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def freeze(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered (a hung server, or a partition)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def counts(self) -> dict[str, int]:
        """Entries of every rpm log and slots leased, now."""
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            logs = sum(int(client.zcard(k)) for k in client.scan_iter(match="*:log"))
            slots = sum(int(client.zcard(k)) for k in client.scan_iter(match="*:slots"))
        finally:
            client.close()
        return {"log_entries": logs, "slots": slots}


def seed(url: str, rpm: int, max_concurrency: int) -> dict[str, str]:
    """A lenient tier (nothing shed on SLO grounds) and the two tenants; their keys by name."""
    from gateway.db import crud
    from gateway.db.models import Base
    from gateway.db.session import make_engine, make_session_factory

    engine = make_engine(url)
    try:
        Base.metadata.create_all(engine)
        with make_session_factory(engine).begin() as session:
            crud.create_tier(
                session,
                actor="drill",
                name=TIER,
                weight=1.0,
                ttft_ms=60_000.0,
                tpot_ms=10_000.0,
                best_effort_allowed=True,
            )
            crud.create_tenant(
                session,
                actor="drill",
                name="limited",
                tier=TIER,
                rpm_limit=rpm,
                max_concurrency=max_concurrency,
            )
            crud.create_tenant(session, actor="drill", name="free", tier=TIER)
            return {
                name: crud.create_key(session, actor="drill", tenant=name, secret=SECRET).plaintext
                for name in ("limited", "free")
            }
    finally:
        engine.dispose()


Servers = common.EngineAndGateway


@contextlib.contextmanager
def running_servers(
    db_url: str, redis_url: str, workdir: Path, *, workers: int, time_scale: float
) -> Iterator[Servers]:
    env = dict(os.environ)
    env.update(
        TIERGATE_DATABASE_URL=db_url,
        TIERGATE_SECRET=SECRET,
        TIERGATE_DATA_DIR=str(workdir),
        TIERGATE_REDIS_URL=redis_url,
        TIERGATE_REDIS_PREFIX=REDIS_PREFIX,
    )
    with common.engine_and_gateway(
        __file__,
        workdir,
        env,
        workers=workers,
        time_scale=time_scale,
        gateway_up=("/health/readiness", lambda status: status == 200),
        startup_timeout_s=STARTUP_TIMEOUT_S,
        gateway_stop_s=30.0,
    ) as servers:
        yield servers


# ---- load ----------------------------------------------------------------------------------


@dataclass
class Answer:
    tenant: str
    sent: float  # seconds since the run started
    status: int = 0
    reason: str | None = None  # x-tiergate-reject-reason
    message: str | None = None  # the error's message, when refused
    ttft_s: float | None = None
    client_error: str | None = None
    phase: str = ""


@dataclass
class Timeline:
    down_at: float | None = None
    up_at: float | None = None
    end: float = 0.0
    readiness: list[tuple[float, int, str]] = field(default_factory=list)  # (t, status, limits)
    gauge: list[tuple[float, float, float]] = field(default_factory=list)  # (t, gauge, fallbacks)


async def _request(session: Any, url: str, key: str, body: bytes, answer: Answer) -> None:
    import aiohttp

    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    start = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            answer.status = resp.status
            answer.reason = resp.headers.get("x-tiergate-reject-reason")
            if resp.status != 200:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    answer.message = json.loads(await resp.read())["error"]["message"]
                return
            async for line in resp.content:
                if answer.ttft_s is None and line.startswith(b"data: {") and b'"content"' in line:
                    answer.ttft_s = time.perf_counter() - start
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        answer.client_error = type(exc).__name__


def _metric_values(text: str) -> tuple[float, float]:
    gauge = fallbacks = 0.0
    for line in text.splitlines():
        if line.startswith("tiergate_limiter_degraded"):
            gauge = max(gauge, float(line.split()[-1]))
        elif line.startswith("tiergate_limiter_fallbacks_total"):
            fallbacks += float(line.split()[-1])
    return gauge, fallbacks


async def drive(
    servers: Servers, redis: OwnRedis, keys: dict[str, str], setup: Setup
) -> tuple[list[Answer], Timeline]:
    import aiohttp

    rng = np.random.default_rng(setup.seed)
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": setup.max_tokens,
            "stream": True,
        }
    ).encode()
    url = f"{servers.gateway_url}/v1/chat/completions"
    arrivals = np.cumsum(rng.exponential(1.0 / setup.rps, size=int(setup.rps * setup.duration_s)))
    tenants = rng.choice(["limited", "free"], size=len(arrivals))
    answers: list[Answer] = []
    timeline = Timeline()
    tasks: set[asyncio.Task[None]] = set()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        t0 = time.perf_counter()

        def now() -> float:
            return time.perf_counter() - t0

        async def outage() -> None:
            await asyncio.sleep(max(0.0, setup.outage_at_s - now()))
            timeline.down_at = now()
            await asyncio.to_thread(redis.kill if setup.fault == "kill" else redis.freeze)
            await asyncio.sleep(max(0.0, timeline.down_at + setup.outage_s - now()))
            await asyncio.to_thread(redis.start if setup.fault == "kill" else redis.thaw)
            timeline.up_at = now()

        async def poll() -> None:
            while True:
                await asyncio.sleep(POLL_S)
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with session.get(f"{servers.gateway_url}/health/readiness") as resp:
                        data = await resp.json()
                    timeline.readiness.append((now(), resp.status, str(data.get("limits"))))
                    async with session.get(servers.metrics_url) as resp:
                        timeline.gauge.append((now(), *_metric_values(await resp.text())))

        helpers = [asyncio.ensure_future(outage()), asyncio.ensure_future(poll())]
        for offset, tenant in zip(arrivals, tenants, strict=True):
            delay = float(offset) - now()
            if delay > 0:
                await asyncio.sleep(delay)
            answer = Answer(str(tenant), now())
            answers.append(answer)
            task = asyncio.ensure_future(_request(session, url, keys[answer.tenant], body, answer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await helpers[0]
        while tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)
        timeline.end = now()
        await asyncio.sleep(4 * POLL_S)  # a last readiness and metrics sample, all quiet
        helpers[1].cancel()
    for answer in answers:
        answer.phase = common.outage_phase(answer.sent, timeline.down_at, timeline.up_at)
    return answers, timeline


# ---- the drill -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    duration_s: float = 90.0
    rps: float = 40.0
    outage_at_s: float = 30.0
    outage_s: float = 10.0
    fault: str = "kill"  # kill (restarted empty) | freeze (SIGSTOP, then SIGCONT: data kept)
    workers: int = 2
    rpm: int = 600
    max_concurrency: int = 20
    max_tokens: int = 16
    time_scale: float = 4.0
    seed: int = 0


def run_drill(setup: Setup) -> dict[str, Any]:
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH")
    with tempfile.TemporaryDirectory(prefix="tiergate-redis-drill-") as tmp:
        workdir = Path(tmp)
        db_url = f"sqlite:///{workdir / 'tiergate.db'}"
        keys = seed(db_url, setup.rpm, setup.max_concurrency)
        redis = OwnRedis(workdir)
        redis.start()
        try:
            with running_servers(
                db_url, redis.url, workdir, workers=setup.workers, time_scale=setup.time_scale
            ) as servers:
                answers, timeline = asyncio.run(drive(servers, redis, keys, setup))
                after = redis.counts()  # the gateway still up: nothing held, nothing leaked
        finally:
            redis.kill()
    return report(setup, answers, timeline, after)


def _percentile_ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1e3, 1) if values else None


def _max_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` in any interval ``[t, t + window)``."""
    ordered, best, start = sorted(times), 0, 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def report(
    setup: Setup, answers: list[Answer], timeline: Timeline, after: dict[str, int]
) -> dict[str, Any]:
    down, up = timeline.down_at or 0.0, timeline.up_at or 0.0
    statuses: dict[str, dict[str, dict[str, int]]] = {}
    for answer in answers:
        phases = statuses.setdefault(answer.tenant, {})
        cell = phases.setdefault(answer.phase, {})
        key = str(answer.status) if answer.client_error is None else answer.client_error
        cell[key] = cell.get(key, 0) + 1
    admitted = [a.sent for a in answers if a.tenant == "limited" and a.status == 200]
    minutes = int(np.ceil(timeline.end / 60.0))
    per_minute = [sum(60 * m <= t < 60 * (m + 1) for t in admitted) for m in range(minutes)]
    free_ttft = {
        phase: {
            "p50_ms": _percentile_ms(values, 50),
            "p99_ms": _percentile_ms(values, 99),
        }
        for phase in ("before", "during", "after")
        if (
            values := [
                a.ttft_s
                for a in answers
                if a.tenant == "free" and a.phase == phase and a.ttft_s is not None
            ]
        )
    }
    during = [r for r in timeline.readiness if down <= r[0] < up]
    degraded_at = next(
        (t for t, _, mode in timeline.readiness if t >= down and mode == "degraded-local"), None
    )
    after_up = [(t, mode) for t, _, mode in timeline.readiness if t >= up]
    last_other = max((t for t, mode in after_up if mode != "redis"), default=-1.0)
    back_at = next((t for t, mode in after_up if mode == "redis" and t > last_other), None)
    gauge_during = [g for t, g, _ in timeline.gauge if down <= t < up]
    return {
        "rps": setup.rps,
        "duration_s": round(timeline.end, 1),
        "workers": setup.workers,
        "rpm_limit": setup.rpm,
        "requests": len(answers),
        "fault": setup.fault,
        "outage_s": round(up - down, 2),
        "statuses": statuses,
        "status_5xx": sum(a.status >= 500 for a in answers),
        "client_errors": sum(a.client_error is not None for a in answers),
        "unlimited_non_200": sum(a.tenant == "free" and a.status != 200 for a in answers),
        "free_ttft_ms": free_ttft,
        "limited_reject_reasons": dict(
            Counter(a.reason for a in answers if a.tenant == "limited" and a.status == 429)
        ),
        "limited_refusals_during": dict(
            Counter(a.message for a in answers if a.tenant == "limited" and a.phase == "during")
        ),
        "limited_admitted_per_minute": per_minute,
        "limited_admitted_max_any_60s": _max_in_window(admitted, 60.0),
        "readiness_during_outage": dict(Counter(f"{s} {m}" for _, s, m in during)),
        "readiness_last_during_outage": f"{during[-1][1]} {during[-1][2]}" if during else None,
        "readiness_degraded_after_kill_s": None
        if degraded_at is None
        else round(degraded_at - down, 2),
        "readiness_redis_after_restart_s": None if back_at is None else round(back_at - up, 2),
        "gauge_during_outage_max": max(gauge_during, default=None),
        "gauge_at_end": timeline.gauge[-1][1] if timeline.gauge else None,
        "fallbacks_total": timeline.gauge[-1][2] if timeline.gauge else None,
        "leases_left": after["slots"],
        "redis_window_entries_after": after["log_entries"],
        "client_admitted_last_60s": sum(t >= timeline.end - 60.0 for t in admitted),
    }


def _print(result: dict[str, Any]) -> None:
    for name, value in result.items():
        print(f"{name:>32}: {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("engine", "gateway"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--engine-url", help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=Setup.duration_s)
    parser.add_argument("--rps", type=float, default=Setup.rps)
    parser.add_argument("--outage-at", type=float, default=Setup.outage_at_s, help="seconds")
    parser.add_argument("--outage-s", type=float, default=Setup.outage_s)
    parser.add_argument("--fault", choices=("kill", "freeze"), default=Setup.fault)
    parser.add_argument("--workers", type=int, default=Setup.workers)
    parser.add_argument("--rpm", type=int, default=Setup.rpm)
    parser.add_argument("--max-concurrency", type=int, default=Setup.max_concurrency)
    parser.add_argument("--max-tokens", type=int, default=Setup.max_tokens)
    parser.add_argument("--time-scale", type=float, default=Setup.time_scale)
    parser.add_argument("--seed", type=int, default=Setup.seed)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role is not None:
        return common.serve_engine_or_gateway(args, MODEL)
    setup = Setup(
        duration_s=args.duration,
        rps=args.rps,
        outage_at_s=args.outage_at,
        outage_s=args.outage_s,
        fault=args.fault,
        workers=args.workers,
        rpm=args.rpm,
        max_concurrency=args.max_concurrency,
        max_tokens=args.max_tokens,
        time_scale=args.time_scale,
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
