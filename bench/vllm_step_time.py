"""Scheduler time per step inside the real vLLM scheduler: stock vs ours, side by side.

    .ci/venvs/vllm-0.33/bin/python bench/vllm_step_time.py [--waiting 1024] [--running 256]
        [--steps 300] [--policy stock,vllm-v1,sarathi-priority,slide] [--kv ample,tight] [--json]

What a deployed plugin adds to every engine step is the whole of ``schedule()``: our plan, any
re-plans, and vLLM's own work on the plan. Each scheduler (stock vLLM, or ``TiergateScheduler``
with a policy) is brought to the same busy state — ``--running`` requests decoding (Azure
conversation prompt lengths, long outputs so none finishes during the run) and ``--waiting``
prompts queued behind them — and then stepped on a virtual clock. ``ample`` KV leaves the pool
mostly free; ``tight`` gives it 2% more blocks than the running requests hold at the start, so
decodes outgrow it within a few steps and the engine preempts and re-admits from then on.

The schedulers are stepped **interleaved** (one step of each in turn), so the noise of this
shared machine falls on all of them alike; the table reports p50/p99/mean of ``schedule()`` wall
time per step, re-plans, preemptions, and each policy's p50 over stock's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from engine_harness.replay import (
    FakeClock,
    build_scheduler,
    make_request,
    model_output,
    step_time,
    write_tiny_model,
)
from priority.profiles import load_profile
from priority.sim.traces import load_trace

PROFILE = "a100-qwen2-7b"
KV_MODES = ("ample", "tight")
TIGHT_HEADROOM = 1.02
AMPLE_BLOCKS = 67_659
BLOCK = 16
WARM_STEPS = 600
COEFFICIENTS = load_profile(PROFILE).coefficients


@dataclass
class Engine:
    label: str
    scheduler: Any
    clock: FakeClock
    times_s: list[float] = field(default_factory=list)
    preemptions: int = 0
    next_id: int = 0
    start_running: int = 0

    def add(self, prompt: int, max_tokens: int, weight: float) -> None:
        rid = f"{self.label}-{self.next_id}"
        self.next_id += 1
        extra = {"tiergate_weight": weight, "tiergate_ttft_ms": 2000.0, "tiergate_tpot_ms": 100.0}
        priority = -1 if weight > 1 else 0
        self.scheduler.add_request(
            make_request(
                rid,
                prompt,
                max_tokens,
                arrival_time=self.clock.t,
                extra_args=extra,
                priority=priority,
            )
        )

    def step(self, timed: bool) -> None:
        started = time.perf_counter()
        output = self.scheduler.schedule()
        elapsed = time.perf_counter() - started
        if timed:
            self.times_s.append(elapsed)
            self.preemptions += len(output.preempted_req_ids or ())
        self.clock.t += step_time(COEFFICIENTS, self.scheduler, output)
        self.scheduler.update_from_output(output, model_output(self.scheduler, output))

    @property
    def replans(self) -> int:
        driver = getattr(self.scheduler, "tiergate", None)
        return int(driver.replans) if driver is not None else 0


def prompt_lengths(n: int, rng: np.random.Generator) -> list[int]:
    """Prompt lengths drawn from the bundled Azure conversation sample (capped at 2,048)."""
    prompts = load_trace("azure_conv_20min").prompt_tokens
    return [int(min(2048, max(16, p))) for p in rng.choice(prompts, size=n)]


def build(label: str, model_dir: Path, num_blocks: int, running: int) -> Engine:
    clock = FakeClock(1000.0)
    if label == "stock":
        scheduler = build_scheduler(model_dir, num_blocks=num_blocks, max_num_seqs=running)
    elif label == "stock-priority":
        scheduler = build_scheduler(
            model_dir, num_blocks=num_blocks, max_num_seqs=running, stock_policy="priority"
        )
    else:
        scheduler = build_scheduler(
            model_dir,
            num_blocks=num_blocks,
            policy=label,
            profile=PROFILE,
            max_num_seqs=running,
            clock=clock,
        )
    return Engine(label, scheduler, clock)


def warm(engine: Engine, running: list[int], waiting: list[int], weights: list[float]) -> None:
    """Admit and prefill the running set (until nothing is left prefilling, or ``WARM_STEPS``
    under a tight pool, where a policy may keep some out), then queue the waiting prompts."""
    for prompt, weight in zip(running, weights, strict=False):
        engine.add(prompt, 4000, weight)
    for _ in range(WARM_STEPS):
        s = engine.scheduler
        if not s.waiting and all(r.num_computed_tokens == r.num_tokens - 1 for r in s.running):
            break
        engine.step(timed=False)
    engine.start_running = len(engine.scheduler.running)
    for prompt, weight in zip(waiting, weights[len(running) :], strict=False):
        engine.add(prompt, 4000, weight)


def measure(
    labels: list[str], kv: str, args: argparse.Namespace, model_dir: Path
) -> list[dict[str, Any]]:
    rng = np.random.default_rng(args.seed)
    running = prompt_lengths(args.running, rng)
    waiting = prompt_lengths(args.waiting, rng)
    weights = [float(w) for w in rng.choice([1.0, 2.0], size=args.running + args.waiting)]
    if kv == "ample":
        num_blocks = AMPLE_BLOCKS
    else:
        held = sum(-(-(p + 1) // BLOCK) for p in running)
        num_blocks = int(held * TIGHT_HEADROOM) + 1
    engines = [build(label, model_dir, num_blocks, args.running) for label in labels]
    for engine in engines:
        warm(engine, running, waiting, weights)
    for _ in range(args.steps):
        for engine in engines:  # interleaved: the machine's noise falls on all alike
            engine.step(timed=True)
    stock = next((e for e in engines if e.label == "stock"), None)
    stock_p50 = statistics.median(stock.times_s) if stock else None
    rows = []
    for engine in engines:
        ms = np.asarray(engine.times_s) * 1e3
        p50 = float(np.percentile(ms, 50))
        rows.append(
            {
                "policy": engine.label,
                "kv": kv,
                "kv_blocks": num_blocks,
                "running": engine.start_running,
                "waiting": args.waiting,
                "steps": args.steps,
                "p50_ms": round(p50, 3),
                "p99_ms": round(float(np.percentile(ms, 99)), 3),
                "mean_ms": round(float(ms.mean()), 3),
                "replans": engine.replans,
                "preemptions": engine.preemptions,
                "p50_over_stock": round(p50 / (stock_p50 * 1e3), 2) if stock_p50 else None,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiting", type=int, default=1024)
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--policy", default="stock,vllm-v1,sarathi-priority,slide")
    parser.add_argument("--kv", default=",".join(KV_MODES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    labels = [p for p in args.policy.split(",") if p]
    kvs = [k for k in args.kv.split(",") if k]
    if unknown := [k for k in kvs if k not in KV_MODES]:
        parser.error(f"unknown --kv {unknown}; known: {', '.join(KV_MODES)}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny_model(Path(tmp) / "model")
        for kv in kvs:
            rows += measure(labels, kv, args, model_dir)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    table = Table(title=f"schedule() per step, {args.running} running + {args.waiting} waiting")
    for column in (
        "kv",
        "policy",
        "p50 ms",
        "p99 ms",
        "mean ms",
        "p50 / stock",
        "re-plans",
        "preemptions",
    ):
        table.add_column(column, justify="left" if column in ("kv", "policy") else "right")
    for r in rows:
        table.add_row(
            f"{r['kv']} ({r['kv_blocks']})",
            r["policy"],
            f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            f"{r['mean_ms']:.3f}",
            str(r["p50_over_stock"]),
            str(r["replans"]),
            str(r["preemptions"]),
        )
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
