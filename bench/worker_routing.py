"""Does routing hold up across gateway workers? The load split and latency, 1 worker vs N.

    python bench/worker_routing.py [--workers 1,2] [--rps R] [--duration S] [--max-tokens N]
        [--prompt-chars C] [--profiles 910b-qwen2-7b,a100-qwen2-7b] [--scrape-interval S] [--json]

Each worker routes with its own view: the requests it dispatched itself (exact), the other
workers' queued prefills as they publish them (``gateway/app/shared_queue.py``: a shared-memory
table under ``--workers N``), and what each engine's ``/metrics`` said at the last scrape (every
``TIERGATE_SCRAPE_INTERVAL_S``), which counts the rest of the other workers' requests as the
engine's own load (:meth:`BackendPool.reconcile`). Whether that is enough is measured here:
two emulated engines of different speed (child processes, registered as backends),
``tiergate serve --no-emulated --workers N`` in front of them, and one open-loop Poisson load of
streamed chat requests. For each N, on fresh engines: the share of
requests each backend served (from the usage records), TTFT at the client (p50, p99), the
gateway's own TTFT and SLO attainment per backend (usage records), and errors. If N workers
split the load as one does and their latency matches, per-worker routing state is enough.

``--json`` prints a list, one object per worker count: ``{"workers", "rps", "requests",
"errors", "error_kinds", "ttft_p50_ms", "ttft_p99_ms", "slo_met", "backends": {name: {"share",
"requests", "ttft_p50_ms", "ttft_p99_ms", "slo_met"}}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import Sample, SseClient  # the same lean SSE client

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench-model"
SECRET = "worker-routing-bench-secret"
STARTUP_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode})")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not become ready")


def _prepare(db_url: str, engines: list[tuple[str, str]]) -> str:
    """Schema, default tiers, a tenant on the standard tier and its key, the backends."""
    from gateway.db import crud, migrate
    from gateway.db.seed import seed_defaults
    from gateway.db.session import make_engine, make_session_factory

    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with make_session_factory(engine).begin() as session:
            seed_defaults(session, actor="bench")
            crud.create_tenant(session, actor="bench", name="bench", tier="standard")
            for i, (profile, url) in enumerate(engines):
                crud.create_backend(
                    session,
                    actor="bench",
                    name=f"{i}-{profile}",
                    base_url=url,
                    model=MODEL,
                    profile=profile,
                    kind="emulated",
                )
            return crud.create_key(session, actor="bench", tenant="bench", secret=SECRET).plaintext
    finally:
        engine.dispose()


@contextlib.contextmanager
def _fleet(
    tmp: Path, profiles: list[str], workers: int, log: Any, scrape_s: float | None = None
) -> Iterator[tuple[str, str, Path]]:
    """Fresh engines and ``tiergate serve --workers N`` in front; yields (gateway, key, db)."""
    procs: list[subprocess.Popen[bytes]] = []
    run = tmp / f"workers-{workers}"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")}
    try:
        engines = []
        for seed, profile in enumerate(profiles):
            port = _free_port()
            cmd = ["engine-sim", "--profile", profile, "--policy", "slide", "--model", MODEL]
            cmd += ["--port", str(port), "--seed", str(seed), "--log-level", "warning"]
            procs.append(
                subprocess.Popen([sys.executable, "-m", "tiergate_cli", *cmd], cwd=ROOT, stderr=log)
            )
            engines.append((profile, f"http://127.0.0.1:{port}"))
            _wait(f"{engines[-1][1]}/metrics", f"engine {profile}", procs[-1])
        db = run / "tiergate.db"
        key = _prepare(f"sqlite:///{db}", engines)
        port = _free_port()
        env.update(
            TIERGATE_DATABASE_URL=f"sqlite:///{db}",
            TIERGATE_SECRET=SECRET,
            TIERGATE_DATA_DIR=str(run),
        )
        if scrape_s is not None:
            env["TIERGATE_SCRAPE_INTERVAL_S"] = str(scrape_s)
        cmd = ["serve", "--no-emulated", "--workers", str(workers), "--port", str(port)]
        cmd += ["--metrics-addr", f"127.0.0.1:{_free_port()}", "--log-level", "warning"]
        gateway = subprocess.Popen(
            [sys.executable, "-m", "tiergate_cli", *cmd],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        procs.append(gateway)
        url = f"http://127.0.0.1:{port}"
        _wait(f"{url}/health/readiness", "gateway", gateway)
        yield url, key, db
        gateway.send_signal(signal.SIGTERM)  # drain: every usage record written
        if gateway.wait(timeout=120) != 0:
            raise RuntimeError(f"the gateway exited with {gateway.returncode}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)


async def _load(url: str, key: str, args: argparse.Namespace) -> list[Sample]:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x" * args.prompt_chars}],
            "max_tokens": args.max_tokens,
            "stream": True,
        }
    ).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    client = SseClient(url, "/v1/chat/completions", headers, body)
    rng = np.random.default_rng(args.seed)
    samples: list[Sample] = []
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()
    offset = float(rng.exponential(1.0 / args.rps))
    try:
        while offset < args.duration:
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sample = Sample(True, t0 + offset)
            samples.append(sample)
            task = asyncio.ensure_future(client.stream(sample, timeout_s=120.0))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            offset += float(rng.exponential(1.0 / args.rps))
        if tasks:
            await asyncio.wait(set(tasks))
    finally:
        await client.aclose()
    return samples


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _kinds(samples: list[Sample]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for s in samples:
        if s.error is not None:
            kinds[s.error] = kinds.get(s.error, 0) + 1
    return kinds


def _summary(workers: int, samples: list[Sample], db: Path, rps: float) -> dict[str, Any]:
    ok = [s for s in samples if s.error is None and s.first is not None]
    ttft = [((s.first or 0.0) - s.start) * 1e3 for s in ok]
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT backend, ttft_ms, slo_met FROM usage_records WHERE status = 'ok'"
        ).fetchall()
    backends: dict[str, dict[str, Any]] = {}
    for name in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == name]
        times = [r[1] for r in mine if r[1] is not None]
        backends[name] = {
            "share": round(len(mine) / len(rows), 3),
            "requests": len(mine),
            "ttft_p50_ms": _pct(times, 50),
            "ttft_p99_ms": _pct(times, 99),
            "slo_met": round(sum(bool(r[2]) for r in mine) / len(mine), 3),
        }
    return {
        "workers": workers,
        "rps": rps,
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "error_kinds": _kinds(samples),
        "ttft_p50_ms": _pct(ttft, 50),
        "ttft_p99_ms": _pct(ttft, 99),
        "slo_met": round(sum(bool(r[2]) for r in rows) / max(1, len(rows)), 3),
        "backends": backends,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--rps", type=float, default=30.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-chars", type=int, default=2000, help="about 4 chars a token")
    parser.add_argument("--profiles", default="910b-qwen2-7b,a100-qwen2-7b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scrape-interval", type=float, help="TIERGATE_SCRAPE_INTERVAL_S (default: the gateway's)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tiergate-routing-") as tmp:
        log_path = Path(tmp) / "servers.log"
        with log_path.open("wb") as log:
            try:
                for workers in [int(w) for w in args.workers.split(",")]:
                    profiles = args.profiles.split(",")
                    fleet = _fleet(Path(tmp), profiles, workers, log, args.scrape_interval)
                    with fleet as (url, key, db):
                        samples = asyncio.run(_load(url, key, args))
                    rows.append(_summary(workers, samples, db, args.rps))
                    if not args.json:
                        print(json.dumps(rows[-1]), file=sys.stderr)
            except RuntimeError:
                print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
                raise
        errors = log_path.read_text(errors="replace").count("Traceback")
        if errors:
            print(f"servers logged {errors} tracebacks", file=sys.stderr)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    else:
        for row in rows:
            split = ", ".join(f"{k} {v['share']:.0%}" for k, v in row["backends"].items())
            print(
                f"{row['workers']} worker(s): {row['requests']} requests, {row['errors']} errors, "
                f"TTFT p50/p99 {row['ttft_p50_ms']}/{row['ttft_p99_ms']} ms, "
                f"SLO met {row['slo_met']:.1%}; split: {split}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
