"""Overload drill: N x capacity for a while, then how fast the gateway is itself again.

    python bench/drill_overload.py [--duration 60] [--overload 10] [--capacity R] [--json]
        [--engines 1] [--profile a100-qwen2-7b] [--slowdown 1] [--policy sarathi-priority]
        [--mix 1,1,1] [--prompt-tokens 100,1000] [--max-tokens 64] [--seed 0]

Emulated engines (one child process) and one gateway (another; SQLite seeded with the default
tiers: premium, standard, batch and their ``shed_slack``) run as in
``bench/gateway_overhead.py``; this process is the load generator. The engines run
``--profile`` slowed down ``--slowdown`` times (its coefficients scaled, written to a profile
file that engines and gateway both read, so the gateway's estimates match the engines), so
that the machine's two cores can drive ten times their capacity. The engines' default policy,
``sarathi-priority``, keeps each request's time per token within its objective; ``slide``
(``tiergate serve``'s) spends a first token's slack on later tokens — on time by every token's
deadline, a miss by the strict mean-TPOT definition (``admitted_on_time_pct`` against
``admitted_within_slo_pct``; ``docs/operations/overload.md``).

Phases, in order:

1. **Baseline**: premium probes one at a time on the idle system: TTFT p50 (``baseline``).
2. **Capacity** (unless ``--capacity``): open-loop Poisson load of the same request mix through
   a tier that sheds nothing (TTFT objective 60 s), in steps of ``--step`` seconds at rising
   rates; capacity is the highest rate whose TTFT p50 is below twice that of the lowest rate
   (the knee, where queueing starts to dominate).
3. **Overload**: ``--overload`` x capacity for ``--duration`` seconds, tiers drawn by
   ``--mix`` (premium, standard, batch), each request streaming ``--max-tokens`` tokens from a
   prompt of a uniform random length in ``--prompt-tokens``. The gateway's queue depth (its
   ``/metrics``) and resident memory (``/proc``) are sampled every 0.5 s.
4. **Recovery**: from the moment the last overload request is sent, a premium probe every
   ``--probe-every`` seconds for ``--probe-for`` seconds, all with the same prompt (the middle
   of the range); recovery is the send time of the first probe from which the median TTFT of
   every 4 consecutive probes (a refused one counts as infinitely slow) is within 1.5 x the
   baseline.

Per tier, from the gateway's usage records (written at shutdown): sent, admitted (served with
its SLO), demoted (served best effort), shed (503 ``slo_unattainable`` / ``slo_infeasible``),
other refusals and errors, the share of admitted requests that met their SLO (the gateway's
definition: TTFT, TPOT and deadline, ``docs/usage.md``) and their TTFT p50/p99 (at the gateway's
egress). ``--json`` prints one object: ``capacity_rps``, ``overload_rps``, ``tiers`` (the
table), ``queue_depth_max``, ``gateway_rss_max_mib``, ``baseline_ttft_ms``, ``recovery_s``,
the probes (each with its ``outcome``: HTTP status and reject reason, or the client-side failure
class such as ``timeout:...`` or ``connection:...``; counted in ``probe_outcomes`` and per tier in
``client_outcomes``), each process's CPU use, how far the emulated engines lagged their
profile, and the gateway's own counters (demotions, refusals by reason, upstream timeouts).
``TIERGATE_DRILL_SERVER_LOG=<file>`` keeps the servers' stderr; ``TIERGATE_BENCH_PROFILE=<file>``
runs the gateway under cProfile.
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
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
import drills_common as common  # the drills' shared child-process helpers

_process_cpu_seconds = common.process_cpu_seconds
_free_port = common.free_port
_run = common.run_on_uvloop
_has_content = common.has_content


def _spawn(
    args: list[str], env: dict[str, str], log: IO[bytes]
) -> tuple[subprocess.Popen[bytes], str]:
    """This script in a server role; it prints ``READY <value>`` once it accepts connections."""
    return common.spawn_ready(
        __file__, args, env, log, marker="READY", timeout_s=STARTUP_TIMEOUT_S, stop=_stop
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    common.stop_child(proc, timeout_s=30.0)


def _report_server_log(path: Path, tail: int = 8) -> None:
    common.report_server_log(path, tail)


MODEL = "drill-model"
SECRET = "drill-overload-secret"
TIERS = ("premium", "standard", "batch")
CAPACITY_TIER = "drill-capacity"
"""Sheds nothing (60 s TTFT, no best effort needed): what the capacity ladder runs on."""
PROBE_TENANT = "probe"
STARTUP_TIMEOUT_S = 60.0
RECOVERY_FACTOR = 1.5
RECOVERY_WINDOW = 4
"""Probes judged together (one second at the default rate): one probe that lands behind a
step of leftover work is noise, a second of them is not."""
SHED_REASONS = ("slo_unattainable", "slo_infeasible")
REQUEST_TIMEOUT_S = 120.0
SERVER_LOG_ENV = "TIERGATE_DRILL_SERVER_LOG"
"""A path: the servers' stderr is copied there when the drill ends."""
PROFILE_ENV = "TIERGATE_BENCH_PROFILE"
"""A path: the gateway runs under cProfile and dumps its stats there when it stops."""


@dataclass(frozen=True)
class Setup:
    engines: int = 1
    profile: str = "a100-qwen2-7b"
    slowdown: float = 1.0
    policy: str = "sarathi-priority"
    mix: tuple[float, float, float] = (1.0, 1.0, 1.0)
    prompt_tokens: tuple[int, int] = (100, 1000)
    max_tokens: int = 64
    seed: int = 0
    slack: tuple[float, ...] | None = None
    """The tiers' ``shed_slack`` (premium, standard, batch); None: as seeded."""


# ---- servers (child processes) ------------------------------------------------------------


@dataclass
class Servers:
    gateway_url: str
    metrics_url: str
    keys: dict[str, str]
    """API key by tenant name (one tenant per tier, the capacity tenant and the probe)."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    db_url: str = ""
    engine_urls: list[str] = field(default_factory=list)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time used so far by the engines' process, the gateway's and this one."""
        return {
            "engines": _process_cpu_seconds(self.processes[0].pid),
            "gateway": _process_cpu_seconds(self.processes[-1].pid),
            "client": time.process_time(),
        }

    @property
    def gateway_pid(self) -> int:
        return self.processes[-1].pid


def _scaled_profile(name: str, slowdown: float, directory: Path) -> Path:
    """The profile with every latency coefficient multiplied by ``slowdown``, as a JSON file."""
    from priority.profiles import load_profile

    data = load_profile(name).to_dict()
    data["name"] = f"{data['name']}-x{slowdown:g}"
    data["coefficients"] = {k: v * slowdown for k, v in data["coefficients"].items()}
    path = directory / f"{data['name']}.json"
    path.write_text(json.dumps(data))
    return path


def _seed(url: str, slack: tuple[float, ...] | None = None) -> dict[str, str]:
    """Default tiers (``slack``: their ``shed_slack`` instead of the seeded ones), a tenant per
    tier, the capacity tier and its tenant, a probe tenant."""
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
            for tier, value in zip(TIERS, slack or (), strict=False):
                crud.update_tier(session, tier, {"shed_slack": value}, actor="drill")
            crud.create_tier(
                session,
                actor="drill",
                name=CAPACITY_TIER,
                weight=1.0,
                ttft_ms=60_000.0,
                tpot_ms=10_000.0,
            )
            tenants = {t: t for t in TIERS} | {
                CAPACITY_TIER: CAPACITY_TIER,
                PROBE_TENANT: "premium",
            }
            for tenant, tier in tenants.items():
                crud.create_tenant(session, actor="drill", name=tenant, tier=tier)
                keys[tenant] = crud.create_key(
                    session, actor="drill", tenant=tenant, secret=SECRET
                ).plaintext
    finally:
        engine.dispose()
    return keys


@contextlib.contextmanager
def running_servers(setup: Setup, root: Path) -> Iterator[Servers]:
    """Engines and gateway against a database under ``root`` (kept after they stop: the
    gateway writes its last usage records as it stops)."""
    db_url = f"sqlite:///{root / 'tiergate.db'}"
    keys = _seed(db_url, setup.slack)
    profile = _scaled_profile(setup.profile, setup.slowdown, root)
    env = dict(os.environ)
    env.update(TIERGATE_DATABASE_URL=db_url, TIERGATE_SECRET=SECRET, TIERGATE_DATA_DIR=str(root))
    env.pop("TIERGATE_REDIS_URL", None)
    log_path = root / "servers.log"
    procs: list[subprocess.Popen[bytes]] = []
    with log_path.open("wb") as log:
        try:
            engines, urls = _spawn(
                [
                    "--role",
                    "engines",
                    "--engines",
                    str(setup.engines),
                    "--profile-file",
                    str(profile),
                    "--policy",
                    setup.policy,
                    "--seed",
                    str(setup.seed),
                ],
                env,
                log,
            )
            procs.append(engines)
            metrics_port = _free_port()
            gateway, port = _spawn(
                ["--role", "gateway", "--engine-urls", urls, "--profile-file", str(profile)],
                {**env, "TIERGATE_METRICS_ADDR": f"127.0.0.1:{metrics_port}"},
                log,
            )
            procs.append(gateway)
            servers = Servers(
                f"http://127.0.0.1:{port}",
                f"http://127.0.0.1:{metrics_port}/metrics",
                keys,
                procs,
                db_url,
                urls.split(","),
            )
            _wait_ready(servers.gateway_url)
            yield servers
        finally:
            for proc in reversed(procs):
                _stop(proc)
    _report_server_log(log_path)
    keep = os.environ.get(SERVER_LOG_ENV)
    if keep:
        Path(keep).write_bytes(log_path.read_bytes())


def _wait_ready(url: str) -> None:
    import httpx

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health/readiness", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("the gateway never saw its engines healthy")


def _serve_role(args: argparse.Namespace) -> int:
    """Child process: serve the engines or the gateway until stdin closes."""

    async def engines() -> None:
        from engine_emulated.serve import EngineSpec, serve_engines, stop_engines

        specs = [
            EngineSpec(args.profile_file, args.policy, MODEL, seed=args.seed + i)
            for i in range(args.engines)
        ]
        running = await serve_engines(specs)
        print("READY " + ",".join(e.url for e in running), flush=True)
        try:
            await common.until_stdin_closes()
        finally:
            await stop_engines(running)

    def gateway() -> Coroutine[Any, Any, None]:
        return common.serve_gateway_until_stdin_closes(args.engine_urls, MODEL, args.profile_file)

    profile_path = os.environ.get(PROFILE_ENV) if args.role == "gateway" else None
    if not profile_path:
        _run(engines() if args.role == "engines" else gateway())
        return 0
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        _run(gateway())
    finally:
        profiler.disable()
        profiler.dump_stats(profile_path)
    return 0


# ---- load ---------------------------------------------------------------------------------


@dataclass
class Shot:
    """One request as the client saw it (``time.perf_counter`` seconds)."""

    tenant: str
    sent: float
    status: int = 0
    reason: str | None = None
    retry_after: str | None = None
    ttft_s: float | None = None
    tokens: int = 0
    error: str | None = None
    outcome: str = "unsent"
    """What became of it: the HTTP status (with the gateway's reject reason, or
    ``then <what>`` when a 200 stream went wrong), else the client-side failure class
    (:func:`drills_common.exception_outcome`) — never a bare status 0."""


class Loader:
    """Streams chat completions through the gateway on one aiohttp session."""

    def __init__(self, servers: Servers, setup: Setup, rng: np.random.Generator) -> None:
        self.servers = servers
        self.setup = setup
        self.rng = rng
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        )

    @property
    def probe_tokens(self) -> int:
        """Every probe has the same prompt — a typical one, the middle of the mix's range — so
        its TTFT compares with the baseline's."""
        low, high = self.setup.prompt_tokens
        return (low + high) // 2

    def body(self, tokens: int | None = None) -> bytes:
        """A chat body with a prompt of ``tokens`` (else a random length of the mix)."""
        if tokens is None:
            low, high = self.setup.prompt_tokens
            tokens = int(self.rng.integers(low, high + 1))
        # about four characters a token (gateway/tokens.py): words of four, spaces between
        content = ("abc " * tokens).strip()
        return json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": self.setup.max_tokens,
                "stream": True,
            }
        ).encode()

    async def shoot(self, tenant: str, body: bytes, shot: Shot) -> None:
        headers = {
            "authorization": f"Bearer {self.servers.keys[tenant]}",
            "content-type": "application/json",
        }
        shot.sent = time.perf_counter()
        shot.outcome = "sent"
        try:
            async with self.session.post(
                f"{self.servers.gateway_url}/v1/chat/completions", data=body, headers=headers
            ) as response:
                shot.status = response.status
                shot.outcome = str(response.status)
                if response.status != 200:
                    shot.reason = response.headers.get("x-tiergate-reject-reason")
                    shot.retry_after = response.headers.get("retry-after")
                    shot.outcome += f" {shot.reason}" if shot.reason else ""
                    await response.read()
                    return
                done = False
                async for line in response.content:
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    elif not line.startswith(b"data: {"):
                        continue
                    elif b'"content"' in line and _has_content(line):
                        if shot.ttft_s is None:
                            shot.ttft_s = time.perf_counter() - shot.sent
                        shot.tokens += 1
                    elif b'"error"' in line:
                        shot.error = "stream error event"
                        shot.outcome = f"200 then error event {common.error_code(line[6:])}"
                if not done and shot.error is None:
                    shot.error = "cut short"
                    shot.outcome = "200 then cut short"
        except Exception as exc:  # every failure is counted, none lost in a task
            shot.error = type(exc).__name__
            failure = common.exception_outcome(exc)
            shot.outcome = f"200 then {failure}" if shot.status == 200 else failure

    async def open_loop(
        self, rate: float, duration_s: float, pick: Any, shots: list[Shot]
    ) -> float:
        """Poisson arrivals at ``rate`` for ``duration_s``; returns when the last is *sent*
        (the perf_counter time), leaving the requests running as tasks in ``self.tasks``."""
        t0 = time.perf_counter()
        offset = float(self.rng.exponential(1.0 / rate))
        while offset < duration_s:
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            shot = Shot(pick(), 0.0)
            shots.append(shot)
            self.spawn(self.shoot(shot.tenant, self.body(), shot))
            offset += float(self.rng.exponential(1.0 / rate))
        return time.perf_counter()

    tasks: set[asyncio.Task[None]]

    def spawn(self, coro: Any) -> None:
        if not hasattr(self, "tasks"):
            self.tasks = set()
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def settle(self) -> None:
        while getattr(self, "tasks", None):
            await asyncio.wait(set(self.tasks))

    async def close(self) -> None:
        await self.settle()
        await self.session.close()


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


async def baseline(loader: Loader, probes: int = 10) -> float:
    """Premium probes one at a time on the idle system: TTFT p50 (s)."""
    ttfts = []
    for _ in range(probes):
        shot = Shot(PROBE_TENANT, 0.0)
        await loader.shoot(PROBE_TENANT, loader.body(loader.probe_tokens), shot)
        if shot.ttft_s is not None:
            ttfts.append(shot.ttft_s)
        await asyncio.sleep(0.1)
    if not ttfts:
        raise RuntimeError("no baseline probe succeeded")
    return float(np.median(ttfts))


async def measure_capacity(
    loader: Loader, step_s: float, start_rps: float, factor: float, max_rps: float
) -> tuple[float, list[dict[str, Any]]]:
    """Rising open-loop rates on the capacity tier until TTFT p50 doubles; the last rate
    below the knee (see the module docstring)."""
    steps: list[dict[str, Any]] = []
    reference: float | None = None
    rate, capacity = start_rps, start_rps
    while rate <= max_rps:
        shots: list[Shot] = []
        await loader.open_loop(rate, step_s, lambda: CAPACITY_TIER, shots)
        await loader.settle()
        ttfts = [s.ttft_s for s in shots if s.ttft_s is not None and s.status == 200]
        p50 = _pct(ttfts, 50)
        steps.append({"rps": rate, "requests": len(shots), "ttft_p50_ms": _ms(p50)})
        print(f"capacity step {rate:.1f} rps: TTFT p50 {_ms(p50)} ms", file=sys.stderr)
        if p50 is None:
            break
        if reference is None:
            reference = p50
        elif p50 >= 2.0 * reference:
            break
        capacity = rate
        rate *= factor
        await asyncio.sleep(1.0)
    return capacity, steps


class Sampler:
    """The gateway's queue depth and resident memory, every ``interval_s``."""

    def __init__(self, servers: Servers, session: aiohttp.ClientSession) -> None:
        self.servers = servers
        self.session = session
        self.queue_max = 0.0
        self.rss_max_mib = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self, interval_s: float = 0.5) -> None:
        self._task = asyncio.ensure_future(self._loop(interval_s))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self, interval_s: float) -> None:
        while True:
            self.rss_max_mib = max(self.rss_max_mib, _rss_mib(self.servers.gateway_pid))
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with self.session.get(self.servers.metrics_url) as response:
                    text = await response.text()
                for line in text.splitlines():
                    if line.startswith("tiergate_queue_depth "):
                        self.queue_max = max(self.queue_max, float(line.split()[1]))
            await asyncio.sleep(interval_s)


async def _engine_lag(session: aiohttp.ClientSession, urls: list[str]) -> tuple[float, float]:
    """Sum and count of the engines' step lag histograms (emulated seconds)."""
    total = count = 0.0
    for url in urls:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            async with session.get(f"{url}/metrics") as response:
                text = await response.text()
            for line in text.splitlines():
                if line.startswith("tiergate:engine_sim_step_lag_seconds_sum"):
                    total += float(line.split()[-1])
                elif line.startswith("tiergate:engine_sim_step_lag_seconds_count"):
                    count += float(line.split()[-1])
    return total, count


COUNTERS = (
    "tiergate_demotions_total",
    "tiergate_rejections_total",
    "tiergate_upstream_timeouts_total",
    "tiergate_breaker_opened_total",
    "tiergate_failovers_total",
)


async def _gateway_counters(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The series of :data:`COUNTERS` in the gateway's ``/metrics``, by their label set."""
    out: dict[str, float] = {}
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with session.get(url) as response:
            text = await response.text()
        for line in text.splitlines():
            if line.startswith(COUNTERS):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
    return out


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def recovery_probes(loader: Loader, every_s: float, for_s: float, probes: list[Shot]) -> None:
    """A premium probe every ``every_s`` for ``for_s`` (open loop: a slow one does not delay
    the next)."""
    t0 = time.perf_counter()
    n = 0
    while n * every_s < for_s:
        delay = t0 + n * every_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        shot = Shot(PROBE_TENANT, 0.0)
        probes.append(shot)
        loader.spawn(loader.shoot(PROBE_TENANT, loader.body(loader.probe_tokens), shot))
        n += 1


def recovery_time(probes: list[Shot], stop: float, baseline_s: float) -> float | None:
    """Send time (after ``stop``) of the first probe from which on the median TTFT of every
    :data:`RECOVERY_WINDOW` consecutive probes is within :data:`RECOVERY_FACTOR` x baseline
    (a probe refused or failed counts as infinitely slow); None if the last window is not."""
    bound = RECOVERY_FACTOR * baseline_s
    ordered = sorted(probes, key=lambda s: s.sent)
    ttfts = [s.ttft_s if s.ttft_s is not None else math.inf for s in ordered]
    recovered: float | None = None
    for i in range(len(ordered) - RECOVERY_WINDOW + 1):
        ok = float(np.median(ttfts[i : i + RECOVERY_WINDOW])) <= bound
        if ok and recovered is None:
            recovered = ordered[i].sent - stop
        elif not ok:
            recovered = None
    return None if recovered is None else max(0.0, recovered)


# ---- report -------------------------------------------------------------------------------


def tier_table(shots: list[Shot], db_url: str) -> dict[str, dict[str, Any]]:
    """Per tier: what the client sent and saw, and what the usage records say."""
    from sqlalchemy import select

    from gateway.db.models import Tenant, Tier, UsageRecord
    from gateway.db.session import make_engine, make_session_factory

    engine = make_engine(db_url)
    try:
        with make_session_factory(engine)() as session:
            tenants = {t.id: t.name for t in session.scalars(select(Tenant))}
            slos = {t.name: (t.ttft_ms, t.tpot_ms) for t in session.scalars(select(Tier))}
            rows = session.scalars(select(UsageRecord)).all()
    finally:
        engine.dispose()
    table: dict[str, dict[str, Any]] = {}
    for tier in TIERS:
        mine = [s for s in shots if s.tenant == tier]
        records = [r for r in rows if tenants.get(r.tenant_id or -1) == tier]
        ok = [r for r in records if r.status == "ok"]
        demoted = [r for r in ok if (r.reject_reason or "").startswith("demoted:")]
        admitted = [r for r in ok if r not in demoted]
        refused = Counter(r.reject_reason for r in records if r.status == "rejected")
        met = sum(r.slo_met for r in admitted)
        ttfts = [r.ttft_ms for r in admitted if r.ttft_ms is not None]
        demoted_ttfts = [r.ttft_ms for r in demoted if r.ttft_ms is not None]
        objective = slos.get(tier)
        ttft_met = (
            sum(1 for r in admitted if r.ttft_ms is not None and r.ttft_ms < objective[0])
            if objective
            else 0
        )
        tpots = [r.tpot_ms for r in admitted if r.tpot_ms is not None]
        table[tier] = {
            "sent": len(mine),
            "records": len(records),
            "admitted": len(admitted),
            "demoted": len(demoted),
            "shed": sum(refused[r] for r in SHED_REASONS),
            "shed_by_reason": {r: refused[r] for r in SHED_REASONS if refused[r]},
            "refused_other": {k: v for k, v in refused.items() if k not in SHED_REASONS},
            "errors": sum(1 for r in records if r.status == "error"),
            "errors_by_reason": dict(
                Counter(r.reject_reason for r in records if r.status == "error")
            ),
            "cancelled": sum(1 for r in records if r.status == "cancelled"),
            "admitted_within_slo_pct": round(100.0 * met / len(admitted), 1) if admitted else None,
            "admitted_ttft_p50_ms": _round(_pct(ttfts, 50)),
            "admitted_ttft_p99_ms": _round(_pct(ttfts, 99)),
            "admitted_ttft_met_pct": (
                round(100.0 * ttft_met / len(admitted), 1) if admitted else None
            ),
            "admitted_on_time_pct": (
                round(100.0 * sum(_on_time(r) for r in admitted) / len(admitted), 1)
                if admitted
                else None
            ),
            "admitted_tpot_p50_ms": _round(_pct(tpots, 50)),
            "admitted_tpot_p99_ms": _round(_pct(tpots, 99)),
            "demoted_within_slo_pct": (
                round(100.0 * sum(r.slo_met for r in demoted) / len(demoted), 1)
                if demoted
                else None
            ),
            "demoted_ttft_p50_ms": _round(_pct(demoted_ttfts, 50)),
            "client_errors": sum(1 for s in mine if s.error is not None),
            "client_statuses": dict(Counter(str(s.status) for s in mine)),
            "client_outcomes": dict(Counter(s.outcome for s in mine)),
        }
    return table


def _on_time(record: Any) -> bool:
    """Every token by its due time (TTFT + (i - 1) x TPOT from arrival: the deadlines engines
    schedule by, PROSERVE's TDG): its gain is its ideal gain."""
    return bool(record.ideal_gain > 0 and record.gain >= record.ideal_gain * (1 - 1e-9))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 1)


@dataclass
class DrillResult:
    capacity_rps: float
    overload_rps: float
    duration_s: float
    baseline_ttft_ms: float
    tiers: dict[str, dict[str, Any]]
    queue_depth_max: float
    gateway_rss_max_mib: float
    cpu_util: dict[str, float]
    """Cores' worth of CPU each process used during the overload (machine load: others')."""
    engine_step_lag_mean_ms: float | None
    """How far behind their profile's timeline the emulated engines ran (CPU starvation)."""
    load_average: float
    gateway_counters: dict[str, float]
    """The gateway's own count of demotions, SLO refusals, upstream timeouts and breaker
    openings, by label, at the end (the capacity ladder included)."""
    recovery_s: float | None
    probes: list[dict[str, Any]]
    probe_outcomes: dict[str, int]
    """Recovery probes by outcome (HTTP status and reason, or the client-side failure)."""
    capacity_steps: list[dict[str, Any]]
    setup: dict[str, Any]


async def drill(
    servers: Servers, setup: Setup, args: argparse.Namespace
) -> tuple[DrillResult, list[Shot]]:
    rng = np.random.default_rng(setup.seed)
    loader = Loader(servers, setup, rng)
    sampler = Sampler(servers, loader.session)
    try:
        base = await baseline(loader)
        print(f"baseline premium TTFT p50 {base * 1e3:.1f} ms", file=sys.stderr)
        steps: list[dict[str, Any]] = []
        capacity = args.capacity
        if capacity is None:
            capacity, steps = await measure_capacity(
                loader, args.step, args.start_rps, args.factor, args.max_rps
            )
            await asyncio.sleep(2.0)
        rate = args.overload * capacity
        print(
            f"capacity {capacity:.1f} rps; overload {rate:.1f} rps for {args.duration:g} s",
            file=sys.stderr,
        )
        weights = np.array(setup.mix, dtype=float) / sum(setup.mix)

        def pick() -> str:
            return str(TIERS[int(rng.choice(len(TIERS), p=weights))])

        shots: list[Shot] = []
        sampler.start()
        lag_before = await _engine_lag(loader.session, servers.engine_urls)
        cpu_before, started = servers.cpu_seconds(), time.perf_counter()
        stop = await loader.open_loop(rate, args.duration, pick, shots)
        cpu_after = servers.cpu_seconds()
        cpu = {k: round((cpu_after[k] - cpu_before[k]) / (stop - started), 2) for k in cpu_after}
        lag_after = await _engine_lag(loader.session, servers.engine_urls)
        steps_lag = lag_after[1] - lag_before[1]
        lag_ms = (lag_after[0] - lag_before[0]) / steps_lag * 1e3 if steps_lag else None
        load = os.getloadavg()[0]
        probes: list[Shot] = []
        await recovery_probes(loader, args.probe_every, args.probe_for, probes)
        await loader.settle()
        await sampler.stop()
        counters = await _gateway_counters(loader.session, servers.metrics_url)
    finally:
        await sampler.stop()
        await loader.close()
    result = DrillResult(
        capacity_rps=round(capacity, 2),
        overload_rps=round(rate, 2),
        duration_s=args.duration,
        baseline_ttft_ms=round(base * 1e3, 1),
        tiers={},
        queue_depth_max=sampler.queue_max,
        gateway_rss_max_mib=round(sampler.rss_max_mib, 1),
        cpu_util=cpu,
        engine_step_lag_mean_ms=_round(lag_ms),
        load_average=round(load, 2),
        gateway_counters=counters,
        recovery_s=_round(recovery_time(probes, stop, base)),
        probes=[
            {
                "after_s": round(p.sent - stop, 2),
                "ttft_ms": _ms(p.ttft_s),
                "status": p.status,
                "outcome": p.outcome,
            }
            for p in probes
        ],
        probe_outcomes=dict(Counter(p.outcome for p in probes)),
        capacity_steps=steps,
        setup=asdict(setup),
    )
    return result, shots


def run_drill(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tiergate-drill-") as tmp:
        with running_servers(setup, Path(tmp)) as servers:
            result, shots = _run(drill(servers, setup, args))
        # the gateway has stopped: its usage records are all written
        result.tiers = tier_table(shots, servers.db_url)
    return asdict(result)


def _print(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Overload drill: {result['overload_rps']} rps "
        f"({result['overload_rps'] / max(result['capacity_rps'], 1e-9):.1f}x capacity "
        f"{result['capacity_rps']} rps) for {result['duration_s']:g} s"
    )
    columns = (
        "sent",
        "admitted",
        "demoted",
        "shed",
        "refused_other",
        "errors",
        "admitted_within_slo_pct",
        "admitted_ttft_p50_ms",
        "admitted_ttft_p99_ms",
        "demoted_within_slo_pct",
    )
    table.add_column("tier")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    for tier, row in result["tiers"].items():
        table.add_row(tier, *("—" if row[c] is None else str(row[c]) for c in columns))
    console = Console(width=max(Console().width, 160))
    console.print(table)
    console.print(
        f"baseline premium TTFT p50 {result['baseline_ttft_ms']} ms; queue depth max "
        f"{result['queue_depth_max']:g}; gateway RSS max {result['gateway_rss_max_mib']} MiB; "
        f"recovery {result['recovery_s']} s after the load stopped"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="overload seconds")
    parser.add_argument("--overload", type=float, default=10.0, help="multiple of capacity")
    parser.add_argument("--capacity", type=float, help="requests/s; skips measuring it")
    parser.add_argument("--step", type=float, default=6.0, help="seconds per capacity step")
    parser.add_argument("--start-rps", type=float, default=2.0, help="first capacity step")
    parser.add_argument("--factor", type=float, default=1.5, help="rate growth per step")
    parser.add_argument("--max-rps", type=float, default=200.0, help="last capacity step")
    parser.add_argument("--probe-every", type=float, default=0.25)
    parser.add_argument("--probe-for", type=float, default=15.0)
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--profile", default="a100-qwen2-7b")
    parser.add_argument("--slowdown", type=float, default=1.0, help="engines this much slower")
    parser.add_argument("--policy", default="sarathi-priority", help="the emulated engines' policy")
    parser.add_argument("--mix", default="1,1,1", help="premium,standard,batch shares")
    parser.add_argument("--prompt-tokens", default="100,1000", help="uniform range")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--slack", help="shed_slack of premium,standard,batch (default: as seeded)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--role", choices=("engines", "gateway"), help=argparse.SUPPRESS)
    parser.add_argument("--engine-urls", help=argparse.SUPPRESS)
    parser.add_argument("--profile-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is not None:
        return _serve_role(args)
    mix = tuple(float(x) for x in args.mix.split(","))
    low, high = (int(x) for x in args.prompt_tokens.split(","))
    if len(mix) != 3 or low < 1 or high < low:
        parser.error("--mix needs three shares, --prompt-tokens low,high")
    setup = Setup(
        engines=args.engines,
        profile=args.profile,
        slowdown=args.slowdown,
        policy=args.policy,
        mix=(mix[0], mix[1], mix[2]),
        prompt_tokens=(low, high),
        max_tokens=args.max_tokens,
        seed=args.seed,
        slack=tuple(float(x) for x in args.slack.split(",")) if args.slack else None,
    )
    result = run_drill(setup, args)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
