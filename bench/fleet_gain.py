"""The fleet's gain: `slide · goroute` against what users run, every router behind `slide`.

    python bench/fleet_gain.py [--trace azure_conv,azure_code] [--duration 180]
        [--loads 1.5,2,3,4.5,7] [--modes co-located,pd] [--cluster a100-qwen2-7b,...]
        [--profile-error 910b-qwen2-7b=1.3,a100-qwen2-7b=0.8 --scrape-s 1]
        [--seed 0] [--json PATH] [--markdown PATH]

**Workload and capacity** as in ``bench/policy_sweep.py``: each trace's first ``--duration``
seconds, replayed identically at every load; 1x is the cluster's capacity measured with stock
vLLM (``vllm-v1``) behind Min-Load (:mod:`priority.sim.capacity`).

**Users' best** at a load: the best TDG ratio of ``vllm-v1`` / ``vllm-v1-priority`` behind
round-robin, Min-Load, power-of-two (vllm-router) and least-predicted-TTFT (llm-d). Beside it,
``slide`` behind every router, and behind GoRouting with the paper's random fallback
(``goroute[random]``), all on the identical workload of that load, in one run.

**Targets** (checked, not tuned for): ``slide · goroute`` >= 1.35x users' best where users'
best TDG ratio <= 0.75, >= 1.15x where <= 0.9, never below 0.99x; behind ``slide``, GoRouting
>= 0.99x every other router, and >= 1.1x Min-Load where Min-Load's TDG ratio < 0.8.

**Profile error** (``--profile-error``): each instance of a named profile really runs at the
given multiple of its profiled step time; engines learn their correction and the router gets
each engine's estimator every ``--scrape-s``. Per load, ``slide · goroute`` run three ways on the
same true hardware: profiles exact (the scaled profiles), profiles wrong with the correction
scraped, profiles wrong and never corrected; capacity measured on the true hardware.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from priority.profiles import Profile, load_profile
from priority.routing import ROUTER_NAMES, USERS_ROUTERS
from priority.sim import ClusterConfig, PdConfig, Trace, build_workload, load_trace
from priority.sim.capacity import CAPACITY_POLICY, CAPACITY_ROUTER, find_capacity, trace_head
from priority.sim.cluster import true_profile
from priority.sim.compare import compare_policies

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
from policy_sweep import DEFAULT_CLUSTER, cluster_label, kv_transfer
from sweep_args import csv, load_multiples

DEFAULT_TRACES = ("azure_conv", "azure_code")
DEFAULT_LOADS = (1.5, 2.0, 3.0, 4.5, 7.0)
USERS_POLICIES = ("vllm-v1", "vllm-v1-priority")
OURS = "slide"
GOROUTE = "goroute"
RANDOM_FALLBACK = "goroute[random]"
"""GoRouting with Algorithm 2's random fallback (the ablation of the expected-gain one)."""

STRONG_GAIN, STRONG_BELOW = 1.35, 0.75
GAIN, GAIN_BELOW = 1.15, 0.9
FLOOR = 0.99
MIN_LOAD_GAIN, MIN_LOAD_BELOW = 1.1, 0.8

Log = Callable[[str], None]


@dataclass(frozen=True)
class Cell:
    """Every run at one load of one scenario."""

    load: float
    rps: float
    tdg: dict[str, float]
    """``"policy · router"`` -> TDG ratio."""

    def users_best(self) -> tuple[str, float]:
        users = {
            f"{p} · {r}": self.tdg[f"{p} · {r}"] for p in USERS_POLICIES for r in USERS_ROUTERS
        }
        label = max(users, key=lambda k: users[k])
        return label, users[label]

    @property
    def ours(self) -> float:
        return self.tdg[f"{OURS} · {GOROUTE}"]


def run_load(
    segment: Trace,
    config: ClusterConfig,
    rps: float,
    routers: Sequence[str],
    seed: int,
    goroute_params: dict[str, Any] | None = None,
) -> dict[str, float]:
    workload = build_workload(segment, rps=rps, reference_profile=config.profiles[0], seed=seed)
    tdg: dict[str, float] = {}
    for router in routers:
        routed = replace(config, router=router)
        if router == GOROUTE and goroute_params:
            routed = replace(routed, router_params=goroute_params)
        policies = (*USERS_POLICIES, OURS) if router in USERS_ROUTERS else (OURS,)
        for summary in compare_policies(workload, routed, policies):
            tdg[f"{summary['policy']} · {router}"] = float(summary["tdg_ratio"])
    ablation = replace(config, router=GOROUTE, router_params={"fallback": "random"})
    (summary,) = compare_policies(workload, ablation, (OURS,))
    tdg[f"{OURS} · {RANDOM_FALLBACK}"] = float(summary["tdg_ratio"])
    return tdg


def verdict(ratio: float, users_best: float) -> str:
    """The target for ``slide · goroute`` / users' best at this users' best TDG, and the miss."""
    if users_best <= STRONG_BELOW:
        need = STRONG_GAIN
    elif users_best <= GAIN_BELOW:
        need = GAIN
    else:
        need = FLOOR
    return f">= {need:.2f}: " + ("met" if ratio >= need else f"missed by {need - ratio:.2f}")


def goroute_verdicts(cell: Cell) -> list[str]:
    """GoRouting against every other router behind slide: floor, and the Min-Load gain."""
    out = []
    for router in ROUTER_NAMES:
        if router == GOROUTE:
            continue
        other = cell.tdg[f"{OURS} · {router}"]
        ratio = cell.ours / other if other > 0 else math.inf
        need = FLOOR
        if router == CAPACITY_ROUTER and other < MIN_LOAD_BELOW:
            need = MIN_LOAD_GAIN
        if ratio < need:
            out.append(f"vs {router} {ratio:.2f} < {need:.2f} (by {need - ratio:.2f})")
    return out


def markdown(title: str, capacity_rps: float, cells: Sequence[Cell]) -> str:
    routers = [r for r in ROUTER_NAMES if r != GOROUTE] + [RANDOM_FALLBACK]
    head = (
        "| load | users' best (pair) | slide · goroute | ratio | target | "
        + " | ".join(f"goroute / {r}" for r in routers)
        + " | GoRouting misses |"
    )
    rule = "|---:|---|---:|---:|---|" + "---:|" * len(routers) + "---|"
    lines = [f"**{title}** · capacity {capacity_rps:.3f} req/s", "", head, rule]
    for c in cells:
        label, best = c.users_best()
        ratio = c.ours / best if best > 0 else math.inf
        per_router = []
        for r in routers:
            other = c.tdg[f"{OURS} · {r}"]
            per_router.append(f"{c.ours / other:.2f} ({other:.3f})" if other > 0 else "inf")
        lines.append(
            f"| {c.load:g}x | {best:.3f} ({label}) | {c.ours:.3f} | {ratio:.2f} | "
            f"{verdict(ratio, best)} | "
            + " | ".join(per_router)
            + f" | {'; '.join(goroute_verdicts(c)) or 'none'} |"
        )
    return "\n".join(lines) + "\n"


def parse_error(value: str) -> dict[str, float]:
    """``"910b-qwen2-7b=1.3,a100-qwen2-7b=0.8"`` -> profile name -> true step-time multiple."""
    out: dict[str, float] = {}
    for item in csv(value):
        name, _, factor = item.partition("=")
        try:
            out[name.strip()] = float(factor)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected NAME=FACTOR, got {item!r}") from None
        if not (out[name.strip()] > 0 and math.isfinite(out[name.strip()])):
            raise argparse.ArgumentTypeError(f"factor must be positive: {item!r}")
    return out


def profile_error_rows(
    segment: Trace,
    base: ClusterConfig,
    scales: list[float],
    loads: Sequence[float],
    scrape_s: float,
    seed: int,
    rel_tol: float,
    log: Log,
) -> tuple[float, list[dict[str, float]]]:
    """``slide · goroute`` on true hardware: exact profiles / wrong + scraped / wrong, never
    corrected; capacity measured on the true hardware (exact profiles)."""
    exact = replace(
        base, profiles=[true_profile(p, s) for p, s in zip(base.profiles, scales, strict=True)]
    )
    wrong = replace(base, true_time_scale=scales, estimator_scrape_s=scrape_s)
    stale = replace(base, true_time_scale=scales)
    capacity = find_capacity(segment, exact, seed=seed, rel_tol=rel_tol)
    rows = []
    for load in loads:
        rps = load * capacity.rps
        row: dict[str, float] = {"load": load}
        for key, config in (("exact", exact), ("scraped", wrong), ("never", stale)):
            workload = build_workload(
                segment, rps=rps, reference_profile=base.profiles[0], seed=seed
            )
            routed = replace(config, router=GOROUTE)
            (summary,) = compare_policies(workload, routed, (OURS,))
            row[key] = float(summary["tdg_ratio"])
        rows.append(row)
        log(f"  profile error {load:g}x: {row}")
    return capacity.rps, rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trace", type=csv, default=DEFAULT_TRACES)
    parser.add_argument("--duration", type=float, default=180.0)
    parser.add_argument("--loads", type=load_multiples, default=DEFAULT_LOADS)
    parser.add_argument("--modes", type=csv, default=("co-located", "pd"))
    parser.add_argument("--cluster", type=csv, default=DEFAULT_CLUSTER)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rel-tol", type=float, default=0.05, help="capacity bisection")
    parser.add_argument("--profile-error", type=parse_error)
    parser.add_argument("--scrape-s", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument(
        "--goroute-fallback",
        help="GoRouting's fallback in the `goroute` column (expected-gain, engine-order; "
        "default: the router's own)",
    )
    args = parser.parse_args(argv)
    if not set(args.modes) <= {"co-located", "pd"}:
        parser.error("--modes: co-located and/or pd")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    params = {"fallback": args.goroute_fallback} if args.goroute_fallback else None
    started = time.perf_counter()
    profiles: list[Profile] = [load_profile(name) for name in args.cluster]
    label = cluster_label(args.cluster)
    sections: list[str] = []
    dump: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "scenarios": []}
    for trace in args.trace:
        segment = trace_head(load_trace(trace), args.duration)
        for mode in args.modes:
            pd = (
                PdConfig(num_prefill=len(profiles) // 2, transfer=kv_transfer())
                if mode == "pd"
                else None
            )
            config = ClusterConfig(
                profiles, CAPACITY_POLICY, CAPACITY_ROUTER, seed=args.seed, pd=pd
            )
            t0 = time.perf_counter()
            capacity = find_capacity(segment, config, seed=args.seed, rel_tol=args.rel_tol)
            title = f"{trace} · {label} · {mode} · {len(segment)} requests"
            log(f"{title}: capacity {capacity.rps:.3f} req/s ({time.perf_counter() - t0:.0f} s)")
            cells = []
            for load in args.loads:
                t0 = time.perf_counter()
                rps = load * capacity.rps
                cells.append(
                    Cell(load, rps, run_load(segment, config, rps, ROUTER_NAMES, args.seed, params))
                )
                log(f"  {load:g}x: {time.perf_counter() - t0:.0f} s")
            section = markdown(title, capacity.rps, cells)
            print(section, flush=True)
            sections.append(section)
            scenario: dict[str, Any] = {
                "trace": trace,
                "mode": mode,
                "requests": len(segment),
                "capacity_rps": capacity.rps,
                "cells": [c.__dict__ for c in cells],
            }
            if args.profile_error:
                scales = [args.profile_error.get(p.name, 1.0) for p in profiles]
                cap, rows = profile_error_rows(
                    segment, config, scales, args.loads, args.scrape_s, args.seed, args.rel_tol, log
                )
                lines = [
                    f"**{title} · profile error {args.profile_error}, scrape every "
                    f"{args.scrape_s:g} s** · true-hardware capacity {cap:.3f} req/s",
                    "",
                    "| load | exact profiles | wrong, corrected | kept | wrong, never corrected |",
                    "|---:|---:|---:|---:|---:|",
                ]
                for row in rows:
                    kept = row["scraped"] / row["exact"] if row["exact"] > 0 else math.inf
                    lines.append(
                        f"| {row['load']:g}x | {row['exact']:.3f} | {row['scraped']:.3f} | "
                        f"{kept:.2f} | {row['never']:.3f} |"
                    )
                section = "\n".join(lines) + "\n"
                print(section, flush=True)
                sections.append(section)
                scenario["profile_error"] = {"capacity_rps": cap, "rows": rows}
            dump["scenarios"].append(scenario)
    dump["wall_s"] = round(time.perf_counter() - started, 1)
    log(f"wall time {dump['wall_s']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dump, indent=1) + "\n")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
