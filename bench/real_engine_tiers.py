"""Premium beside batch under overload on real vLLM engines: SlideBatching vs stock vLLM.

Two real `vllm serve` processes (vLLM's CPU build, the tiny model of .ci/real_engine.sh), each on
its own core: one with vLLM's own scheduler, one with ``TiergateScheduler`` running SlideBatching.
Each has its own gateway (in-process) in front; one Poisson stream of streamed chats from a
premium and a batch tenant is replayed against both gateways at once, past what one engine
serves. Per engine and tier: SLO attainment (requests within their TTFT and TPOT objectives,
from the usage rows) and the priority-weighted token gain (TDG) delivered, side by side.

    python bench/real_engine_tiers.py [--rate 24] [--duration 60] [--premium-share 0.3]

The target: `slide` gives premium at least stock vLLM's SLO attainment and a higher TDG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from real_engine_common import poisson_arrivals, replay, seed
from sqlalchemy import select

from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db.models import UsageRecord
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from tests.real_engine.vllm_server import MODEL, VllmServer, missing

SECRET = "bench-tiers-secret"
PROFILE = "h100-llama3.1-8b"
"""Registered for both; the engines state their own seats, and their refitted estimators reach
the gateways' routers through the scrapes."""


def summary(url: str) -> dict[str, dict[str, float]]:
    """Per tier: requests, share within SLO, TDG delivered, and its ideal."""
    engine = make_engine(url)
    with make_session_factory(engine)() as session:
        rows = session.scalars(select(UsageRecord)).all()
    engine.dispose()
    out: dict[str, dict[str, float]] = {}
    for tier in sorted({r.tier for r in rows if r.tier}):
        mine = [r for r in rows if r.tier == tier]
        ideal = sum(r.ideal_gain for r in mine)
        out[tier] = {
            "requests": len(mine),
            "slo_attainment": sum(r.slo_met for r in mine) / len(mine),
            "tdg": sum(r.gain for r in mine),
            "tdg_ratio": sum(r.gain for r in mine) / ideal if ideal else 0.0,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=24.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--premium-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    reason = missing()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="tiers-bench-"))
    servers = [
        VllmServer("stock", None, core=0, log_dir=work),
        VllmServer("slide", "slide", core=1, log_dir=work),
    ]
    tenants = [("premium-co", "premium"), ("batch-co", "batch")]
    arrivals = poisson_arrivals(
        args.duration,
        args.rate,
        [("premium-co", args.premium_share), ("batch-co", 1 - args.premium_share)],
        prompt_words=(10, 80),
        max_tokens=(32, 128),
        seed=args.seed,
    )
    urls, keys, bases = [], [], []
    with ExitStack() as stack:
        for server in servers:
            server.start()
            stack.callback(server.stop)
        for server in servers:
            server.wait_ready()
        for server in servers:
            url = f"sqlite:///{work / (server.name + '.db')}"
            urls.append(url)
            keys.append(seed(url, SECRET, tenants))
            settings = Settings(
                database_url=url, secret=SecretStr(SECRET), data_dir=work, redis_url=None
            )
            spec = BackendSpec(server.name, server.url, MODEL, PROFILE)
            gateway = stack.enter_context(GatewayThread(create_app(settings, backends=[spec])))
            bases.append(gateway.base_url)
        asyncio.run(replay(bases, keys, arrivals))
    result: dict[str, Any] = {
        server.name: summary(url) for server, url in zip(servers, urls, strict=True)
    }
    print(f"{len(arrivals)} arrivals at {args.rate}/s for {args.duration:.0f} s, to each engine")
    print(f"{'engine':<8}{'tier':<10}{'requests':>9}{'in SLO':>9}{'TDG':>12}{'TDG ratio':>11}")
    for name, tiers in result.items():
        for tier, row in tiers.items():
            print(
                f"{name:<8}{tier:<10}{row['requests']:>9.0f}{row['slo_attainment']:>9.1%}"
                f"{row['tdg']:>12.0f}{row['tdg_ratio']:>11.3f}"
            )
    for tier in ("premium", "batch"):
        stock, slide = result["stock"].get(tier), result["slide"].get(tier)
        if stock and slide and stock["tdg"]:
            print(
                f"{tier}: slide / stock TDG {slide['tdg'] / stock['tdg']:.2f}x, "
                f"SLO attainment {slide['slo_attainment']:.1%} vs {stock['slo_attainment']:.1%}"
            )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
