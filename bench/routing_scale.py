"""Routing decision time at fleet scale: every router, 64 instances x 1,024 queued prefills each.

    python bench/routing_scale.py [--instances 64] [--queued 1024] [--decisions 2000] [--seed 0]
        [--baseline COMMIT] [--gc-freeze] [--only engine-order,expected-gain]

Each decision routes a new request, dispatches it where the router chose and then sees one first
token on a random instance (so that two queues change per decision, as in a busy fleet, and
every router's memo of them is stale); only ``route`` is timed. GoRouting is timed on two
streams: requests some instance can serve in time (Algorithm 2's main branch) and requests none
can (the fallback: ``expected-gain``, the paper's ``random`` and ``engine-order``).
Heterogeneous fleet: half
``a100-qwen2-7b``, half ``910b-qwen2-7b``; queued prompts 64-4,096 tokens, TTFT SLOs 0.2-20 s,
0-256 decoding requests. Target: p99 <= 0.2 ms per decision (wall clock); the thread's CPU
time is printed beside it, since on a shared machine the wall-clock tail is mostly other
processes' time slices. ``--baseline COMMIT`` times GoRouting as it was at that commit beside the
current one, one decision of each in turn on identical sequences, and says whether every
decision was the same. ``--gc-freeze`` moves everything built before the timed decisions (the
fleet's queues) out of the garbage collector's sight (:func:`gc.freeze`), as a gateway worker
could after its start-up: the collector's passes then walk only what the decisions made.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from priority.gain import GainWeights
from priority.profiles import load_profile
from priority.request import SLO, Request
from priority.routing import InstanceRole, InstanceView, RouteDecision, Router, make_router

TARGET_P99_MS = 0.2


def build_views(
    instances: int, queued: int, rng: np.random.Generator, *, pd: bool = False
) -> list[InstanceView]:
    """The fleet's views, every queue filled; ``pd``: the first half prefill instances, the
    rest decode instances (queued prefills only on the former)."""
    profiles = [load_profile("a100-qwen2-7b"), load_profile("910b-qwen2-7b")]
    views = []
    for i in range(instances):
        profile = profiles[i % 2]
        role = InstanceRole.COLOCATED
        if pd:
            role = InstanceRole.PREFILL if i < instances // 2 else InstanceRole.DECODE
        view = InstanceView(i, f"i{i}", profile, profile.estimator(), role, queue_updated_s=0.0)
        view.num_decoding = int(rng.integers(0, 257))
        view.num_free_kv_blocks = int(rng.integers(0, profile.engine.num_kv_blocks))
        for j in range(queued if role is not InstanceRole.DECODE else 0):
            r = new_request(f"q{i}-{j}", rng, now=0.0)
            view.prefill_queue[r.request_id] = r
        views.append(view)
    return views


def new_request(
    rid: str, rng: np.random.Generator, now: float, ttft: float | None = None
) -> Request:
    slo = SLO(ttft_s=ttft or float(rng.uniform(0.2, 20.0)), tpot_s=0.1)
    return Request(
        rid,
        now - float(rng.uniform(0.0, 5.0)),
        int(rng.integers(64, 4097)),
        slo,
        weight=float(rng.choice([1.0, 2.0])),
        true_output_tokens=int(rng.integers(1, 600)),
    )


def time_router(
    router: Router, make: Callable[[int], Request], decisions: int, rng: np.random.Generator
) -> np.ndarray:
    """Route ``decisions`` requests; after each, dispatch it and see one first token elsewhere.
    Returns each route call's wall time and thread CPU time (ms), as two rows."""
    return drive(router, make, decisions, rng)[0]


class Driver:
    """One router's decision sequence, a step at a time (so that two routers can be timed in
    lockstep): each step routes a new request, dispatches it, and one random instance sees the
    first token of its oldest queued request (under PD that request decodes where the router
    re-picks at the handoff) and reports its free KV."""

    def __init__(
        self,
        router: Router,
        make: Callable[[int], Request],
        rng: np.random.Generator,
        *,
        start_s: float = 10.0,
    ) -> None:
        self.router, self.make, self.rng = router, make, rng
        self.now = start_s
        self.k = 0

    def step(self) -> tuple[float, float, RouteDecision]:
        """One decision: its wall and thread CPU time (ms), and the decision."""
        router, rng = self.router, self.rng
        request = self.make(self.k)
        self.k += 1
        self.now += 0.001
        now = self.now
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        decision = router.route(request, now)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        router.on_dispatch(request, decision, now)
        victim = router.instances[int(rng.integers(len(router.instances)))]
        if victim.prefill_queue:
            old = next(iter(victim.prefill_queue.values()))
            seen = RouteDecision(victim.index, decision.decode_instance)
            seen = router.decode_at_handoff(old, seen, now)
            router.on_first_token(old, seen, now)
        engine = victim.profile.engine
        router.on_kv_report(victim.index, int(rng.integers(0, engine.num_kv_blocks)))
        return (t1 - t0) / 1e6, (c1 - c0) / 1e6, decision


def drive(
    router: Router,
    make: Callable[[int], Request],
    decisions: int,
    rng: np.random.Generator,
    *,
    start_s: float = 10.0,
) -> tuple[np.ndarray, list[RouteDecision]]:
    """:func:`time_router`'s sequence (:class:`Driver`), with every decision made."""
    driver = Driver(router, make, rng, start_s=start_s)
    samples = np.empty((2, decisions))
    made = []
    for k in range(decisions):
        wall, cpu, decision = driver.step()
        samples[:, k] = (wall, cpu)
        made.append(decision)
    return samples, made


def lockstep(drivers: list[Driver], decisions: int) -> tuple[list[np.ndarray], bool]:
    """Time several routers on the same sequence, one decision of each in turn (the machine's
    load then falls on all of them alike); also whether they all decided alike."""
    samples = [np.empty((2, decisions)) for _ in drivers]
    alike = True
    for k in range(decisions):
        made = []
        for driver, out in zip(drivers, samples, strict=True):
            wall, cpu, decision = driver.step()
            out[:, k] = (wall, cpu)
            made.append(decision)
        alike = alike and all(d == made[0] for d in made)
    return samples, alike


def load_goroute_at(commit: str) -> type[Router]:
    """GoRouter as ``priority/routing/goroute.py`` was at ``commit`` (``git show``), beside the
    current one: the before/after of a change timed in one run."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{commit}:priority/routing/goroute.py"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    name = f"goroute_at_{commit}"
    module = types.ModuleType(name)
    module.__file__ = f"{commit}:priority/routing/goroute.py"
    sys.modules[name] = module  # dataclasses resolve their module by name
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    router: type[Router] = module.GoRouter
    return router


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--queued", type=int, default=1024)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--baseline",
        metavar="COMMIT",
        help="also time GoRouting as it was at COMMIT, in lockstep on the same sequence",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() after each case's warm-up (the fleet built before it is never walked)",
    )
    parser.add_argument(
        "--only",
        type=lambda v: [w for w in v.split(",") if w],
        help="time only the cases whose label contains one of these words (comma-separated)",
    )
    args = parser.parse_args(argv)

    cases: list[tuple[str, str, dict[str, Any], float | None]] = [
        ("round-robin", "round-robin", {}, None),
        ("min-load", "min-load", {}, None),
        ("power-of-two", "power-of-two", {"seed": args.seed}, None),
        ("least-predicted-ttft", "least-predicted-ttft", {}, None),
        ("goroute, SLO reachable", "goroute", {"seed": args.seed}, 1e5),
        ("goroute, fallback expected-gain", "goroute", {"seed": args.seed}, 1e-3),
        ("goroute, fallback random", "goroute", {"seed": args.seed, "fallback": "random"}, 1e-3),
        (
            "goroute, fallback engine-order",
            "goroute",
            {"seed": args.seed, "fallback": "engine-order"},
            1e-3,
        ),
    ]
    if args.only:
        cases = [case for case in cases if any(word in case[0] for word in args.only)]
    weights = GainWeights.from_lengths(1000.0, 250.0)
    print(
        f"{args.instances} instances x {args.queued} queued, {args.decisions} decisions "
        f"(ms per route call)"
    )
    print(
        f"{'router':44s} {'p50':>7s} {'p99':>7s} {'max':>7s} {'cpu p50':>8s} {'cpu p99':>8s}"
        f"  p99 <= {TARGET_P99_MS} ms (wall / cpu)"
    )
    baseline = load_goroute_at(args.baseline) if args.baseline else None
    for label, name, params, ttft in cases:
        if name == "goroute":
            params = {**params, "weights": weights}
        routers: list[tuple[str, Callable[[list[InstanceView]], Router]]] = [
            (label, partial(make_router, name, **params))
        ]
        if baseline is not None and name == "goroute":
            routers.append((f"{label} @{args.baseline}", partial(baseline, **params)))
        drivers = []
        for _, build in routers:
            rng = np.random.default_rng(args.seed)
            views = build_views(args.instances, args.queued, rng)

            def make(k: int, rng: np.random.Generator = rng, ttft: float | None = ttft) -> Request:
                return new_request(f"n{k}", rng, now=10.0, ttft=ttft)

            driver = Driver(build(views), make, rng)
            for _ in range(50):  # warm the caches and memos
                driver.step()
            drivers.append(driver)
        if args.gc_freeze:
            gc.collect()
            gc.freeze()
        samples, alike = lockstep(drivers, args.decisions)
        for (row, _), (wall, cpu) in zip(routers, samples, strict=True):
            p50, p99 = np.percentile(wall, [50, 99])
            c50, c99 = np.percentile(cpu, [50, 99])
            verdict = "met" if p99 <= TARGET_P99_MS else f"missed ({p99 / TARGET_P99_MS:.1f}x)"
            cpu_verdict = "met" if c99 <= TARGET_P99_MS else f"missed ({c99 / TARGET_P99_MS:.1f}x)"
            print(
                f"{row:44s} {p50:7.3f} {p99:7.3f} {wall.max():7.3f} {c50:8.3f} {c99:8.3f}  "
                f"{verdict} / cpu {cpu_verdict}",
                flush=True,
            )
        if len(drivers) > 1:
            print(f"{'':44s} decisions identical: {alike}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
