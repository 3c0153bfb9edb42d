"""Re-planning is safe: the vLLM adapter may call a policy's ``schedule()`` more than once per step.

``engine_common.scheduler`` re-plans a step without a request vLLM's admission rule would refuse,
and reports only the executed plan to ``on_step_end``. So every policy's ``schedule()`` must leave
its committed state alone (what the next decisions depend on; pure per-request memos and the
record of its own proposals aside), and a step planned twice must unfold exactly like the same step
planned once without the refused request. The policy-level tests run in the main environment;
the last one checks the adapter inside the real vLLM scheduler (``.ci/engines.sh``).
"""

from __future__ import annotations

import random
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from priority.estimator import BatchLatencyEstimator
from priority.policies import POLICY_NAMES, SchedulingPolicy, make_policy
from priority.policies.base import (
    PER_CHUNK_ADMISSION,
    EngineLimits,
    SchedulerInput,
    StepPlan,
    cdiv,
)
from priority.policies.lengthaware import KindColumns
from priority.profiles import load_profile
from priority.request import SLO, Request, RequestStatus

BLOCK = 16
STEP_S = 0.02
COEFFICIENTS = load_profile("a100-qwen2-7b").coefficients

TRANSIENT = {
    "_planned_at": "RR-SJF's plans awaiting on_step_end (idem)",
    "_last_executed": "RR-SJF's last plan reported (fast-forward repeats its report)",
    "_columns": "SlideBatching's static per-request columns (a memo keyed by request object)",
    "lengths": "the oracle policies' noisy-length draws (seeded by request id, memoised)",
    "columns": "GMAX's and Tempo's per-request column table (a memo keyed by request id)",
    "_boundary_plan": "GMAX's/Tempo's plan at a frame boundary (the frame restarts only if it ran)",
    "_charges": "GMAX-fair's per-plan tenant charges awaiting on_step_end (only the plan that ran)",
    "_proposed_counters": "GMAX-fair's counters as the plan being built would leave them",
    "_proposals": "WVTC's and SLOs-Serve's plans awaiting on_step_end (only the plan that ran)",
    "_bounds": "SLOs-Serve's per-request length bounds (a memo keyed by request id)",
    "_tau": "SLOs-Serve's per-request TPOTs (a memo keyed by request id)",
    "last_admission": "SLOs-Serve's latest planner result, reported for benches",
}


class Executor:
    """A small engine applying plans as the contract in ``policies/base.py`` says.

    Seeded: two executors of one seed hold equal requests and evolve identically under equal
    plans. The KV pool is small and tenants, weights and SLOs differ, so plans preempt, admit
    and reorder, and new tenants join the queue over time (VTC's counter lift).
    """

    def __init__(self, seed: int, *, blocks: int = 40, budget: int = 192, seqs: int = 5) -> None:
        rng = random.Random(seed)
        weights = {"t0": 1.0, "t1": 2.0, "t2": 0.5, "t3": 1.0}
        self.pending = sorted(
            (
                Request(
                    f"r{i}",
                    arrival_s=round(rng.uniform(0.0, 0.4), 3),
                    prompt_tokens=rng.randint(8, 220),
                    slo=SLO(ttft_s=rng.choice([0.1, 0.3, 1.0]), tpot_s=rng.choice([0.03, 0.1])),
                    weight=weights[f"t{i % 4}"],
                    tier=f"tier{i % 2}",
                    tenant=f"t{i % 4}",
                    max_output_tokens=64,
                    true_output_tokens=rng.randint(2, 14),
                )
                for i in range(16)
            ),
            key=lambda r: r.arrival_s,
        )
        self.blocks, self.budget, self.seqs = blocks, budget, seqs
        self.now = 0.0
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.finished = 0

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.running or self.waiting)

    def arrive(self) -> None:
        while self.pending and self.pending[0].arrival_s <= self.now:
            self.waiting.append(self.pending.pop(0))

    def input(self, *, without: str | None = None) -> SchedulerInput:
        free = self.blocks - sum(r.num_kv_blocks for r in self.running)
        limits = EngineLimits(self.budget, self.seqs, BLOCK, free)
        waiting = [r for r in self.waiting if r.request_id != without]
        return SchedulerInput(self.now, list(self.running), waiting, limits)

    def apply(self, plan: StepPlan, policy: SchedulingPolicy) -> None:
        for r in plan.preempted:
            r.status, r.num_computed_tokens, r.num_kv_blocks = RequestStatus.WAITING, 0, 0
            r.num_preemptions += 1
            r.tokens_since_resume = 0
            self.running.remove(r)
            self.waiting.append(r)
        self.now = round(self.now + STEP_S, 6)
        for r, tokens in plan.scheduled:
            if r.status is RequestStatus.WAITING:
                self.waiting.remove(r)
                self.running.append(r)
                r.status = RequestStatus.RUNNING
            r.num_computed_tokens += tokens
            r.num_kv_blocks = cdiv(r.num_computed_tokens, BLOCK)
            if r.num_computed_tokens == r.num_tokens:
                r.num_output_tokens += 1
                r.tokens_since_resume += 1
                r.token_times.append(self.now)
                if r.num_output_tokens >= r.target_output_tokens:
                    r.status, r.finished_s = RequestStatus.FINISHED, self.now
                    self.running.remove(r)
                    self.finished += 1
        assert sum(r.num_kv_blocks for r in self.running) <= self.blocks
        if plan.scheduled:
            policy.on_step_end(plan, self.now)
        else:
            self.now = round(self.now + STEP_S, 6)  # idle until something changes


def summary(plan: StepPlan) -> tuple[Any, ...]:
    return (
        [(r.request_id, tokens) for r, tokens in plan.scheduled],
        sorted(r.request_id for r in plan.preempted),
        plan.time_budget_s,
        plan.num_urgent,
        plan.repeatable,
    )


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | deque):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, BatchLatencyEstimator | KindColumns):
        return _plain(vars(value))
    if isinstance(value, np.ndarray):  # by bytes: unused rows of a column table may hold NaN
        return (value.dtype.str, value.shape, value.tobytes())
    if callable(value):
        return repr(value)
    return value


def committed(policy: SchedulingPolicy) -> dict[str, Any]:
    """Everything the policy's next decisions depend on, as plain comparable values."""
    return {k: _plain(v) for k, v in vars(policy).items() if k not in TRANSIENT}


def refused_request(plan: StepPlan, inp: SchedulerInput) -> str | None:
    """The request a vLLM refusal would take out: the plan's first admission (else the first
    waiting request, so the re-plan still sees a different queue)."""
    admitted = [r.request_id for r, _ in plan.scheduled if r.status is RequestStatus.WAITING]
    if admitted:
        return admitted[0]
    return inp.waiting[0].request_id if inp.waiting else None


def policy(name: str) -> SchedulingPolicy:
    return make_policy(name, BatchLatencyEstimator(COEFFICIENTS))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_planning_a_step_twice_gives_the_same_plan_and_changes_no_state(
    name: str, seed: int
) -> None:
    engine, p = Executor(seed), policy(name)
    checked = 0
    for _ in range(400):
        if not engine.busy:
            break
        engine.arrive()
        inp = engine.input()
        before = committed(p)
        first = p.schedule(inp)
        after_first = committed(p)
        second = p.schedule(inp)
        assert summary(second) == summary(first)
        assert committed(p) == after_first == before
        checked += bool(first.scheduled)
        engine.apply(second, p)
    assert checked > 5 and not engine.busy


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_replanning_without_a_refused_request_equals_planning_once(name: str, seed: int) -> None:
    """Engine A plans each step with every waiting request, then again without the one vLLM
    would refuse, and runs the second plan; engine B only ever plans the second input."""
    a, b = Executor(seed), Executor(seed)
    pa, pb = policy(name), policy(name)
    replanned = 0
    for step in range(400):
        if not a.busy:
            break
        a.arrive()
        b.arrive()
        first = pa.schedule(a.input())
        # every other step, so that a refused request is admitted in between
        refused = refused_request(first, a.input()) if step % 2 else None
        plan_a = pa.schedule(a.input(without=refused))
        plan_b = pb.schedule(b.input(without=refused))
        assert summary(plan_a) == summary(plan_b)
        replanned += summary(first) != summary(plan_a)
        a.apply(plan_a, pa)
        b.apply(plan_b, pb)
        assert committed(pa) == committed(pb)
    assert not a.busy and a.finished == b.finished == 16
    assert replanned > 3, "the scenario must make re-planning change plans"


# ---- the adapter inside the real vLLM scheduler (run by .ci/engines.sh) -----------------------


@pytest.mark.vllm
@pytest.mark.usefixtures("tiergate_env")
def test_adapter_reports_only_the_executed_plan(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt whose whole sequence cannot fit the free blocks is refused by vLLM while a
    policy planning with per-chunk admission admits it (the adapter hands policies vLLM's rule;
    here it is withheld to exercise the safety net): the adapter re-plans, and ``on_step_end``
    sees exactly the plans that ran, once each, in order."""
    harness = pytest.importorskip("vllm_harness")
    from engine_cuda.scheduler import TiergateScheduler

    monkeypatch.setenv("TIERGATE_POLICY", "wvtc")
    clock = harness.FakeClock(1000.0)
    config = harness.make_config(
        tiny_model_dir, num_blocks=24, max_num_seqs=4, max_num_batched_tokens=128
    )
    scheduler = harness.make_scheduler(TiergateScheduler, config)
    scheduler.tiergate.clock = clock
    scheduler.tiergate.admission = PER_CHUNK_ADMISSION
    p = scheduler.tiergate.policy
    made: list[StepPlan] = []
    ended: list[StepPlan] = []
    executed: list[StepPlan | None] = []
    plan_once, end_once = p.schedule, p.on_step_end

    def schedule(inp: SchedulerInput) -> StepPlan:
        made.append(plan_once(inp))
        return made[-1]

    def on_step_end(plan: StepPlan, now: float) -> None:
        ended.append(plan)
        end_once(plan, now)

    seen = 0

    def on_step(_scheduler: Any, _output: Any) -> None:
        nonlocal seen
        executed.append(made[-1] if len(made) > seen else None)  # the step's last plan
        seen = len(made)

    monkeypatch.setattr(p, "schedule", schedule)
    monkeypatch.setattr(p, "on_step_end", on_step_end)
    slo = {"tiergate_ttft_ms": 2000, "tiergate_tpot_ms": 100}
    arrivals = [
        harness.Arrival(1000.0, "holder", 200, 30, {**slo, "tiergate_tenant": "a"}),
        harness.Arrival(1000.05, "too-long", 300, 4, {**slo, "tiergate_tenant": "b"}),
        harness.Arrival(1000.06, "small", 20, 4, {**slo, "tiergate_tenant": "c"}),
    ]
    trace = harness.run_trace(scheduler, arrivals, COEFFICIENTS, clock, on_step=on_step)
    for arrival in arrivals:
        assert len(trace.token_times[arrival.request_id]) == arrival.max_tokens
    ran = [plan for plan in executed if plan is not None]
    assert len(made) > len(ran), "vLLM's admission rule was expected to force re-plans"
    assert len(ended) == len(ran) and all(e is r for e, r in zip(ended, ran, strict=True))
    # the refused prompt did not hold back the small one: admitted while the long one waited
    first_small = next(k for k, batch in enumerate(trace.batches) if "small" in batch)
    assert all("too-long" not in batch for batch in trace.batches[: first_small + 1])
    assert scheduler.tiergate.state.plan_deviations == 0
    assert scheduler.tiergate.replans == len(made) - len(ran)
