"""Time per scheduling decision of every engine policy, and its ratio to the modelled step time.

    python bench/scheduler_overhead.py [--policy NAME] [--waiting N] [--running M] [--json]
        [--profile NAME] [--repeats K] [--seed S]

Default: every policy, waiting in {64, 256, 1024, 4096} with 256 running. Each decision is timed
on a fresh, realistic engine state (running requests mid-decode holding KV, waiting requests with
Azure-like prompt lengths, two tiers, SLOs from the profile), so sorting cannot be amortised
across calls. ``step_time_ms`` is the profile's estimate of the batch the policy planned.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from priority.gain import GainWeights
from priority.policies import POLICY_NAMES, make_policy
from priority.policies.base import EngineLimits, SchedulerInput, StepPlan, cdiv
from priority.profiles import Profile, load_profile
from priority.request import SLO, Request, RequestStatus

DEFAULT_WAITING = (64, 256, 1024, 4096)


@dataclass(frozen=True)
class Measurement:
    policy: str
    waiting: int
    running: int
    p50_ms: float
    p99_ms: float
    step_time_ms: float

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "waiting": self.waiting,
            "running": self.running,
            "p50_ms": round(self.p50_ms, 4),
            "p99_ms": round(self.p99_ms, 4),
            "step_time_ms": round(self.step_time_ms, 3),
        }


def engine_state(
    profile: Profile, num_waiting: int, num_running: int, rng: np.random.Generator, tag: str = ""
) -> SchedulerInput:
    """A busy engine: decodes in flight, a backlog of prompts, two tiers, mixed slack."""
    now = 1000.0
    block = profile.engine.block_size
    running: list[Request] = []
    used_blocks = 0
    for i in range(num_running):
        prompt = int(rng.integers(64, 2048))
        outputs = int(rng.integers(1, 400))
        slo = SLO(ttft_s=float(rng.uniform(1.0, 5.0)), tpot_s=float(rng.choice([0.05, 0.1])))
        arrival = now - slo.ttft_s - outputs * slo.tpot_s * float(rng.uniform(0.6, 1.2))
        req = Request(
            f"{tag}r{i}",
            arrival,
            prompt,
            slo,
            weight=float(rng.choice([1.0, 2.0])),
            tenant=f"t{i % 8}",
            true_output_tokens=outputs + int(rng.integers(1, 500)),
            max_output_tokens=4096,
        )
        req.status = RequestStatus.RUNNING
        req.num_output_tokens = outputs
        # most are decoding; one in eight is mid-way through a chunked prefill
        req.num_computed_tokens = (
            req.num_tokens - 1 if i % 8 else int(rng.integers(1, max(2, prompt // 2)))
        )
        if i % 8 == 0:
            req.num_output_tokens = 0
            req.num_computed_tokens = min(req.num_computed_tokens, prompt - 1)
        req.num_kv_blocks = cdiv(req.num_computed_tokens, block)
        req.tokens_since_resume = outputs
        used_blocks += req.num_kv_blocks
        running.append(req)
    waiting: list[Request] = []
    for j in range(num_waiting):
        slo = SLO(ttft_s=float(rng.uniform(1.0, 5.0)), tpot_s=float(rng.choice([0.05, 0.1])))
        waiting.append(
            Request(
                f"{tag}w{j}",
                now - float(rng.uniform(0.0, 3.0)),
                int(rng.integers(16, 4096)),
                slo,
                weight=float(rng.choice([1.0, 2.0])),
                tenant=f"t{j % 8}",
                true_output_tokens=int(rng.integers(1, 1000)),
                max_output_tokens=4096,
            )
        )
    free = max(0, profile.engine.num_kv_blocks - used_blocks)
    limits = EngineLimits(
        token_budget=profile.engine.max_num_batched_tokens,
        max_num_seqs=max(profile.engine.max_num_seqs, num_running),
        block_size=block,
        num_free_blocks=free,
    )
    return SchedulerInput(now=now, running=running, waiting=waiting, limits=limits)


def planned_step_time(profile: Profile, plan: StepPlan) -> float:
    est = profile.estimator()
    prefill: list[tuple[int, int]] = []
    decode: list[int] = []
    for request, tokens in plan.scheduled:
        if tokens == 1 and request.num_uncomputed_tokens == 1:
            decode.append(request.num_computed_tokens)
        else:
            prefill.append((tokens, request.num_computed_tokens))
    return est.batch_time(prefill, decode)


def measure(
    policy_name: str, profile: Profile, num_waiting: int, num_running: int, repeats: int, seed: int
) -> Measurement:
    rng = np.random.default_rng(seed)
    states = [
        engine_state(profile, num_waiting, num_running, rng, tag=f"s{k}-")
        for k in range(min(repeats, 8))
    ]
    gain = GainWeights.from_lengths(1155.0, 211.0)
    params: dict[str, object] = {"gain_weights": gain} if policy_name == "slide" else {}
    policy = make_policy(policy_name, profile.estimator(), **params)
    for state in states:
        # warm-up: imports, and per-request caches a real engine fills once per request
        policy.schedule(state)
    samples: list[float] = []
    steps: list[float] = []
    for k in range(repeats):
        state = states[k % len(states)]
        start = time.perf_counter()
        plan = policy.schedule(state)
        samples.append((time.perf_counter() - start) * 1e3)
        if k < len(states):
            steps.append(planned_step_time(profile, plan) * 1e3)
    samples.sort()
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    return Measurement(
        policy_name,
        num_waiting,
        num_running,
        statistics.median(samples),
        p99,
        statistics.median(steps),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", help="policy name (repeatable); default all")
    parser.add_argument(
        "--waiting", type=int, action="append", help="waiting requests (repeatable)"
    )
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--profile", default="a100-qwen2-7b")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    args = parser.parse_args(argv)

    policies = args.policy or list(POLICY_NAMES)
    for name in policies:
        if name not in POLICY_NAMES:
            parser.error(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    waiting = args.waiting or list(DEFAULT_WAITING)
    profile = load_profile(args.profile)
    results = [
        measure(name, profile, w, args.running, args.repeats, args.seed)
        for name in policies
        for w in waiting
    ]
    if args.json:
        json.dump([m.as_dict() for m in results], sys.stdout, indent=2)
        print()
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Scheduling decision time ({args.profile}, {args.running} running)")
    for col in ("policy", "waiting", "p50 ms", "p99 ms", "step ms", "p99 / step"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for m in results:
        ratio = m.p99_ms / m.step_time_ms if m.step_time_ms > 0 else float("nan")
        table.add_row(
            m.policy,
            str(m.waiting),
            f"{m.p50_ms:.3f}",
            f"{m.p99_ms:.3f}",
            f"{m.step_time_ms:.1f}",
            f"{ratio:.2%}",
        )
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
