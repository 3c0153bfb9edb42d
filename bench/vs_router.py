"""Tiergate side by side with vLLM's own router, in front of the same emulated engine.

    python bench/vs_router.py [--rates 50,200,400] [--duration S] [--warmup S] [--block S]
        [--max-tokens N] [--policy round_robin] [--pin] [--workers N] [--no-setup] [--json]

vLLM's router (``vllm-router`` ``ROUTER_VERSION``, Rust on tokio, from the package index) is
what a team puts in front of its vLLM fleet when it wants a router and nothing else: no API keys,
tenants, limits, admission or accounting. It lives in a virtual environment of its own,
``bench/.venvs/vllm-router-<version>``, built here when missing (a 24 MB wheel; without it, or if
it cannot be installed, the bench says so and skips).

One emulated engine, one tiergate gateway (``--workers`` processes) and one router, both
pointed at that engine; for each rate in ``--rates`` one open-loop Poisson stream whose
arrivals go, in blocks of ``--block`` seconds, straight to the engine, through tiergate or
through the router (each cycle of three blocks in a random order: :mod:`alternating`), every
request a streamed chat completion of ``--max-tokens`` tokens. So the three paths share the
machine's noise and the engine always sees the rate. Reported per rate: added TTFT p50/p99 of
each proxy over the direct path, errors, and each proxy's CPU ms per request it carried (its
whole process tree over the measured window); the headline is the ratio
``tiergate_cpu_ms_per_request / router_cpu_ms_per_request`` and the difference of their added
TTFT p99. Tiergate runs with everything on: authentication, limits, admission, routing, gain
accounting and usage records. ``--pin`` puts both proxies on the last CPU (the router's tokio
runtime then has one core, as one gateway worker has).

The numbers are only as quiet as the machine: read the ratios, which the alternation makes
comparable, rather than absolute values.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
import alternating as alt  # paths side by side in alternating blocks
import gateway_overhead as go  # servers, load client, statistics
import peer_process as peer  # the peer proxy as a child process

ROUTER_VERSION = "0.1.17"
REPO = Path(__file__).resolve().parents[1]
ROUTER_VENV = REPO / "bench" / ".venvs" / f"vllm-router-{ROUTER_VERSION}"
ROUTER_STARTUP_TIMEOUT_S = 60.0
PROXIES = ("tiergate", "router")
REQUIRED_KEYS = (
    "rps",
    "requests",
    "cpu_ratio",
    "tiergate_cpu_ms_per_request",
    "router_cpu_ms_per_request",
    "tiergate_added_ttft_p99_ms",
    "router_added_ttft_p99_ms",
    "tiergate_errors",
    "router_errors",
)


class RouterUnavailable(RuntimeError):
    """vLLM's router is not installed and could not be."""


def ensure_router(build: bool = True) -> Path:
    """The router's venv, built with pip when missing and ``build``; its path."""
    binary = ROUTER_VENV / "bin" / "vllm-router"
    if binary.exists():
        return ROUTER_VENV
    if not build:
        raise RouterUnavailable(f"no {binary} (run without --no-setup to build it)")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(ROUTER_VENV)], check=True)
        subprocess.run(
            [
                str(ROUTER_VENV / "bin" / "pip"),
                "install",
                "-q",
                "--disable-pip-version-check",
                f"vllm-router=={ROUTER_VERSION}",
            ],
            check=True,
            stderr=subprocess.DEVNULL,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RouterUnavailable(
            f"vllm-router=={ROUTER_VERSION} could not be installed: {exc}"
        ) from exc
    if not binary.exists():
        raise RouterUnavailable(f"the vllm-router wheel installed no {binary}")
    return ROUTER_VENV


@contextlib.contextmanager
def running_router(
    venv: Path, engine_url: str, *, policy: str, cpus: set[int] | None = None
) -> Iterator[peer.PeerProcess]:
    """vLLM's router on a free port, routing to ``engine_url``, until the block ends (it
    health-checks its worker before it serves)."""
    port, prometheus_port = go._free_port(), go._free_port()
    command = [
        str(venv / "bin" / "vllm-router"),
        *("--host", "127.0.0.1", "--port", str(port), "--worker-urls", engine_url),
        *("--policy", policy, "--prometheus-host", "127.0.0.1"),
        *("--prometheus-port", str(prometheus_port), "--log-level", "warning"),
    ]
    ready = peer.ReadyCheck("vllm-router", go.MODEL, ROUTER_STARTUP_TIMEOUT_S)
    with tempfile.TemporaryDirectory(prefix="tiergate-vllm-router-") as tmp:
        log_path = Path(tmp) / "router.log"
        with peer.running_peer(
            command, port=port, ready=ready, log_path=log_path, cpus=cpus
        ) as server:
            yield server


def _chat_body(max_tokens: int) -> bytes:
    body = {
        "model": go.MODEL,
        "messages": [{"role": "user", "content": go.PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    return json.dumps(body).encode()


def summarize(run: alt.AlternatingRun, rps: float, rng: np.random.Generator) -> dict[str, Any]:
    """The required keys first (the CPU ratio is the headline), then per-path detail."""
    detail = alt.path_summary(run, PROXIES, rng)
    router_cpu = detail["router_cpu_ms_per_request"]
    out: dict[str, Any] = {
        "rps": rps,
        "requests": len(run.samples),
        "cpu_ratio": detail["tiergate_cpu_ms_per_request"] / router_cpu if router_cpu else None,
    }
    out.update({key: detail[key] for key in REQUIRED_KEYS[3:]})
    out.update(detail)
    out["added_ttft_p99_difference_ms"] = (
        detail["tiergate_added_ttft_p99_ms"] - detail["router_added_ttft_p99_ms"]
    )
    out["router_version"] = ROUTER_VERSION
    return alt.round_nested(out)


def run(venv: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    setup = go.Setup(
        max_tokens=args.max_tokens,
        block_s=args.block,
        warmup_s=args.warmup,
        seed=args.seed,
        pin=args.pin,
        workers=args.workers,
    )
    rows = []
    with go.running_servers(setup) as servers:
        gateway_cpus = set(os.sched_getaffinity(servers.processes[1].pid))
        with running_router(
            venv, servers.engine_url, policy=args.policy, cpus=gateway_cpus if args.pin else None
        ) as router:
            body = _chat_body(args.max_tokens)
            json_type = {"content-type": "application/json"}
            auth = {**json_type, "authorization": f"Bearer {servers.api_key}"}
            path = "/v1/chat/completions"
            for rps in args.rates:
                rng = np.random.default_rng([args.seed, int(rps * 1000)])
                clients = {
                    "direct": go.SseClient(servers.engine_url, path, json_type, body),
                    "tiergate": go.SseClient(servers.gateway_url, path, auth, body),
                    "router": go.SseClient(router.url, path, json_type, body),
                }
                cpu = {
                    "engine": lambda: servers.cpu_seconds()["engine"],
                    "tiergate": lambda: servers.cpu_seconds()["gateway"],  # with its workers
                    "router": router.cpu_seconds,
                    "client": time.process_time,
                }
                load = alt.alternating_load(clients, cpu, rps, args.duration, setup, rng)
                row = summarize(go._run(load), rps, rng)
                rows.append({**row, "workers": args.workers, "pinned": args.pin})
    return rows


def _print(row: dict[str, Any]) -> None:
    def ms(key: str) -> str:
        value = row.get(key)
        return "—" if value is None else f"{value:.2f}"

    print(f"{row['rps']:g} req/s, {row['requests']} requests {row['path_requests']}")
    print(f"  direct TTFT p50/p99: {ms('direct_ttft_p50_ms')} / {ms('direct_ttft_p99_ms')} ms")
    for path in PROXIES:
        print(
            f"  {path:8}  added TTFT p50/p99 {ms(f'{path}_added_ttft_p50_ms')} / "
            f"{ms(f'{path}_added_ttft_p99_ms')} ms (p99 95% CI "
            f"{row[f'{path}_added_ttft_p99_ci95_ms']}), errors {row[f'{path}_errors']}, "
            f"CPU {ms(f'{path}_cpu_ms_per_request')} ms/request"
        )
    print(
        f"  tiergate / router CPU per request: {ms('cpu_ratio')}x; added TTFT p99 difference "
        f"{ms('added_ttft_p99_difference_ms')} ms"
    )
    if row["error_kinds"]:
        print(f"  errors: {row['error_kinds']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rates", type=lambda t: [float(r) for r in t.split(",")], default=[50.0, 200.0, 400.0]
    )
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds first")
    parser.add_argument("--block", type=float, default=1.0, help="seconds per block of a path")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--policy",
        default="round_robin",
        help="vllm-router's --policy (one engine: power_of_two needs two)",
    )
    parser.add_argument("--pin", action="store_true", help="both proxies on the last CPU")
    parser.add_argument("--workers", type=int, default=1, help="tiergate worker processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-setup", action="store_true", help="never build the router's venv")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    try:
        venv = ensure_router(build=not args.no_setup)
    except RouterUnavailable as exc:
        message = f"skipped: vLLM's router {ROUTER_VERSION} is unavailable: {exc}"
        print(message, file=sys.stderr)
        if args.json:
            print(json.dumps({"skipped": message}))
        return 0
    rows = run(venv, args)
    if args.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0]))
    else:
        for row in rows:
            _print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
