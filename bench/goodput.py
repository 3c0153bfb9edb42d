"""JITServe-style goodput: latency, deadline and agent-workflow requests on one engine, 0.5-3x load.

    python bench/goodput.py [--trace azure_conv,azure_code] [--requests 600] [--profile NAME]
        [--loads 0.5,1,1.5,2,3] [--policy P,...] [--lengths predicted,oracle] [--seed 0]
        [--jobs N] [--workflow-history on|off] [--json] [--out PATH.json] [--markdown PATH.md]
        [--plot DIR]

**Mix** (deterministic from ``--seed``). The first ``--requests`` rows of each trace, each
trace's arrivals rescaled to one common span so they interleave over the same window (every
trace keeps its own gaps and bursts), merged in time order. Within each trace the rows are split
exactly 1:1:1 (up to one row) into latency, deadline and compound requests — JITServe's type mix,
counted in requests (calls), so each kind holds a third of the request goodput at stake — by a
seeded shuffle. A trace's compound rows, in arrival order, form agent workflows of 2-4 stages
(seeded): stage 0 arrives at its row's time, stage k arrives ``think`` after stage k-1 finished
(think ~ U(0.1, 1.0) s, a tool call: not scaled to the hardware); every stage keeps its row's
prompt and output lengths. Tenants are the applications: ``<trace>/<kind>`` (so ``jain_tenant``
compares the six kinds-of-traffic, which is what a fairness blend must balance). Tiers are the
simulator's defaults (high/low, p = 0.5, weights 2/1).

**SLOs, scaled to the reference profile's own step times** (``--profile``; JITServe's numbers
are TTFT ~2 s, TBT ~100 ms, deadline 20 s, compound 20 s x stages on its GPUs). With ``S = 5``
(SLOs-Serve's loose factor, the simulator's ``SloPolicy`` default):

* latency: TTFT = max(S x the prompt's zero-load TTFT, 200 ms) (``SloPolicy``); TPOT = S x the
  profile's one-request decode step at the mix's median context (prompt + output / 2).
  JITServe's 100 ms TBT is about 5x its decode step;
* deadline: D_trace = 2 x the p95, over that trace's rows, of the zero-load end-to-end time
  (prefill + decode alone on the profile, ``priority.sim.capacity.zero_load_e2e_s``). JITServe
  took the p95 latency of real API calls (which include queueing); the idle p95 doubled keeps
  ~every deadline meetable on an idle engine;
* compound: D_workflow = stages x D_trace + the workflow's think times (JITServe: 20 s x
  stages), from stage 0's arrival; calls get the simulator's cold-start sub-deadlines, or with
  ``--workflow-history on`` φ(s) matched against the run's finished workflows (cold start
  without a match; ``priority.sim.history``).

**Load**: ``--loads`` x capacity, capacity measured on this mix as the project does everywhere
(``priority.sim.capacity``: the highest rate at which ``vllm-v1`` keeps SLO attainment >= 90% of
its near-idle attainment). Every load replays the same requests, rescaled in time.

**Lengths**: ``--lengths predicted`` (calibrated stand-in for the predictor's held-out error) and
``oracle`` (``priority.sim.workflows``); the ``*-oracle`` policies and SJF / RR-SJF read the true
length in both.

**Reported**: per policy x load x lengths, request goodput (requests on time by their kind's
rule, a workflow's calls counting together; share of submitted), token goodput (output tokens
on time, share of all), per-kind attainment and ``jain_tenant``. Ratios (request goodput): gmax
/ ``vllm-v0-fcfs`` (the issue's ``vllm-fcfs``, renamed in the registry), gmax / ``vllm-v1``
(stock vLLM), gmax / the best deployable non-GMAX policy, gmax / gmax-oracle, gmax-fair's Jain
index and goodput cost against gmax. **Targets** (checked, never asserted): gmax >= 2x
vllm-fcfs and >= 1.2x the best non-GMAX at 1.5-2x capacity; within 5% of gmax-oracle;
gmax-fair Jain >= 0.9 at <= 5% goodput cost.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from priority.policies import POLICY_NAMES, RENAMED, policy_class
from priority.profiles import Profile, load_profile
from priority.sim import ClusterConfig, Trace, build_workload, load_trace
from priority.sim.capacity import (
    CAPACITY_POLICY,
    CAPACITY_ROUTER,
    find_capacity,
    trace_first,
    zero_load_e2e_s,
)
from priority.sim.compare import compare_policies
from priority.sim.workflows import LENGTH_MODES
from priority.sim.workload import SloPolicy

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
from sweep_args import csv, load_multiples, names

DEFAULT_TRACES = ("azure_conv", "azure_code")
DEFAULT_REQUESTS = 600
DEFAULT_PROFILE = "a100-qwen2-7b"
DEFAULT_LOADS = (0.5, 1.0, 1.5, 2.0, 3.0)
DEFAULT_LENGTHS = ("predicted", "oracle")
KINDS = ("latency", "deadline", "compound")

SLO_SCALE = SloPolicy().ttft_scale
"""Every latency SLO is this multiple of the idle engine's time (TTFT: SloPolicy's own rule)."""
DEADLINE_SCALE = 2.0
"""A deadline is this multiple of the trace's p95 zero-load end-to-end time."""
DEADLINE_QUANTILE = 95.0
STAGES = (2, 3, 4)
THINK_S = (0.1, 1.0)

TARGET = "gmax"
FAIR = "gmax-fair"
ORACLE = "gmax-oracle"
FCFS = RENAMED["vllm-fcfs"]
STOCK = CAPACITY_POLICY
GAIN_OVER_FCFS = 2.0
GAIN_OVER_BEST = 1.2
TARGET_LOADS = (1.5, 2.0)
"""Inclusive load range (x capacity) of the two gain targets."""
ORACLE_GAP = 0.05
FAIR_JAIN = 0.9
FAIR_COST = 0.05

console = Console(stderr=True)
Log = Callable[[str], None]


# ---- the mix -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MixInfo:
    """What the mix holds and the SLOs it got (reported beside the results)."""

    requests: int
    per_kind: dict[str, int]
    per_trace: dict[str, int]
    workflows: int
    tpot_s: float
    deadline_s: dict[str, float]
    """D_trace per trace (a workflow of S stages gets S x this + its think times)."""


def build_mix(
    traces: Sequence[Trace], profile: Profile, requests_per_trace: int, seed: int
) -> tuple[Trace, MixInfo]:
    """The JITServe mix of ``traces`` as one trace with kind/workflow/SLO columns (module doc)."""
    heads = [trace_first(t, min(requests_per_trace, len(t))) for t in traces]
    names = [t.name for t in traces]
    if len(set(names)) != len(names):
        raise ValueError(f"traces must differ, got {', '.join(names)}")
    est = profile.estimator()
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(heads))]
    contexts: list[float] = []
    columns: list[dict[str, Any]] = []
    deadlines: dict[str, float] = {}
    workflows = 0
    for name, head, rng in zip(names, heads, rngs, strict=True):
        assert head.arrival_s is not None
        n = len(head)
        span = float(head.arrival_s[-1] - head.arrival_s[0])
        unit = (head.arrival_s - head.arrival_s[0]) / span if span > 0 else np.zeros(n)
        prompts, outputs = head.prompt_tokens.tolist(), head.output_tokens.tolist()
        e2e = [zero_load_e2e_s(profile, p, o, est) for p, o in zip(prompts, outputs, strict=True)]
        deadline = DEADLINE_SCALE * float(np.percentile(e2e, DEADLINE_QUANTILE))
        deadlines[name] = deadline
        kinds = rng.permutation(np.resize(np.arange(len(KINDS)), n))
        rows: list[dict[str, Any]] = [
            {
                "arrival": float(unit[k]),
                "order": (float(unit[k]), len(columns), k),
                "prompt": prompts[k],
                "output": outputs[k],
                "kind": KINDS[int(kinds[k])],
                "tenant": f"{name}/{KINDS[int(kinds[k])]}",
                "workflow": None,
                "stage": 0,
                "think": 0.0,
                "deadline": math.nan if kinds[k] == 0 else deadline,
            }
            for k in range(n)
        ]
        compound = [row for row in rows if row["kind"] == "compound"]
        start = 0
        while start < len(compound):
            group = compound[start : start + int(rng.choice(STAGES))]
            thinks = [0.0, *rng.uniform(*THINK_S, size=len(group) - 1).tolist()]
            for stage, (row, think) in enumerate(zip(group, thinks, strict=True)):
                row.update(
                    workflow=f"{name}-w{workflows}",
                    stage=stage,
                    think=think,
                    deadline=len(group) * deadline + sum(thinks),
                )
            workflows += 1
            start += len(group)
        contexts += [p + o / 2 for p, o in zip(prompts, outputs, strict=True)]
        columns.append({"name": name, "rows": rows})
    tpot = SLO_SCALE * est.batch_time(decode_kv=[int(np.median(contexts))])
    slo = SloPolicy()
    merged = sorted((row for c in columns for row in c["rows"]), key=lambda row: row["order"])
    latency = [row["kind"] == "latency" for row in merged]
    ttft = [
        slo.ttft_for(profile.zero_load_ttft_s(row["prompt"])) if is_latency else math.nan
        for row, is_latency in zip(merged, latency, strict=True)
    ]
    mix = Trace(
        name="mix",
        arrival_s=np.array([row["arrival"] for row in merged], dtype=np.float64),
        prompt_tokens=np.array([row["prompt"] for row in merged], dtype=np.int64),
        output_tokens=np.array([row["output"] for row in merged], dtype=np.int64),
        tenant=[row["tenant"] for row in merged],
        ttft_slo_s=np.array(ttft, dtype=np.float64),
        tpot_slo_s=np.array([tpot if x else math.nan for x in latency], dtype=np.float64),
        deadline_s=np.array([row["deadline"] for row in merged], dtype=np.float64),
        kind=[row["kind"] for row in merged],
        workflow_id=[row["workflow"] for row in merged],
        stage=np.array([row["stage"] for row in merged], dtype=np.int64),
        think_s=np.array([row["think"] for row in merged], dtype=np.float64),
    )
    info = MixInfo(
        requests=len(merged),
        per_kind={k: sum(1 for row in merged if row["kind"] == k) for k in KINDS},
        per_trace={name: len(head) for name, head in zip(names, heads, strict=True)},
        workflows=workflows,
        tpot_s=tpot,
        deadline_s=deadlines,
    )
    return mix, info


# ---- runs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoodputConfig:
    traces: tuple[str, ...]
    requests: int
    profile: str
    loads: tuple[float, ...]
    policies: tuple[str, ...]
    lengths: tuple[str, ...]
    seed: int
    rel_tol: float
    jobs: int
    workflow_history: bool = False
    """Compound sub-deadlines from the run's finished workflows (``priority.sim.history``)."""


def cell_row(summary: dict[str, Any], lengths: str, load: float, rps: float, tokens: int) -> dict:
    """The bench's numbers of one simulated run (``compare_policies`` summary)."""
    per_kind = summary["per_kind"]
    good = sum(int(v["goodput_requests"]) for v in per_kind.values())
    good_tokens = sum(float(v["goodput_tokens"]) for v in per_kind.values())
    return {
        "policy": summary["policy"],
        "lengths": lengths,
        "load": load,
        "rps": rps,
        "submitted": summary["submitted"],
        "finished": summary["finished"],
        "request_goodput": good,
        "request_goodput_share": good / summary["submitted"],
        "token_goodput": good_tokens,
        "token_goodput_share": good_tokens / tokens,
        "attainment": {kind: float(v["attained"]) for kind, v in per_kind.items()},
        "per_kind": per_kind,
        "jain_tenant": float(summary["jain_tenant"]),
        "tdg_ratio": float(summary["tdg_ratio"]),
        "sim_wall_s": summary["sim_wall_s"],
    }


def _run_cell(
    mix: Trace,
    profile_name: str,
    seed: int,
    lengths: str,
    load: float,
    rps: float,
    policy: str,
    history: bool = False,
) -> dict[str, Any]:
    profile = load_profile(profile_name)
    workload = build_workload(mix, rps=rps, reference_profile=profile, seed=seed, lengths=lengths)
    config = ClusterConfig(
        [profile], CAPACITY_POLICY, CAPACITY_ROUTER, seed=seed, workflow_history=history
    )
    (summary,) = compare_policies(workload, config, [policy])
    tokens = sum(spec.output_tokens for spec in workload.specs)
    return cell_row(summary, lengths, load, rps, tokens)


def run_bench(cfg: GoodputConfig, log: Log) -> dict[str, Any]:
    """Mix, capacity, then every (lengths, load, policy) cell; everything the JSON holds."""
    profile = load_profile(cfg.profile)
    mix, info = build_mix([load_trace(t) for t in cfg.traces], profile, cfg.requests, cfg.seed)
    log(
        f"mix: {info.requests} requests {info.per_kind}, {info.workflows} workflows, "
        f"TPOT {info.tpot_s * 1e3:.0f} ms, deadlines "
        + ", ".join(f"{k} {v:.2f} s" for k, v in info.deadline_s.items())
    )
    config = ClusterConfig([profile], CAPACITY_POLICY, CAPACITY_ROUTER, seed=cfg.seed)
    capacity = find_capacity(mix, config, seed=cfg.seed, rel_tol=cfg.rel_tol)
    log(f"capacity {capacity.rps:.3f} req/s ({len(capacity.probes)} probes)")
    cells = [
        (
            mix,
            cfg.profile,
            cfg.seed,
            lengths,
            load,
            load * capacity.rps,
            policy,
            cfg.workflow_history,
        )
        for lengths in cfg.lengths
        for load in cfg.loads
        for policy in cfg.policies
    ]
    results: list[dict[str, Any]] = []
    if cfg.jobs > 1:
        with ProcessPoolExecutor(cfg.jobs) as pool:
            for row in pool.map(_run_cell, *zip(*cells, strict=True)):
                results.append(row)
                log(_progress(row, len(results), len(cells)))
    else:
        for cell in cells:
            results.append(_run_cell(*cell))
            log(_progress(results[-1], len(results), len(cells)))
    return {
        "config": asdict(cfg),
        "mix": asdict(info),
        "capacity": {**asdict(capacity), "probes": [list(p) for p in capacity.probes]},
        "results": results,
        "ratios": ratios(results),
    }


def _progress(row: dict[str, Any], done: int, total: int) -> str:
    return (
        f"[{done}/{total}] {row['lengths']} {row['load']:g}x {row['policy']}: "
        f"request goodput {row['request_goodput_share']:.3f} ({row['sim_wall_s']:.1f} s)"
    )


# ---- ratios and targets ------------------------------------------------------------------------


def is_gmax(policy: str) -> bool:
    return policy.startswith("gmax")


def deployable(policy: str) -> bool:
    return not policy_class(policy).uses_oracle_length


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def ratios(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (lengths, load), the target ratios of request goodput (NaN where a policy is absent)."""
    cells = {(r["lengths"], r["load"], r["policy"]): r for r in results}
    out = []
    for lengths, load in dict.fromkeys((r["lengths"], r["load"]) for r in results):
        here = {p: r for (m, x, p), r in cells.items() if (m, x) == (lengths, load)}

        def good(policy: str, here: dict[str, dict[str, Any]] = here) -> float:
            return float(here[policy]["request_goodput"]) if policy in here else math.nan

        others = [p for p in here if deployable(p) and not is_gmax(p)]
        best = max(others, key=good) if others else None
        gmax = good(TARGET)
        row: dict[str, Any] = {
            "lengths": lengths,
            "load": load,
            "gmax_over_fcfs": _div(gmax, good(FCFS)),
            "gmax_over_stock": _div(gmax, good(STOCK)),
            "best_non_gmax": best,
            "gmax_over_best": _div(gmax, good(best)) if best else math.nan,
            "gmax_over_oracle": _div(gmax, good(ORACLE)),
            "fair_jain": here[FAIR]["jain_tenant"] if FAIR in here else math.nan,
            "gmax_jain": here[TARGET]["jain_tenant"] if TARGET in here else math.nan,
            "fair_cost": 1.0 - _div(good(FAIR), gmax),
        }
        row["verdicts"] = verdicts(row)
        out.append(row)
    return out


def verdicts(row: dict[str, Any]) -> dict[str, str]:
    """Each target that applies to this cell: ``met`` or ``missed by X``; NaN: ``n/a``."""

    def check(value: float, bound: float, *, at_least: bool) -> str:
        if math.isnan(value):
            return "n/a"
        ok = value >= bound if at_least else value <= bound
        return "met" if ok else f"missed by {abs(value - bound):.3f}"

    out: dict[str, str] = {}
    if TARGET_LOADS[0] <= row["load"] <= TARGET_LOADS[1]:
        out["gmax_over_fcfs"] = check(row["gmax_over_fcfs"], GAIN_OVER_FCFS, at_least=True)
        out["gmax_over_best"] = check(row["gmax_over_best"], GAIN_OVER_BEST, at_least=True)
    out["gmax_over_oracle"] = check(row["gmax_over_oracle"], 1 - ORACLE_GAP, at_least=True)
    out["fair_jain"] = check(row["fair_jain"], FAIR_JAIN, at_least=True)
    out["fair_cost"] = check(row["fair_cost"], FAIR_COST, at_least=False)
    return out


# ---- reporting ---------------------------------------------------------------------------------


def _policies(results: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["policy"] for r in results))


def _loads(results: Sequence[dict[str, Any]]) -> list[float]:
    return sorted({r["load"] for r in results})


def _cell(r: dict[str, Any]) -> tuple[str, str, str]:
    att = "/".join(f"{r['attainment'].get(k, math.nan):.2f}" for k in KINDS)
    return (
        f"{r['request_goodput_share']:.3f} · {r['token_goodput_share']:.3f}",
        att,
        f"J {r['jain_tenant']:.2f}",
    )


def _ratio_lines(rows: Iterable[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    rows = list(rows)

    def fmt(key: str, digits: int = 2) -> list[str]:
        out = []
        for r in rows:
            text = f"{r[key]:.{digits}f}"
            verdict = r["verdicts"].get(key)
            out.append(f"{text} ({verdict})" if verdict not in (None, "n/a") else text)
        return out

    return [
        (f"{TARGET} / {FCFS} (≥ {GAIN_OVER_FCFS:g}x at 1.5–2x)", fmt("gmax_over_fcfs")),
        (f"{TARGET} / {STOCK}", fmt("gmax_over_stock")),
        (f"{TARGET} / best non-GMAX (≥ {GAIN_OVER_BEST:g}x at 1.5–2x)", fmt("gmax_over_best")),
        ("best non-GMAX", [str(r["best_non_gmax"]) for r in rows]),
        (f"{TARGET} / {ORACLE} (≥ {1 - ORACLE_GAP:g})", fmt("gmax_over_oracle", 3)),
        (f"{FAIR} Jain (≥ {FAIR_JAIN:g})", fmt("fair_jain", 3)),
        (f"{TARGET} Jain", fmt("gmax_jain", 3)),
        (f"{FAIR} goodput cost vs {TARGET} (≤ {FAIR_COST:.0%})", fmt("fair_cost", 3)),
    ]


def print_tables(data: dict[str, Any], out: Console) -> None:
    results, cap = data["results"], data["capacity"]
    for lengths in data["config"]["lengths"]:
        rows = [r for r in results if r["lengths"] == lengths]
        loads = _loads(rows)
        cells = {(r["policy"], r["load"]): r for r in rows}
        table = Table(
            title=f"goodput · --lengths {lengths} · {data['config']['profile']} · "
            f"{data['mix']['requests']} requests · capacity {cap['rps']:.3f} req/s",
            caption="request · token goodput (share) / attainment latency/deadline/compound / "
            "Jain over tenants",
        )
        table.add_column("policy")
        for load in loads:
            table.add_column(f"{load:g}x", justify="right")
        for policy in _policies(rows):
            table.add_row(
                policy,
                *("\n".join(_cell(cells[(policy, x)])) for x in loads),
                end_section=True,
            )
        out.print(table)
        ratio_rows = [r for r in data["ratios"] if r["lengths"] == lengths]
        ratio_table = Table(title=f"request-goodput ratios · --lengths {lengths}")
        ratio_table.add_column("ratio")
        for r in ratio_rows:
            ratio_table.add_column(f"{r['load']:g}x", justify="right")
        for label, values in _ratio_lines(ratio_rows):
            ratio_table.add_row(label, *values)
        out.print(ratio_table)


def markdown(data: dict[str, Any]) -> str:
    """The tables in Markdown (what docs/results.md shows)."""
    lines: list[str] = []
    for lengths in data["config"]["lengths"]:
        rows = [r for r in data["results"] if r["lengths"] == lengths]
        loads = _loads(rows)
        cells = {(r["policy"], r["load"]): r for r in rows}
        head = "| policy | " + " | ".join(f"{x:g}x" for x in loads) + " |"
        rule = "|---|" + "---:|" * len(loads)
        lines += [
            f"**`--lengths {lengths}`** — request · token goodput (share of submitted), "
            "attainment latency/deadline/compound, Jain over tenants:",
            "",
            head,
            rule,
        ]
        for policy in _policies(rows):
            lines.append(
                f"| {policy} | "
                + " | ".join("<br>".join(_cell(cells[(policy, x)])) for x in loads)
                + " |"
            )
        ratio_rows = [r for r in data["ratios"] if r["lengths"] == lengths]
        ratio_head = "| ratio | " + " | ".join(f"{x:g}x" for x in loads) + " |"
        lines += ["", f"Request-goodput ratios, `--lengths {lengths}`:", "", ratio_head, rule]
        for label, values in _ratio_lines(ratio_rows):
            lines.append(f"| {label} | " + " | ".join(values) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(data: dict[str, Any], out_dir: Path) -> list[Path]:
    """One goodput-vs-load PNG per lengths mode (request and token goodput share)."""
    from priority.sim.plot import plot_metrics_vs_load

    paths = []
    for lengths in data["config"]["lengths"]:
        path = out_dir / f"goodput-{lengths}.png"
        plot_metrics_vs_load(
            [r for r in data["results"] if r["lengths"] == lengths],
            path,
            metrics=(
                ("request_goodput_share", "request goodput (share on time)"),
                ("token_goodput_share", "token goodput (share on time)"),
            ),
            load_of=lambda r: float(r["load"]),
            x_label="load (× capacity)",
            title=f"JITServe mix · {data['config']['profile']} · --lengths {lengths}",
            highlight=TARGET,
        )
        paths.append(path)
    return paths


# ---- command line ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> tuple[GoodputConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--trace",
        type=csv,
        default=DEFAULT_TRACES,
        help=f"two or more traces (names or CSV paths; default {','.join(DEFAULT_TRACES)}; "
        "mooncake_conv also works)",
    )
    parser.add_argument(
        "--requests", type=int, default=DEFAULT_REQUESTS, help="first rows of each trace"
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="the one instance's profile")
    parser.add_argument(
        "--loads",
        type=load_multiples,
        default=DEFAULT_LOADS,
        help="load multiples of capacity (default 0.5,1,1.5,2,3)",
    )
    parser.add_argument(
        "--policy",
        type=lambda v: names(v, POLICY_NAMES, "policy"),
        default=POLICY_NAMES,
        help="policies (default: every registered one)",
    )
    parser.add_argument(
        "--lengths",
        type=lambda v: names(v, LENGTH_MODES, "lengths mode"),
        default=DEFAULT_LENGTHS,
        help="length-bound modes (default predicted,oracle)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rel-tol", type=float, default=0.05, help="capacity bisection tolerance (hi/lo - 1)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes for the cells")
    parser.add_argument(
        "--workflow-history",
        choices=("on", "off"),
        default="off",
        help="compound sub-deadlines from the run's finished workflows (on) or the cold start",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--markdown", type=Path, help="write the tables as Markdown here")
    parser.add_argument("--plot", type=Path, metavar="DIR", help="write goodput-vs-load PNGs here")
    args = parser.parse_args(argv)
    if len(args.trace) < 2:
        parser.error("the mix needs at least two traces")
    if args.requests < 3:
        parser.error("--requests must be at least 3 (one row of each kind)")
    if args.jobs < 1 or not args.rel_tol > 0:
        parser.error("--jobs must be >= 1 and --rel-tol > 0")
    cfg = GoodputConfig(
        traces=tuple(args.trace),
        requests=args.requests,
        profile=args.profile,
        loads=args.loads,
        policies=args.policy,
        lengths=args.lengths,
        seed=args.seed,
        rel_tol=args.rel_tol,
        jobs=args.jobs,
        workflow_history=args.workflow_history == "on",
    )
    return cfg, args


def strict_json(value: Any) -> Any:
    """``value`` with NaN (a ratio whose policy did not run) as null, for any JSON parser."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    started = time.perf_counter()
    data = run_bench(cfg, log=console.log)
    data["wall_s"] = round(time.perf_counter() - started, 1)
    console.log(f"wall time {data['wall_s']:.0f} s")
    text = json.dumps(strict_json(data), indent=1, allow_nan=False)
    if args.json:
        print(text)
    else:
        print_tables(data, Console())
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        console.log(f"wrote {args.out}")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(data))
        console.log(f"wrote {args.markdown}")
    if args.plot is not None:
        for path in plot(data, args.plot):
            console.log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
