"""SLOs-Serve's metric per policy: serving capacity (the highest request rate at which >= 90% of
requests meet their SLO), one instance, on scenarios built from the public traces; and the
admission planner's time at 1,024 waiting + 256 running.

    python bench/slos_serve_capacity.py [--scenarios chat,coding,summary,tools]
        [--policies slos-serve,vllm-v1,sarathi-fcfs,slide,gmax] [--requests N]
        [--profile a100-qwen2-7b] [--seed S] [--rel-tol 0.05] [--planner-repeats K]
        [--skip-planner] [--skip-capacity] [--noise SIGMA] [--bound] [--json]

Scenarios (SLOs after SLOs-Serve Table 1/3: tight = 3x zero-load TTFT / 50 ms TPOT, loose = 5x /
100 ms; the first ``N`` requests of each trace, arrivals rescaled to each probed rate):

* ``chat`` — Azure conversation trace (``azure_conv``): loose prefill, loose decode;
* ``coding`` — Azure code trace (``azure_code``, bursty): loose prefill, tight decode;
* ``summary`` — arXiv-summarisation lengths (``arxiv``, long prompts) with Poisson arrivals:
  tight prefill, loose decode;
* ``tools`` — a tool-calling mix with stages, derived mechanically from ``azure_conv``: each
  trace row starts a workflow of 1-4 LLM calls (ToolBench's 2.7 +- 1.1 prefill-decode pairs,
  drawn from a seeded binomial); call k > 0 is a continuation — its prompt is the previous
  prompt + the previous output + a tool response (uniform 50-400 tokens), it arrives 0.5 s
  (the tool's time) after call k - 1 finished, and its output is the next trace row's (capped
  at 512). Tight prefill, loose decode. A workflow attains its SLO iff every call does
  (``multistage_attainment``); the rate counts calls.

Lengths reach the policies as the length predictor's distributions (``--lengths predicted``,
the measured error model), never as oracles. Capacity is bisected geometrically per policy
(doubling from the scenario's near-idle rate, then to ``rel_tol``); every probe replays the
same requests. Ratios are ``slos-serve`` over each other policy, then their geometric mean.

``--bound`` adds what no scheduler can beat on one instance (:func:`throughput_bound`): the rate
at which the engine, saturated, finishes the cheapest 90% of a scenario's requests — latency SLOs
ignored, so an upper bound on any policy's capacity (up to the tail after the last arrival).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from priority.gain import kind_attained
from priority.lengths.distribution import LengthDistribution
from priority.policies import make_policy
from priority.policies.slos_planner import plan_admission
from priority.policies.slos_serve import SlosServePolicy
from priority.profiles import Profile, load_profile
from priority.sim import ClusterConfig, simulate
from priority.sim.capacity import idle_rate, trace_first
from priority.sim.compare import configure
from priority.sim.metrics import multistage_attainment
from priority.sim.traces import Trace, load_trace
from priority.sim.workload import SloPolicy, Workload, build_workload

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
from scheduler_overhead import engine_state

SCENARIOS = ("chat", "coding", "summary", "tools")
POLICIES = ("slos-serve", "vllm-v1", "sarathi-fcfs", "slide", "gmax")
TARGET = 0.9
TIGHT = SloPolicy(ttft_scale=3.0, tpot_s=0.05)
LOOSE = SloPolicy(ttft_scale=5.0, tpot_s=0.1)
TOOL_THINK_S = 0.5


@dataclass(frozen=True)
class Scenario:
    name: str
    trace: Trace
    slo: SloPolicy


def tool_trace(base: Trace, count: int, rng: np.random.Generator) -> Trace:
    """The ``tools`` scenario's trace (see the module docstring)."""
    assert base.arrival_s is not None
    rows: list[tuple[float, int, int, str, int]] = []
    k = 0
    workflow = 0
    while len(rows) < count and k < len(base):
        calls = 1 + int(rng.binomial(3, 0.57))  # 1-4 calls, mean 2.7
        start = float(base.arrival_s[k])
        prompt = int(base.prompt_tokens[k])
        for stage in range(calls):
            if k >= len(base):
                break
            output = min(int(base.output_tokens[k]), 512)
            rows.append((start, prompt, output, f"w{workflow}", stage))
            prompt = prompt + output + int(rng.integers(50, 401))
            k += 1
        workflow += 1
    arrival, prompts, outputs, wids, stages = zip(*rows[:count], strict=True)
    n = len(arrival)
    return Trace(
        name="tools",
        arrival_s=np.asarray(arrival, dtype=np.float64),
        prompt_tokens=np.asarray(prompts, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        kind=["latency"] * n,
        workflow_id=list(wids),
        stage=np.asarray(stages, dtype=np.int64),
        think_s=np.where(np.asarray(stages) > 0, TOOL_THINK_S, 0.0).astype(np.float64),
    )


def scenarios(names: list[str], count: int, seed: int) -> list[Scenario]:
    out = []
    for name in names:
        # each scenario its own stream: its requests do not depend on which others are built
        rng = np.random.default_rng([seed, SCENARIOS.index(name) if name in SCENARIOS else 0])
        if name == "chat":
            out.append(Scenario(name, trace_first(load_trace("azure_conv"), count), LOOSE))
        elif name == "coding":
            trace = trace_first(load_trace("azure_code"), count)
            out.append(Scenario(name, trace, replace(LOOSE, tpot_s=TIGHT.tpot_s)))
        elif name == "summary":
            lengths = load_trace("arxiv")
            rows = rng.choice(len(lengths), size=count, replace=False)
            trace = replace(
                lengths,
                name="summary",
                prompt_tokens=lengths.prompt_tokens[rows],
                output_tokens=lengths.output_tokens[rows],
            )
            out.append(Scenario(name, trace, replace(TIGHT, tpot_s=LOOSE.tpot_s)))
        elif name == "tools":
            trace = tool_trace(load_trace("azure_conv"), count, rng)
            out.append(Scenario(name, trace, replace(TIGHT, tpot_s=LOOSE.tpot_s)))
        else:
            raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return out


def workload_at(scenario: Scenario, profile: Profile, rps: float, seed: int) -> Workload:
    return build_workload(
        scenario.trace,
        rps=rps,
        reference_profile=profile,
        seed=seed,
        slo=scenario.slo,
        lengths="predicted",
    )


def attainment(
    scenario: Scenario,
    profile: Profile,
    policy: str,
    rps: float,
    seed: int,
    params: dict[str, Any] | None = None,
    noise: float = 0.0,
) -> float:
    workload = workload_at(scenario, profile, rps, seed)
    config = ClusterConfig(
        profiles=[profile],
        policy=policy,
        router="round-robin",
        seed=seed,
        policy_params=params or {},
        noise_sigma=noise,
    )
    run = simulate(workload, configure(config, policy, workload))
    verdicts = [
        bool(r.token_times)
        and kind_attained(r.kind, r.arrival_s, r.slo, r.token_times, finished=r.is_finished)
        for r in run.requests
    ]
    return multistage_attainment(run.requests, verdicts)


def capacity(
    scenario: Scenario,
    profile: Profile,
    policy: str,
    seed: int,
    rel_tol: float,
    params: dict[str, Any] | None = None,
    noise: float = 0.0,
) -> tuple[float, list[tuple[float, float]]]:
    """Highest probed rate with attainment >= 90% (0 if even the near-idle rate misses)."""
    probes: list[tuple[float, float]] = []

    def ok(rps: float) -> bool:
        value = attainment(scenario, profile, policy, rps, seed, params, noise)
        probes.append((rps, value))
        return value >= TARGET

    start = idle_rate(scenario.trace, [profile])  # 5% of one-at-a-time service
    lo = start
    if ok(lo):
        hi = 2 * lo
        while ok(hi):
            lo, hi = hi, 2 * hi
    else:  # a bursty trace can miss even there: look lower before calling it zero
        hi, lo = lo, lo / 2
        while not ok(lo):
            hi, lo = lo, lo / 2
            if lo < start / 64:
                return 0.0, probes
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


def cheapest_share(trace: Trace, profile: Profile, share: float) -> Trace:
    """The trace without its costliest requests, whole workflows at a time, keeping at most
    ``share`` of the rows: cost is a request's isolated engine time (its prefill, and its decode
    tokens at their marginal cost in a batch), a workflow's the sum of its calls'."""
    est = profile.estimator()
    c = est.coefficients
    prompt = trace.prompt_tokens.astype(np.float64)
    output = trace.output_tokens.astype(np.float64)
    cost = est.request_times(trace.prompt_tokens, np.zeros_like(trace.prompt_tokens))
    cost = cost + output * (c.b_d + c.a_d * (prompt + output / 2))
    groups: dict[str, list[int]] = {}
    wids = trace.workflow_id or [None] * len(trace)
    for k, wid in enumerate(wids):
        groups.setdefault(wid if wid is not None else f"row{k}", []).append(k)
    kept: list[int] = []
    for rows in sorted(groups.values(), key=lambda rows: float(cost[rows].sum())):
        if len(kept) + len(rows) > share * len(trace):
            break
        kept += rows
    index = np.sort(np.asarray(kept, dtype=np.int64))

    def pick(column: Any) -> Any:
        if column is None or isinstance(column, str):
            return column
        if isinstance(column, np.ndarray):
            return column[index]
        return [column[k] for k in index.tolist()]

    return replace(trace, **{f.name: pick(getattr(trace, f.name)) for f in fields(trace)})


def throughput_bound(
    scenario: Scenario, profile: Profile, seed: int, share: float = TARGET
) -> float:
    """Requests per second of the scenario the saturated engine can serve with ``share`` of them
    (the cheapest, :func:`cheapest_share`) all submitted at once and batched as stock vLLM does:
    the scenario's request count over that makespan. A policy meeting the SLOs of ``share`` of
    the requests at a rate must finish them about as fast, so no capacity exceeds it by more than
    the tail after the last arrival."""
    kept = replace(scenario, trace=cheapest_share(scenario.trace, profile, share))
    at_once = 100.0 * len(scenario.trace)  # every first call within 10 ms
    workload = workload_at(kept, profile, at_once, seed)
    config = ClusterConfig(profiles=[profile], policy="vllm-v1", router="round-robin", seed=seed)
    run = simulate(workload, configure(config, "vllm-v1", workload))
    start = min(r.arrival_s for r in run.requests)
    end = max(r.token_times[-1] for r in run.requests if r.token_times)
    return len(scenario.trace) / (end - start)


def planner_timing(profile: Profile, repeats: int, seed: int) -> dict[str, float]:
    """p50/p99 of one admission plan (planner alone — wall and this thread's CPU time, which a
    busy machine does not inflate — and with the policy's input building) and of one whole
    step, at 1,024 waiting (all new) + 256 running."""
    rng = np.random.default_rng(seed)
    dp, dp_cpu, admit, step, methods = [], [], [], [], []
    for k in range(repeats):
        inp = engine_state(profile, 1024, 256, rng, tag=f"p{k}-")
        # seats for all of them: the planner must decide every candidate, not stop at a full engine
        inp = replace(inp, limits=replace(inp.limits, max_num_seqs=2048))
        for r in inp.running + inp.waiting:  # a length prediction, as the gateway sends one
            assert r.true_output_tokens is not None
            r.length = LengthDistribution.point(r.true_output_tokens * 1.2, max_tokens=4096)
        policy = make_policy("slos-serve", profile.estimator())
        assert isinstance(policy, SlosServePolicy)
        for r in inp.running:  # running requests were admitted before
            policy.admitted.add(r.request_id)
        step_s = policy.planning_step_seconds(inp)
        planner_inp, _ = policy.planner_input(inp, step_s)
        t0, c0 = time.perf_counter(), time.thread_time()
        result = plan_admission(
            planner_inp,
            dp_window=policy.params.dp_window,
            time_budget_s=policy.params.planner_budget_s,
        )
        dp.append(time.perf_counter() - t0)
        dp_cpu.append(time.thread_time() - c0)
        methods.append(result.method)
        t0 = time.perf_counter()
        policy.admit(inp, step_s)
        admit.append(time.perf_counter() - t0)
        fresh = make_policy("slos-serve", profile.estimator())
        assert isinstance(fresh, SlosServePolicy)
        fresh.admitted.update(r.request_id for r in inp.running)
        t0 = time.perf_counter()
        fresh.schedule(inp)
        step.append(time.perf_counter() - t0)

    def pct(values: list[float], q: float) -> float:
        return float(np.percentile(np.asarray(values) * 1e3, q))

    return {
        "planner_p50_ms": pct(dp, 50),
        "planner_p99_ms": pct(dp, 99),
        "planner_cpu_p99_ms": pct(dp_cpu, 99),
        "admit_p50_ms": pct(admit, 50),
        "admit_p99_ms": pct(admit, 99),
        "step_p50_ms": pct(step, 50),
        "step_p99_ms": pct(step, 99),
        "fallback_share": methods.count("dp+greedy") / len(methods),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--profile", default="a100-qwen2-7b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rel-tol", type=float, default=0.05)
    ap.add_argument("--planner-repeats", type=int, default=200)
    ap.add_argument("--skip-planner", action="store_true")
    ap.add_argument("--skip-capacity", action="store_true")
    ap.add_argument(
        "--policy-params",
        default="{}",
        help='JSON {"policy": {param: value}}, e.g. {"slos-serve": {"plan_margin_steps": 1}}',
    )
    ap.add_argument(
        "--noise", type=float, default=0.0, help="lognormal sigma of the true step times"
    )
    ap.add_argument(
        "--bound", action="store_true", help="add each scenario's throughput bound (see above)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    policies = [p for p in args.policies.split(",") if p]
    policy_params: dict[str, dict[str, Any]] = json.loads(args.policy_params)
    result: dict[str, Any] = {"profile": profile.name, "requests": args.requests}
    if not args.skip_capacity:
        table: dict[str, dict[str, float]] = {}
        for scenario in scenarios([s for s in args.scenarios.split(",") if s], args.requests, 0):
            row: dict[str, float] = {}
            for policy in policies:
                started = time.perf_counter()
                rps, probes = capacity(
                    scenario,
                    profile,
                    policy,
                    args.seed,
                    args.rel_tol,
                    policy_params.get(policy),
                    args.noise,
                )
                row[policy] = rps
                if not args.json:
                    print(
                        f"{scenario.name:8s} {policy:14s} capacity {rps:7.3f} req/s "
                        f"({len(probes)} probes, {time.perf_counter() - started:.0f} s)",
                        flush=True,
                    )
            table[scenario.name] = row
            if args.bound:
                bound = throughput_bound(scenario, profile, args.seed)
                result.setdefault("bound_rps", {})[scenario.name] = bound
                if not args.json:
                    print(
                        f"{scenario.name:8s} {'bound':14s} capacity {bound:7.3f} req/s", flush=True
                    )
        result["capacity_rps"] = table
        result["ratios"] = ratios(table, policies)
    if not args.skip_planner:
        result["planner"] = planner_timing(profile, args.planner_repeats, args.seed)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
    return 0


def ratios(table: dict[str, dict[str, float]], policies: list[str]) -> dict[str, dict[str, float]]:
    """slos-serve's capacity over each other policy's, per scenario and geometric mean."""
    out: dict[str, dict[str, float]] = {}
    if "slos-serve" not in policies:
        return out
    for other in policies:
        if other == "slos-serve":
            continue
        per = {
            name: row["slos-serve"] / row[other] if row[other] > 0 else math.inf
            for name, row in table.items()
        }
        finite = [v for v in per.values() if math.isfinite(v) and v > 0]  # both reached 90%
        per["geomean"] = (
            math.exp(statistics.fmean(math.log(v) for v in finite)) if finite else math.nan
        )
        out[other] = per
    return out


def report(result: dict[str, Any]) -> None:
    for other, per in result.get("ratios", {}).items():
        cells = "  ".join(f"{k} {v:.2f}x" for k, v in per.items())
        print(f"slos-serve / {other:14s} {cells}")
    table = result.get("capacity_rps", {})
    for name, bound in result.get("bound_rps", {}).items():
        row = table.get(name, {})
        cells = "  ".join(f"{p} {bound / v:.2f}x" for p, v in row.items() if v > 0)
        print(f"bound / capacity {name:8s} {cells}")
    planner = result.get("planner")
    if planner:
        print(
            "planner at 1024 waiting + 256 running: "
            + ", ".join(
                f"{k} {v:.3f}" if k != "fallback_share" else f"{k} {v:.2f}"
                for k, v in planner.items()
            )
        )


if __name__ == "__main__":
    sys.exit(main())
