"""Tiergate side by side with the LiteLLM proxy, in front of the same emulated engine.

    python bench/vs_litellm.py --scenario latency --rps R [--duration S] [--pin] [--json]
    python bench/vs_litellm.py --scenario rpm-burst [--burst 200] [--rpm-limit 50] [--json]
    python bench/vs_litellm.py --scenario priority [--priority-rps R] [--duration S] [--json]
    python bench/vs_litellm.py --scenario all --json

LiteLLM (``LITELLM_VERSION``) lives in a virtual environment of its own,
``bench/.venvs/litellm-<version>``, built by ``bench/litellm/setup.sh`` (run here when missing;
without it, or if it cannot be built, the bench says so and skips). It proxies to the emulated
engine as a ``hosted_vllm/`` deployment and authenticates one key through a ``custom_auth`` hook
that returns the key's record (with its ``rpm_limit``) — what a virtual key resolves to. Its
database-backed virtual keys need Prisma, whose engines download at run time from a host this
machine cannot reach; the rate limiting and everything after authentication is LiteLLM's own code
either way. Multi-worker limits use its ``coordination_redis`` on 127.0.0.1:6379, Redis database
``LITELLM_REDIS_DB``; tiergate's use the same Redis under a prefix of their own.

Scenarios (``--scenario all`` runs the three in turn):

``latency``
    One emulated engine, one tiergate gateway and one LiteLLM proxy (``--latency-workers``
    worker processes each, default 1; ``--pin`` puts both proxies on the last CPU); one
    open-loop Poisson stream at ``--rps`` whose arrivals go, in blocks of ``--block`` seconds,
    straight to the engine, through tiergate or through LiteLLM (each triple of blocks in an
    order drawn at random), so all three paths share the machine's noise and the engine always
    sees ``--rps``. Every request streams a ``--max-tokens`` chat completion. Added TTFT at a
    percentile = the path's percentile minus the direct path's, in the same run. CPU per request
    = the proxy's CPU time over the measured window over the requests it carried. The load
    generator, servers and statistics are ``bench/gateway_overhead.py``'s.

``rpm-burst``
    ``--burst`` non-streamed requests released at once with one key limited to ``--rpm-limit``
    requests per minute, ``--bursts`` times with a fresh key each; then the minute's edge: one
    request, a burst ``--edge`` s before a minute has passed since it and another ``--edge`` s
    after (a sliding window still counts the first burst then; a window fixed at the first
    request has started afresh). Each system runs as ``--workers`` processes sharing Redis,
    every burst split evenly between them: tiergate gateways with its Redis limiter, LiteLLM
    proxies with its coordination Redis (separate processes rather than ``--num_workers``, so
    the split is known: behind one socket the kernel may give one worker a whole burst).
    Admitted (HTTP 200) against the limit; exact = equal.

``priority``
    Overload: ``--priority-rps`` streamed requests per second with 1,500-token prompts (24,
    about 2x what the engine serves: ~11/s) for ``--duration`` s, ``--premium-share`` of them
    premium, the rest standard: tiergate's default tiers (weights, shed slack) with the SLOs
    ``--premium-slo`` / ``--standard-slo`` (TTFT 1 s / TPOT 100 ms, 2 s / 200 ms; see
    ``DEFAULT_SLOS``). Run in turn: LiteLLM (premium ``priority`` 0, standard 100, its request
    prioritization queue) before a stock FCFS engine (``vllm-v1``); tiergate (premium and
    standard tenants) before the same FCFS engine; and tiergate before an engine running its
    own policy (``slide``). Per tier: sent, served, refused, and SLO attainment (TTFT and mean
    TPOT below the SLO, ``priority.gain.slo_attained``) over all sent and over those served.

The numbers are only as quiet as the machine: on a shared one, read the ratios (the paths of
``latency`` alternate second by second, so they share the noise) rather than absolute values.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # not first: bench/litellm/ is no package
import alternating as alt  # paths side by side in alternating blocks
import gateway_overhead as go  # the sibling bench: servers, load, statistics
import peer_process as peer  # the peer proxy as a child process

LITELLM_VERSION = "1.108.0"
REPO = Path(__file__).resolve().parents[1]
SETUP_SCRIPT = REPO / "bench" / "litellm" / "setup.sh"
LITELLM_VENV = REPO / "bench" / ".venvs" / f"litellm-{LITELLM_VERSION}"
LITELLM_REDIS_DB = 11
"""Redis database number of LiteLLM's coordination Redis here (tiergate uses db 0, prefixed)."""
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
AUTH_MODULE = "tiergate_bench_auth"
LITELLM_STARTUP_TIMEOUT_S = 120.0
"""LiteLLM imports for several seconds, longer on a busy machine."""
PATHS = ("direct", "tiergate", "litellm")
REQUIRED_KEYS = (
    "rps",
    "requests",
    "tiergate_added_ttft_p50_ms",
    "tiergate_added_ttft_p99_ms",
    "litellm_added_ttft_p50_ms",
    "litellm_added_ttft_p99_ms",
    "tiergate_errors",
    "litellm_errors",
    "tiergate_cpu_ms_per_request",
    "litellm_cpu_ms_per_request",
)
PREMIUM_PRIORITY, STANDARD_PRIORITY = 0, 100
"""LiteLLM's request priorities (lower is served first)."""


class LiteLLMUnavailable(RuntimeError):
    """LiteLLM's environment is missing and could not be built: the bench skips."""


# ---- LiteLLM: environment, configuration, process ------------------------------------------


def ensure_litellm(build: bool = True) -> Path:
    """The LiteLLM venv, built by ``setup.sh`` when missing (``build``); else unavailable."""
    stamp = LITELLM_VENV / ".tiergate-stamp"
    if build:
        done = subprocess.run(
            ["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            tail = "\n  ".join(done.stderr.strip().splitlines()[-5:])
            raise LiteLLMUnavailable(
                f"bench/litellm/setup.sh failed (exit {done.returncode}):\n  {tail}"
            )
    if not stamp.is_file() or not (LITELLM_VENV / "bin" / "litellm").is_file():
        raise LiteLLMUnavailable(
            f"no LiteLLM environment at {LITELLM_VENV}: run bench/litellm/setup.sh"
        )
    return LITELLM_VENV


@dataclass(frozen=True)
class LiteLLMConfig:
    """What the bench asks of LiteLLM: one deployment, the keys it accepts, where limits live."""

    engine_url: str
    keys: dict[str, int | None]
    """Key → its requests-per-minute limit (None: unlimited)."""
    model: str = go.MODEL
    redis_db: int | None = None
    """Coordination Redis database (cross-worker limits); None: in-process only."""
    master_key: str = field(default_factory=lambda: f"sk-master-{secrets.token_hex(8)}")


def key_token(key: str) -> str:
    """The hashed token LiteLLM keys its rate-limit counters by (as it hashes virtual keys)."""
    return hashlib.sha256(key.encode()).hexdigest()


def write_litellm_config(directory: Path, config: LiteLLMConfig) -> Path:
    """``config.yaml`` (JSON, which is YAML) and the ``custom_auth`` module beside it."""
    general: dict[str, Any] = {
        "master_key": config.master_key,
        "custom_auth": f"{AUTH_MODULE}.user_api_key_auth",
        "disable_spend_logs": True,
    }
    if config.redis_db is not None:
        general["coordination_redis"] = {
            "host": REDIS_HOST,
            "port": REDIS_PORT,
            "db": config.redis_db,
        }
    document = {
        "model_list": [
            {
                "model_name": config.model,
                "litellm_params": {
                    "model": f"hosted_vllm/{config.model}",
                    "api_base": f"{config.engine_url}/v1",
                    "api_key": "unused",
                },
            }
        ],
        "litellm_settings": {"drop_params": True, "set_verbose": False, "request_timeout": 600},
        "router_settings": {"routing_strategy": "simple-shuffle"},
        "general_settings": general,
    }
    path = directory / "config.yaml"
    path.write_text(json.dumps(document, indent=2) + "\n")
    keys = {key_token(k): v for k, v in config.keys.items()}
    (directory / f"{AUTH_MODULE}.py").write_text(_AUTH_SOURCE.format(keys=repr(keys)))
    return path


_AUTH_SOURCE = '''\
"""custom_auth of the tiergate bench: the record a LiteLLM virtual key resolves to.

The ``rpm_limit`` on the returned ``UserAPIKeyAuth`` is enforced by LiteLLM's own rate
limiter, as for a database-backed virtual key.
"""

import hashlib
import hmac

try:
    from litellm.proxy._types import UserAPIKeyAuth
except ImportError:  # outside LiteLLM's environment (the bench's own tests): the plain record
    UserAPIKeyAuth = dict

KEYS = {keys}
"""sha256(key) -> requests-per-minute limit (None: unlimited)."""


async def user_api_key_auth(request, api_key):
    token = hashlib.sha256(api_key.encode()).hexdigest()
    for known, rpm_limit in KEYS.items():
        if hmac.compare_digest(known, token):
            return UserAPIKeyAuth(
                api_key=token, token=token, key_alias="bench", rpm_limit=rpm_limit
            )
    raise ValueError("invalid key")
'''


@contextlib.contextmanager
def running_litellm(
    venv: Path, config: LiteLLMConfig, *, workers: int = 1, cpus: set[int] | None = None
) -> Iterator[peer.PeerProcess]:
    """The LiteLLM proxy on a free port until the block ends (its whole process group)."""
    with tempfile.TemporaryDirectory(prefix="tiergate-litellm-") as tmp:
        config_path = write_litellm_config(Path(tmp), config)
        port = go._free_port()
        env = dict(os.environ)
        env.update(
            LITELLM_LOCAL_MODEL_COST_MAP="True",  # never fetch the cost map from the internet
            LITELLM_LOG="ERROR",
            NO_PROXY="127.0.0.1,localhost",
            PYTHONPATH=tmp,  # the custom_auth module, in every worker
        )
        command = [
            str(venv / "bin" / "litellm"),
            *("--config", str(config_path), "--host", "127.0.0.1", "--port", str(port)),
            *("--num_workers", str(workers)),
        ]
        ready = peer.ReadyCheck(
            "LiteLLM",
            config.model,
            LITELLM_STARTUP_TIMEOUT_S,
            headers={"authorization": f"Bearer {next(iter(config.keys))}"},
            poll_s=0.5,
        )
        with peer.running_peer(
            command,
            port=port,
            ready=ready,
            log_path=Path(tmp) / "litellm.log",
            cpus=cpus,
            env=env,
            cwd=Path(tmp),
        ) as server:
            yield server


# ---- tiergate beside it: seeding, extra gateway processes -----------------------------------


def _seed(url: str, tiers: Sequence[dict[str, Any]], tenants: dict[str, str]) -> dict[str, str]:
    """Tiers (``create_tier`` arguments) and tenants (name → tier); a key per tenant."""
    from gateway.db import crud
    from gateway.db.models import Base
    from gateway.db.session import make_engine, make_session_factory

    engine = make_engine(url)
    try:
        Base.metadata.create_all(engine)
        with make_session_factory(engine).begin() as session:
            for tier in tiers:
                crud.create_tier(session, actor="bench", **tier)
            keys = {}
            for name, tier_name in tenants.items():
                crud.create_tenant(session, actor="bench", name=name, tier=tier_name)
                keys[name] = crud.create_key(
                    session, actor="bench", tenant=name, secret=go.SECRET
                ).plaintext
            return keys
    finally:
        engine.dispose()


@dataclass
class Fleet:
    """Child processes (an engine, gateways) and their URLs."""

    engine_url: str
    gateway_urls: list[str]
    processes: list[subprocess.Popen[bytes]]


@contextlib.contextmanager
def running_fleet(
    tmp: Path,
    db_url: str,
    *,
    policy: str,
    gateways: int,
    profile: str,
    time_scale: float,
    redis_prefix: str | None = None,
    seed: int = 0,
) -> Iterator[Fleet]:
    """An engine and ``gateways`` tiergate processes on one database (and Redis, if prefixed)."""
    env = dict(os.environ)
    env.update(TIERGATE_DATABASE_URL=db_url, TIERGATE_SECRET=go.SECRET, TIERGATE_DATA_DIR=str(tmp))
    env.pop("TIERGATE_REDIS_URL", None)
    if redis_prefix is not None:
        env.update(
            TIERGATE_REDIS_URL=f"redis://{REDIS_HOST}:{REDIS_PORT}/0",
            TIERGATE_REDIS_PREFIX=redis_prefix,
        )
    procs: list[subprocess.Popen[bytes]] = []
    log_path = tmp / "fleet.log"
    log = log_path.open("wb")
    try:
        engine_args = ["--role", "engine", "--profile", profile, "--policy", policy]
        engine_args += ["--time-scale", str(time_scale), "--seed", str(seed)]
        engine, engine_port = go._spawn(engine_args, env, log)
        procs.append(engine)
        engine_url = f"http://127.0.0.1:{engine_port}"
        urls = []
        for _ in range(gateways):
            metrics = {"TIERGATE_METRICS_ADDR": f"127.0.0.1:{go._free_port()}"}
            gateway, port = go._spawn(
                ["--role", "gateway", "--engine-url", engine_url, "--profile", profile],
                {**env, **metrics},
                log,
            )
            procs.append(gateway)
            urls.append(f"http://127.0.0.1:{port}")
            go._wait_ready(urls[-1])
        yield Fleet(engine_url, urls, procs)
    finally:
        for proc in reversed(procs):
            go._stop(proc)
        log.close()
        go._report_server_log(log_path, tail=6)


# ---- latency: three paths, alternating blocks ----------------------------------------------

PathSample = alt.PathSample
LatencyRun = alt.AlternatingRun


def summarize_latency(run: LatencyRun, rps: float, rng: np.random.Generator) -> dict[str, Any]:
    """The required keys first, then per-path detail (:func:`alternating.path_summary`)."""
    detail = alt.path_summary(run, ("tiergate", "litellm"), rng)
    out: dict[str, Any] = {"rps": rps, "requests": len(run.samples)}
    out.update({key: detail[key] for key in REQUIRED_KEYS[2:]})
    out.update(detail)
    out["litellm_version"] = LITELLM_VERSION
    return alt.round_nested(out)


def run_latency(venv: Path, args: argparse.Namespace) -> dict[str, Any]:
    setup = go.Setup(
        max_tokens=args.max_tokens,
        block_s=args.block,
        warmup_s=args.warmup,
        seed=args.seed,
        pin=args.pin,
        workers=args.latency_workers,
    )
    rng = np.random.default_rng([args.seed, int(args.rps * 1000)])
    with go.running_servers(setup) as servers:
        cpus = sorted(os.sched_getaffinity(servers.processes[1].pid))
        config = LiteLLMConfig(servers.engine_url, {_new_key(): None})
        pin = set(cpus) if args.pin else None  # beside tiergate's gateway, on its CPU
        workers = args.latency_workers
        with running_litellm(venv, config, workers=workers, cpus=pin) as lite:
            body = _chat_body(go.PROMPT, args.max_tokens)
            json_type = {"content-type": "application/json"}
            path = "/v1/chat/completions"
            clients = {
                "direct": go.SseClient(servers.engine_url, path, json_type, body),
                "tiergate": go.SseClient(servers.gateway_url, path, _auth(servers.api_key), body),
                "litellm": go.SseClient(lite.url, path, _auth(next(iter(config.keys))), body),
            }
            cpu = {
                "engine": lambda: servers.cpu_seconds()["engine"],
                "tiergate": lambda: servers.cpu_seconds()["gateway"],  # with its workers
                "litellm": lite.cpu_seconds,
                "client": time.process_time,
            }
            run = go._run(alt.alternating_load(clients, cpu, args.rps, args.duration, setup, rng))
    return {**summarize_latency(run, args.rps, rng), "workers": workers, "pinned": args.pin}


def _new_key() -> str:
    return f"sk-bench-{secrets.token_hex(12)}"


def _auth(key: str) -> dict[str, str]:
    return {"content-type": "application/json", "authorization": f"Bearer {key}"}


def _chat_body(prompt: str, max_tokens: int, **extra: Any) -> bytes:
    body = {
        "model": go.MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        **extra,
    }
    return json.dumps(body).encode()


# ---- rpm-burst: admitted against the limit, two workers each -------------------------------


async def fire_burst(urls: Sequence[str], key: str, size: int) -> Counter[int]:
    """``size`` non-streamed requests released together, spread over ``urls``; their statuses
    (0 for a transport error)."""
    body = {"model": go.MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    gate = asyncio.Event()
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:

        async def one(url: str) -> int:
            await gate.wait()
            try:
                answer = await client.post(
                    f"{url}/v1/chat/completions", json=body, headers=_auth(key)
                )
            except httpx.HTTPError:
                return 0
            return answer.status_code

        tasks = [asyncio.ensure_future(one(urls[i % len(urls)])) for i in range(size)]
        await asyncio.sleep(0.05)  # every task waiting at the gate
        gate.set()
        return Counter(await asyncio.gather(*tasks))


def _burst_row(statuses: Counter[int], limit: int) -> dict[str, Any]:
    admitted, limited = statuses.get(200, 0), statuses.get(429, 0)
    return {
        "admitted": admitted,
        "limited": limited,
        "other": sum(statuses.values()) - admitted - limited,
        "over_limit": admitted - limit,
        "exact": admitted == limit,
    }


WINDOW_S = 60.0
"""Both systems' limits are per minute."""


async def window_edge(
    targets: dict[str, tuple[Sequence[str], str]], size: int, edge_s: float
) -> dict[str, list[int]]:
    """Per system (URLs, key): one request, then a burst ``edge_s`` s before a minute has
    passed and another ``edge_s`` s after; the admitted count of each. Both systems at once.

    A sliding window still counts the first burst when the second comes; a window fixed at
    the first request has started afresh by then."""

    async def one_system(urls: Sequence[str], key: str) -> list[int]:
        t0 = time.monotonic()
        admitted = [(await fire_burst(urls, key, 1)).get(200, 0)]
        for at in (WINDOW_S - edge_s, WINDOW_S + edge_s):
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            admitted.append((await fire_burst(urls, key, size)).get(200, 0))
        return admitted

    names = list(targets)
    counts = await asyncio.gather(*(one_system(*targets[name]) for name in names))
    return dict(zip(names, counts, strict=True))


def _edge_row(admitted: list[int], limit: int) -> dict[str, Any]:
    first, before, after = admitted
    most = max(first + before, before + after)  # the bursts are 2 * edge_s apart
    return {
        "first": first,
        "before_minute": before,
        "after_minute": after,
        "max_in_a_minute": most,
        "exact": most == limit,
    }


def run_rpm_burst(venv: Path, args: argparse.Namespace) -> dict[str, Any]:
    """200-way bursts with a fresh key each, then the edge of the minute, on both systems."""
    limit, size, bursts, workers = args.rpm_limit, args.burst, args.bursts, args.workers
    tier = {
        "name": "limited",
        "weight": 1.0,
        "ttft_ms": 60_000.0,
        "tpot_ms": 10_000.0,
        "rpm_limit": limit,
        "best_effort_allowed": True,
    }
    rows: dict[str, list[dict[str, Any]]] = {"tiergate": [], "litellm": []}
    tenants = [f"burst{i}" for i in range(bursts)] + ["edge"]
    with tempfile.TemporaryDirectory(prefix="tiergate-vs-litellm-") as tmp_name:
        tmp = Path(tmp_name)
        db_url = f"sqlite:///{tmp / 'tiergate.db'}"
        keys = _seed(db_url, [tier], dict.fromkeys(tenants, "limited"))
        lite_keys = {name: _new_key() for name in tenants}
        warm = _new_key()  # LiteLLM's start-up probe: its own key, so no limited key is spent
        with running_fleet(
            tmp,
            db_url,
            policy="vllm-v1",
            gateways=workers,
            profile=args.profile,
            time_scale=go.DEFAULT_TIME_SCALE,
            redis_prefix=f"tiergate-bench-{secrets.token_hex(4)}",
        ) as fleet:
            config = LiteLLMConfig(
                fleet.engine_url,
                {warm: None, **dict.fromkeys(lite_keys.values(), limit)},
                redis_db=LITELLM_REDIS_DB,
            )
            with contextlib.ExitStack() as stack:
                lites = [stack.enter_context(running_litellm(venv, config)) for _ in range(workers)]
                targets = {
                    "tiergate": (fleet.gateway_urls, keys),
                    "litellm": ([lite.url for lite in lites], lite_keys),
                }
                for name in tenants[:-1]:
                    for system, (urls, system_keys) in targets.items():
                        statuses = go._run(fire_burst(urls, system_keys[name], size))
                        rows[system].append(_burst_row(statuses, limit))
                edge = go._run(
                    window_edge(
                        {system: (urls, k["edge"]) for system, (urls, k) in targets.items()},
                        size,
                        args.edge,
                    )
                )
    edges = {system: _edge_row(counts, limit) for system, counts in edge.items()}
    out: dict[str, Any] = {"rpm_limit": limit, "burst": size, "workers": workers}
    for system in ("tiergate", "litellm"):
        out[f"{system}_admitted"] = [r["admitted"] for r in rows[system]]
        out[f"{system}_exact"] = all(r["exact"] for r in rows[system])
        out[f"{system}_minute_edge"] = edges[system]
    out.update(
        {
            "tiergate": rows["tiergate"],
            "litellm": rows["litellm"],
        }
    )
    return out


# ---- priority under overload: SLO attainment per tier --------------------------------------

DEFAULT_PRIORITY_RUNS = "litellm+vllm-v1,tiergate+vllm-v1,tiergate+slide"
DEFAULT_SLOS = {"premium": "1000,100", "standard": "2000,200"}
"""TTFT,TPOT ms per tier: the default tiers' TTFT; their TPOT (50 / 100 ms) doubled, since an
engine that interleaves this load's 1,500-token prefills steps every ~40-60 ms even near
capacity (premium mean TPOT p99 58 ms at 1.1x, measured), so 50 ms is out of reach for any
gateway. LiteLLM's requests are judged by the same objectives as tiergate's."""


@dataclass
class TierSample(go.Sample):
    tier: str = "standard"


async def tiered_load(
    clients: dict[str, go.SseClient],
    rps: float,
    duration_s: float,
    premium_share: float,
    rng: np.random.Generator,
) -> list[TierSample]:
    """Open-loop Poisson arrivals, each premium with probability ``premium_share``."""
    samples: list[TierSample] = []
    streams = alt.Launched()
    try:
        async for scheduled, _ in alt.poisson_arrivals(rps, duration_s, rng):
            tier = "premium" if rng.random() < premium_share else "standard"
            sample = TierSample(True, scheduled, tier=tier)
            samples.append(sample)
            streams.start(clients[tier].stream(sample, timeout_s=120.0))
        await streams.wait()
    finally:
        for client in clients.values():
            await client.aclose()
    return samples


def parse_slo(text: str) -> tuple[float, float]:
    """``"TTFT_MS,TPOT_MS"`` as seconds."""
    ttft_ms, tpot_ms = (float(v) for v in text.split(","))
    return ttft_ms / 1e3, tpot_ms / 1e3


def summarize_tiers(
    samples: Sequence[TierSample], slos: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    """Per tier: sent, served, refused (HTTP 429/503), failed otherwise, SLO attainment."""
    from priority.gain import slo_attained
    from priority.request import SLO

    out: dict[str, Any] = {}
    for tier, (ttft_s, tpot_s) in slos.items():
        mine = [s for s in samples if s.tier == tier]
        served = [s for s in mine if s.error is None and s.first is not None]
        refused = sum(s.error in ("HTTP 429", "HTTP 503") for s in mine)
        failures = Counter(s.error or "no content" for s in mine if s not in served)
        slo = SLO(ttft_s=ttft_s, tpot_s=tpot_s)
        attained = sum(
            slo_attained(s.start, slo, _token_times(s)) for s in served if s.first is not None
        )
        ttft = np.array([(s.first - s.start) * 1e3 for s in served if s.first is not None])
        tpot = np.array([np.mean(s.gaps) * 1e3 for s in served if s.gaps])
        out[tier] = {
            "sent": len(mine),
            "served": len(served),
            "refused": refused,
            "failed": len(mine) - len(served) - refused,
            "attained": attained,
            "attainment_of_sent": attained / len(mine) if mine else math.nan,
            "attainment_of_served": attained / len(served) if served else math.nan,
            "ttft_p50_ms": go._pct(ttft, 50),
            "ttft_p99_ms": go._pct(ttft, 99),
            "tpot_p50_ms": go._pct(tpot, 50),
            "tpot_p99_ms": go._pct(tpot, 99),
            "failures": dict(failures),
        }
    return alt.round_nested(out)


def _token_times(sample: go.Sample) -> list[float]:
    assert sample.first is not None
    times = [sample.first]
    for gap in sample.gaps:
        times.append(times[-1] + gap)
    return times


def run_priority(venv: Path, args: argparse.Namespace) -> dict[str, Any]:
    from gateway.db.seed import DEFAULT_TIERS

    prompt = ("Summarise the following report carefully. " * 200)[: args.priority_prompt_chars]
    slos = {"premium": parse_slo(args.premium_slo), "standard": parse_slo(args.standard_slo)}
    tiers = []
    for spec in DEFAULT_TIERS:  # the default tiers (weights, shed slack) with the bench's SLOs
        if spec["name"] in slos:
            ttft_s, tpot_s = slos[spec["name"]]
            tiers.append({**spec, "ttft_ms": ttft_s * 1e3, "tpot_ms": tpot_s * 1e3})
    runs: dict[str, Any] = {}
    for run_name in args.priority_runs.split(","):
        system, _, policy = run_name.partition("+")
        if system not in ("tiergate", "litellm") or not policy:
            raise SystemExit(f"--priority-runs: {run_name!r} is not tiergate+POLICY/litellm+POLICY")
        rng = np.random.default_rng([args.seed, 7])  # the same arrivals and tiers for every run
        with tempfile.TemporaryDirectory(prefix="tiergate-vs-litellm-") as tmp_name:
            tmp = Path(tmp_name)
            db_url = f"sqlite:///{tmp / 'tiergate.db'}"
            keys = _seed(db_url, tiers, {"prem": "premium", "std": "standard"})
            path = "/v1/chat/completions"
            with running_fleet(
                tmp,
                db_url,
                policy=policy,
                gateways=1 if system == "tiergate" else 0,
                profile=args.profile,
                time_scale=args.priority_time_scale,
            ) as fleet:
                body = {"max_tokens": args.priority_max_tokens}
                if system == "tiergate":
                    url = fleet.gateway_urls[0]
                    clients = {
                        tier: go.SseClient(url, path, _auth(keys[name]), _chat_body(prompt, **body))
                        for tier, name in (("premium", "prem"), ("standard", "std"))
                    }
                    samples = go._run(
                        tiered_load(
                            clients, args.priority_rps, args.duration, args.premium_share, rng
                        )
                    )
                else:
                    key = _new_key()
                    config = LiteLLMConfig(fleet.engine_url, {key: None})
                    with running_litellm(venv, config) as lite:
                        clients = {
                            tier: go.SseClient(
                                lite.url,
                                path,
                                _auth(key),
                                _chat_body(prompt, priority=prio, **body),
                            )
                            for tier, prio in (
                                ("premium", PREMIUM_PRIORITY),
                                ("standard", STANDARD_PRIORITY),
                            )
                        }
                        samples = go._run(
                            tiered_load(
                                clients, args.priority_rps, args.duration, args.premium_share, rng
                            )
                        )
        runs[f"{system}+{policy}"] = summarize_tiers(samples, slos)
    return {
        "rps": args.priority_rps,
        "duration_s": args.duration,
        "premium_share": args.premium_share,
        "prompt_chars": args.priority_prompt_chars,
        "max_tokens": args.priority_max_tokens,
        "engine_time_scale": args.priority_time_scale,
        "slo_ms": {tier: [v * 1e3 for v in slo] for tier, slo in slos.items()},
        "premium_attainment": {k: v["premium"]["attainment_of_sent"] for k, v in runs.items()},
        "runs": runs,
    }


# ---- command line -------------------------------------------------------------------------

SCENARIOS = ("latency", "rpm-burst", "priority")


def _print_latency(row: dict[str, Any]) -> None:
    def ms(key: str) -> str:
        value = row.get(key)
        return "—" if value is None else f"{value:.2f}"

    print(f"latency at {row['rps']:g} req/s, {row['requests']} requests {row['path_requests']}")
    print(f"  direct TTFT p50/p99: {ms('direct_ttft_p50_ms')} / {ms('direct_ttft_p99_ms')} ms")
    for path in ("tiergate", "litellm"):
        print(
            f"  {path:8}  added TTFT p50/p99 {ms(f'{path}_added_ttft_p50_ms')} / "
            f"{ms(f'{path}_added_ttft_p99_ms')} ms (p99 95% CI "
            f"{row[f'{path}_added_ttft_p99_ci95_ms']}), errors {row[f'{path}_errors']}, "
            f"CPU {ms(f'{path}_cpu_ms_per_request')} ms/request"
        )
    if row["error_kinds"]:
        print(f"  errors: {row['error_kinds']}")


def _print_burst(row: dict[str, Any]) -> None:
    print(
        f"rpm-burst: {row['burst']} requests at once, limit {row['rpm_limit']}/min, "
        f"{row['workers']} workers each"
    )
    for system in ("tiergate", "litellm"):
        edge = row[f"{system}_minute_edge"]
        print(
            f"  {system:8}  admitted per burst {row[f'{system}_admitted']} "
            f"(exact: {row[f'{system}_exact']}); at the minute's edge: "
            f"{edge['first']} + {edge['before_minute']} before, {edge['after_minute']} after, "
            f"at most {edge['max_in_a_minute']} in a minute (exact: {edge['exact']})"
        )


def _print_priority(row: dict[str, Any]) -> None:
    print(
        f"priority under overload: {row['rps']:g} req/s for {row['duration_s']:g} s, "
        f"{row['premium_share']:.0%} premium"
    )
    for name, tiers in row["runs"].items():
        for tier, t in tiers.items():
            print(
                f"  {name:18} {tier:8} sent {t['sent']:5} served {t['served']:5} "
                f"refused {t['refused']:5} failed {t['failed']:4} "
                f"SLO met {t['attained']:5} ({t['attainment_of_sent']:.1%} of sent, "
                f"{t['attainment_of_served']:.1%} of served), TTFT p50/p99 "
                f"{t['ttft_p50_ms']} / {t['ttft_p99_ms']} ms, mean TPOT p50/p99 "
                f"{t['tpot_p50_ms']} / {t['tpot_p99_ms']} ms"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="latency")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--no-setup", action="store_true", help="never build LiteLLM's venv")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    parser.add_argument("--profile", default="a100-qwen2-7b", help="emulated engine's profile")
    latency = parser.add_argument_group("latency")
    latency.add_argument("--rps", type=float, default=10.0, help="request rate of all paths")
    latency.add_argument("--block", type=float, default=1.0, help="seconds per block of a path")
    latency.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds first")
    latency.add_argument("--max-tokens", type=int, default=16)
    latency.add_argument("--pin", action="store_true", help="both proxies on the last CPU")
    latency.add_argument(
        "--latency-workers",
        type=int,
        default=1,
        help="worker processes of each proxy (tiergate --workers, LiteLLM --num_workers)",
    )
    burst = parser.add_argument_group("rpm-burst")
    burst.add_argument("--burst", type=int, default=200, help="requests released at once")
    burst.add_argument("--bursts", type=int, default=3, help="bursts, each with a fresh key")
    burst.add_argument("--rpm-limit", type=int, default=50, help="the key's requests/minute")
    burst.add_argument("--workers", type=int, default=2, help="gateway processes per system")
    burst.add_argument(
        "--edge", type=float, default=3.0, help="seconds either side of the minute's end"
    )
    prio = parser.add_argument_group("priority")
    prio.add_argument("--priority-rps", type=float, default=24.0, help="overload rate")
    prio.add_argument("--premium-share", type=float, default=0.3)
    prio.add_argument("--priority-prompt-chars", type=int, default=6000)
    prio.add_argument("--priority-max-tokens", type=int, default=64)
    prio.add_argument(
        "--priority-time-scale", type=float, default=1.0, help="emulated engine's speed"
    )
    prio.add_argument("--premium-slo", default=DEFAULT_SLOS["premium"], help="TTFT,TPOT ms")
    prio.add_argument("--standard-slo", default=DEFAULT_SLOS["standard"], help="TTFT,TPOT ms")
    prio.add_argument(
        "--priority-runs",
        default=DEFAULT_PRIORITY_RUNS,
        help="comma-separated SYSTEM+ENGINE_POLICY, run in turn",
    )
    args = parser.parse_args(argv)

    try:
        venv = ensure_litellm(build=not args.no_setup)
    except LiteLLMUnavailable as exc:
        message = f"skipped: LiteLLM {LITELLM_VERSION} is unavailable: {exc}"
        print(message, file=sys.stderr)
        if args.json:
            print(json.dumps({"skipped": message}))
        return 0
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    runners = {"latency": run_latency, "rpm-burst": run_rpm_burst, "priority": run_priority}
    printers = {"latency": _print_latency, "rpm-burst": _print_burst, "priority": _print_priority}
    results: dict[str, Any] = {}
    for name in scenarios:
        results[name] = runners[name](venv, args)
        if not args.json:
            printers[name](results[name])
    if args.json:
        json.dump(
            results if args.scenario == "all" else results[args.scenario], sys.stdout, indent=2
        )
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
