"""Paths measured side by side: one Poisson stream whose arrivals go, block by block, to each
path in turn (direct to the engine, through tiergate, through a peer such as LiteLLM or vLLM's
router), every cycle of blocks in an order drawn at random.

Every path thus carries the same load to the same engine, interleaved second by second in one
run, so they share the machine's noise: the ratio between paths is the result, not the absolute
values (``bench/vs_litellm.py``, ``bench/vs_router.py``). The servers, the SSE client and the
statistics are ``bench/gateway_overhead.py``'s.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
import gateway_overhead as go  # servers, load client, statistics

DIRECT = "direct"
"""The path straight to the engine: what every other path's added latency is measured from."""


@dataclass
class PathSample(go.Sample):
    path: str = DIRECT


@dataclass
class AlternatingRun:
    samples: list[PathSample]
    cpu_s: dict[str, float]
    """CPU seconds each source used over the measured window."""
    window_s: float


async def poisson_arrivals(
    rps: float, total_s: float, rng: np.random.Generator
) -> AsyncIterator[tuple[float, float]]:
    """Open-loop Poisson arrivals over ``total_s`` seconds, each yielded at its time as
    (``time.perf_counter`` time it was due, seconds since the start). The next gap is drawn
    after the consumer has handled an arrival, so draws the consumer makes in between keep
    their place in ``rng``'s sequence."""
    t0 = time.perf_counter()
    offset = float(rng.exponential(1.0 / rps))
    while offset < total_s:
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield t0 + offset, offset
        offset += float(rng.exponential(1.0 / rps))


class Launched:
    """Requests started without waiting for them (open loop), waited for at the end."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, request: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(request)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks))


def cpu_now(sources: Mapping[str, Callable[[], float]]) -> dict[str, float]:
    return {name: float(read()) for name, read in sources.items()}


async def alternating_load(
    clients: Mapping[str, go.SseClient],
    cpu: Mapping[str, Callable[[], float]],
    rps: float,
    duration_s: float,
    setup: go.Setup,
    rng: np.random.Generator,
) -> AlternatingRun:
    """Open-loop Poisson arrivals at ``rps``; each block of ``setup.block_s`` goes to one path,
    every cycle of ``len(clients)`` blocks covering each path once in a random order. CPU is
    read from ``cpu`` at the end of the warm-up and at the end."""
    paths = tuple(clients)
    total = setup.warmup_s + duration_s
    cycles = int(total / (len(paths) * setup.block_s)) + 1
    orders = [rng.permutation(len(paths)) for _ in range(cycles)]
    samples: list[PathSample] = []
    streams = Launched()
    cpu_start: dict[str, float] = {}
    window_start = 0.0
    try:
        async for scheduled, offset in poisson_arrivals(rps, total, rng):
            if not cpu_start and offset >= setup.warmup_s:
                cpu_start, window_start = cpu_now(cpu), time.perf_counter()
            block = int(offset / setup.block_s)
            path = paths[orders[block // len(paths)][block % len(paths)]]
            sample = PathSample(path != DIRECT, scheduled, path=path)
            if offset >= setup.warmup_s:
                samples.append(sample)
            streams.start(clients[path].stream(sample))
        await streams.wait()
    finally:
        for client in clients.values():
            await client.aclose()
    cpu_end = cpu_now(cpu)
    used = {k: cpu_end[k] - cpu_start.get(k, math.nan) for k in cpu_end}
    return AlternatingRun(samples, used, time.perf_counter() - window_start)


def path_summary(
    run: AlternatingRun, proxies: Sequence[str], rng: np.random.Generator
) -> dict[str, Any]:
    """Per proxy path: TTFT p50/p99, added TTFT and ITL over the direct path of the same run
    (with a bootstrap interval for the added p99), errors, and CPU ms per request it carried
    (``run.cpu_s[path]``: the proxy's CPU over the window, failed requests included). Keys are
    ``<path>_<metric>``; the direct path's own are ``direct_*``."""
    ok = [s for s in run.samples if s.error is None and s.first is not None]
    paths = (DIRECT, *proxies)
    ttft = {
        p: np.array([(s.first - s.start) * 1e3 for s in ok if s.path == p and s.first])
        for p in paths
    }
    itl = {p: np.array([g * 1e3 for s in ok if s.path == p for g in s.gaps]) for p in paths}
    count = Counter(s.path for s in run.samples)
    errors = Counter(s.path for s in run.samples if s.error is not None or s.first is None)
    pct = go._pct
    out: dict[str, Any] = {
        "direct_ttft_p50_ms": pct(ttft[DIRECT], 50),
        "direct_ttft_p99_ms": pct(ttft[DIRECT], 99),
        "direct_errors": errors[DIRECT],
    }
    for p in proxies:
        out[f"{p}_ttft_p50_ms"] = pct(ttft[p], 50)
        out[f"{p}_ttft_p99_ms"] = pct(ttft[p], 99)
        out[f"{p}_added_ttft_p50_ms"] = pct(ttft[p], 50) - pct(ttft[DIRECT], 50)
        out[f"{p}_added_ttft_p99_ms"] = pct(ttft[p], 99) - pct(ttft[DIRECT], 99)
        out[f"{p}_added_ttft_p99_ci95_ms"] = list(
            go._bootstrap_added_p99(ttft[DIRECT], ttft[p], rng)
        )
        out[f"{p}_added_itl_p50_ms"] = pct(itl[p], 50) - pct(itl[DIRECT], 50)
        out[f"{p}_added_itl_p99_ms"] = pct(itl[p], 99) - pct(itl[DIRECT], 99)
        out[f"{p}_errors"] = errors[p]
        out[f"{p}_cpu_ms_per_request"] = run.cpu_s[p] * 1e3 / max(1, count[p])
    lag = np.array([(s.start - s.scheduled) * 1e3 for s in run.samples])
    window = max(run.window_s, 1e-9)
    out.update(
        {
            "path_requests": {p: count[p] for p in paths},
            "achieved_rps": len(run.samples) / max(span(run.samples), 1e-9),
            "client_lag_p99_ms": pct(lag, 99),
            "cpu_util": {k: v / window for k, v in run.cpu_s.items()},
            "error_kinds": dict(
                Counter(f"{s.path}: {s.error}" for s in run.samples if s.error is not None)
            ),
        }
    )
    return out


def round_nested(value: Any) -> Any:
    """:func:`gateway_overhead._round` through nested dicts (a summary's per-path parts)."""
    if isinstance(value, dict):
        return {k: round_nested(v) for k, v in value.items()}
    return go._round(value)


def span(samples: Sequence[go.Sample]) -> float:
    return samples[-1].scheduled - samples[0].scheduled if len(samples) > 1 else 0.0
