"""SLOs-Serve: the admission planner, the policy's tiers, multi-stage attainment, Fig. 3."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.gain import slo_attained, token_deadlines
from priority.lengths.distribution import LengthDistribution
from priority.policies import make_policy
from priority.policies.base import EngineLimits, SchedulerInput, StepPlan, cdiv
from priority.policies.slos_batch import prefill_capacity, time2bs
from priority.policies.slos_planner import PlanItems, PlannerInput, plan_admission
from priority.policies.slos_serve import DECLINED_REASON, SlosServePolicy
from priority.request import SLO, Request, RequestStatus
from priority.sim import ClusterConfig, simulate
from priority.sim.compare import configure
from priority.sim.metrics import multistage_attainment
from tests.test_policy_properties import engine_states
from tests.test_scenarios import FIG3_PROFILE, fig3_workload, run_fig3

COEFFICIENTS = LatencyCoefficients(a_p=1e-8, b_p=2e-9, c_p=5e-5, a_d=2e-7, b_d=2e-4, t_c=5e-3)


def _estimator() -> BatchLatencyEstimator:
    return BatchLatencyEstimator(COEFFICIENTS)


def _items(deadline: list[float], work: list[float], load: float = 0.0, memory: int = 1) -> Any:
    n = len(deadline)
    return PlanItems(
        np.asarray(deadline, dtype=np.float64),
        np.asarray(work, dtype=np.float64),
        np.full(n, load),
        np.full(n, memory, dtype=np.int64),
    )


def _planner_input(candidates: PlanItems, **kw: Any) -> PlannerInput:
    base: dict[str, Any] = {
        "now": 0.0,
        "capacity": 1.0,
        "running_load": np.zeros(0),
        "running_end": np.zeros(0),
        "forced": PlanItems.empty(),
        "candidates": candidates,
        "free_memory": 10_000,
        "free_seats": 100,
    }
    base.update(kw)
    return PlannerInput(**base)


# ---- Fig. 3 ------------------------------------------------------------------------------------


def _meets(request: Request) -> bool:
    """First token by arrival + TTFT and token i by arrival + TTFT + (i - 1) TPOT: the per-token
    rule SLOs-Serve schedules by and Fig. 3 counts in time slots (so a token exactly at its slot
    boundary is on time, as in ``test_scenarios``)."""
    due = token_deadlines(request.arrival_s, request.slo, len(request.token_times))
    return request.is_finished and bool(np.all(np.asarray(request.token_times) <= due + 1e-9))


def run_fig3_slos_serve(**params: Any) -> dict[str, Request]:
    workload = fig3_workload()
    # the toy computes exactly 6 tokens per unit: a step lasts the whole TPOT, chunks of any size;
    # and it runs at exactly its capacity, so a first token must not start its decode before the
    # plan's line does (the policy's ``hold_first_token``, off by default for noisy engines)
    policy_params = {
        "tpot_share": 1.0,
        "min_chunk_tokens": 1,
        "hold_first_token": True,
        **params,
    }
    config = ClusterConfig(
        profiles=[FIG3_PROFILE],
        policy="slos-serve",
        router="round-robin",
        policy_params=policy_params,
    )
    run = simulate(workload, configure(config, "slos-serve", workload))
    assert all(r.is_finished for r in run.requests)
    return {r.request_id: r for r in run.requests}


def test_fig3_all_running_and_three_of_four_new_meet_their_slos() -> None:
    done = run_fig3_slos_serve()
    for rid in ("d1", "d2", "d3"):
        assert _meets(done[rid])
        # and by the simulator's strict metric (mean TPOT below 1 unit): they keep their pace
        assert slo_attained(done[rid].arrival_s, done[rid].slo, done[rid].token_times)
    new = [done[f"n{i}"] for i in (1, 2, 3, 4)]
    assert sum(_meets(r) for r in new) == 3
    # the fourth went best effort: served after the others, with what they left
    late = [r for r in new if not _meets(r)]
    assert late[0].token_times[0] > max(r.token_times[-1] for r in new if _meets(r)) - 1


def test_fig3_beats_prefill_first_and_decode_first() -> None:
    """The same rule applied to the baselines: prefill-first breaks the running streams,
    decode-first serves two of the new prompts in time (SLOs-Serve's comparison)."""
    prefill_first, decode_first = run_fig3("vllm-v0-fcfs"), run_fig3("sarathi-fcfs")
    assert not any(_meets(prefill_first[f"d{i}"]) for i in (1, 2, 3))
    assert all(_meets(decode_first[f"d{i}"]) for i in (1, 2, 3))
    assert sum(_meets(decode_first[f"n{i}"]) for i in (1, 2, 3, 4)) == 2


def test_fig3_without_holding_the_first_token_loses_the_third() -> None:
    """Emitting a first token early starts a decode the plan budgeted from the deadline on:
    the third new request is then late (why the toy holds the prompt's last token)."""
    done = run_fig3_slos_serve(hold_first_token=False)
    assert sum(_meets(done[f"n{i}"]) for i in (1, 2, 3, 4)) < 3


# ---- the planner --------------------------------------------------------------------------------


def test_plan_items_of_rows_keeps_each_column_and_its_type() -> None:
    items = PlanItems.of_rows([(2.0, 0.5, 0.1, 3), (1.0, 0.25, 0.0, 7)])
    assert len(items) == 2
    assert items.deadline.tolist() == [2.0, 1.0]
    assert items.work.tolist() == [0.5, 0.25]
    assert items.load.tolist() == [0.1, 0.0]
    assert items.memory.tolist() == [3, 7]
    assert items.deadline.dtype == np.float64 and items.memory.dtype == np.int64
    assert len(PlanItems.of_rows([])) == 0


def test_planner_admits_what_fits_by_the_deadline() -> None:
    # capacity 1 s/s, four prefills of 1 s due at 3 s: three fit
    result = plan_admission(_planner_input(_items([3.0, 3.0, 3.0, 3.0], [1.0] * 4)))
    assert result.accepted.sum() == 3
    assert result.method == "dp"


def test_planner_counts_decode_load_from_the_deadline_on() -> None:
    # by t=3: 1 s + 0.9 s of prefill plus the first one's decode, 0.5 s/s from t=1: 2.9 <= 3
    cands = _items([1.0, 3.0], [1.0, 0.9], load=0.5)
    assert plan_admission(_planner_input(cands)).accepted.tolist() == [True, True]
    cands = _items([1.0, 3.0], [1.0, 1.2], load=0.5)
    # 1 + 1.2 + 0.5 x 2 = 3.2 > 3: only one (without the decode load both would fit)
    assert plan_admission(_planner_input(cands)).accepted.sum() == 1


def test_planner_prefers_more_admissions_over_earlier_ones() -> None:
    # the long early one blocks two short later ones: declining it admits two
    cands = _items([1.0, 2.0, 2.0], [1.0, 0.6, 0.6])
    assert plan_admission(_planner_input(cands, capacity=0.6)).accepted.tolist() == [
        False,
        True,
        True,
    ]


def test_planner_keeps_forced_items_on_time() -> None:
    forced = _items([2.0], [1.5])
    cands = _items([1.0], [0.8])
    # alone the candidate fits by t=1, but then the forced prefill would be late at t=2
    result = plan_admission(_planner_input(cands, forced=forced))
    assert not result.accepted.any()


def test_planner_respects_running_decodes_ending() -> None:
    # a running decode takes 0.5 s/s until t=2, then nothing: a 1.8 s prefill due at 3 fits
    # (3 - 0.5 x 2 = 2 s of budget); had it run until t=5, only 1.5 s would be left
    cands = _items([3.0], [1.8])
    inp = _planner_input(cands, running_load=np.array([0.5]), running_end=np.array([2.0]))
    assert plan_admission(inp).accepted.tolist() == [True]
    inp = _planner_input(cands, running_load=np.array([0.5]), running_end=np.array([5.0]))
    assert plan_admission(inp).accepted.tolist() == [False]


def test_planner_falls_back_to_greedy_past_its_window() -> None:
    deadlines = [float(k) for k in range(1, 41)]
    cands = _items(deadlines, [0.5] * 40)
    result = plan_admission(_planner_input(cands), dp_window=8)
    assert result.method == "dp+greedy"
    assert result.accepted.all()  # everything fits: the greedy part admits the rest too
    exhausted = plan_admission(_planner_input(cands), time_budget_s=0.0)
    assert exhausted.method == "dp+greedy" and exhausted.accepted.all()


@st.composite
def planner_inputs(draw: st.DrawFn) -> PlannerInput:
    n = draw(st.integers(1, 30))
    nf = draw(st.integers(0, 5))
    floats = st.floats(0.0, 5.0)

    def items(k: int, *, forced: bool) -> PlanItems:
        return PlanItems(
            np.asarray([draw(floats) for _ in range(k)], dtype=np.float64),
            np.asarray([draw(st.floats(0.0, 1.0)) for _ in range(k)], dtype=np.float64),
            np.asarray([draw(st.floats(0.0, 0.2)) for _ in range(k)], dtype=np.float64),
            np.asarray([0 if forced else draw(st.integers(0, 50)) for _ in range(k)]),
        )

    nr = draw(st.integers(0, 4))
    return PlannerInput(
        now=0.0,
        capacity=draw(st.floats(0.1, 1.0)),
        running_load=np.asarray([draw(st.floats(0.0, 0.2)) for _ in range(nr)]),
        running_end=np.asarray([draw(st.floats(0.0, 10.0)) for _ in range(nr)]),
        forced=items(nf, forced=True),
        candidates=items(n, forced=False),
        free_memory=draw(st.integers(-10, 200)),
        free_seats=draw(st.integers(0, 30)),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inp=planner_inputs(), window=st.integers(0, 12))
def test_planner_never_admits_beyond_memory_or_seats(inp: PlannerInput, window: int) -> None:
    result = plan_admission(inp, dp_window=window)
    taken = result.accepted
    assert int(inp.candidates.memory[taken].sum()) <= max(inp.free_memory, 0)
    assert int(taken.sum()) <= max(inp.free_seats, 0)
    # every admitted prefill fits the budget by its deadline (EDF, forced ones included)
    items = sorted(
        [(d, w, ell) for d, w, ell in zip(*_cols(inp.forced), strict=True)]
        + [
            (d, w, ell)
            for (d, w, ell), ok in zip(zip(*_cols(inp.candidates), strict=True), taken, strict=True)
            if ok
        ]
    )
    forced_only = sorted(zip(*_cols(inp.forced), strict=True))
    for d, *_ in items:
        used = _demand(items, d, inp)
        alone = _demand(forced_only, d, inp)
        assert used <= max(_supply(inp, d), alone) + 1e-6


def _cols(items: PlanItems) -> tuple[list[float], list[float], list[float]]:
    return items.deadline.tolist(), items.work.tolist(), items.load.tolist()


def _demand(items: list[tuple[float, float, float]], at: float, inp: PlannerInput) -> float:
    return sum(w + ell * max(0.0, at - max(d, inp.now)) for d, w, ell in items if d <= at)


def _supply(inp: PlannerInput, at: float) -> float:
    running = sum(
        ell * max(0.0, min(at, end) - inp.now)
        for ell, end in zip(inp.running_load.tolist(), inp.running_end.tolist(), strict=True)
    )
    return inp.capacity * (at - inp.now) - running


# ---- the policy ---------------------------------------------------------------------------------


def _request(rid: str, *, arrival: float, prompt: int, ttft: float, tpot: float = 0.05) -> Request:
    return Request(
        rid,
        arrival_s=arrival,
        prompt_tokens=prompt,
        slo=SLO(ttft_s=ttft, tpot_s=tpot),
        max_output_tokens=4096,
        length=LengthDistribution.point(50, max_tokens=4096),
    )


def _running(rid: str, *, prompt: int, outputs: int, block_size: int = 16) -> Request:
    r = _request(rid, arrival=0.0, prompt=prompt, ttft=1.0)
    r.status = RequestStatus.RUNNING
    r.num_output_tokens = outputs
    r.num_computed_tokens = r.num_tokens - 1
    r.num_kv_blocks = cdiv(r.num_computed_tokens, block_size)
    r.token_times = [0.1 + 0.04 * i for i in range(outputs)]
    return r


def _policy(**params: Any) -> SlosServePolicy:
    policy = make_policy("slos-serve", _estimator(), **params)
    assert isinstance(policy, SlosServePolicy)
    return policy


def _run(policy: SlosServePolicy, inp: SchedulerInput) -> StepPlan:
    """Plan a step and run it: the policy commits what it decided once its plan ran."""
    plan = policy.schedule(inp)
    policy.on_step_end(plan, inp.now)
    return plan


def test_running_requests_are_always_kept() -> None:
    policy = _policy()
    running = [_running(f"r{i}", prompt=200, outputs=5) for i in range(4)]
    for r in running:
        policy.admitted.add(r.request_id)
    # a flood of impossible newcomers (prompts far beyond what their TTFT allows)
    waiting = [_request(f"w{i}", arrival=1.0, prompt=60_000, ttft=0.05) for i in range(20)]
    inp = SchedulerInput(
        now=1.0,
        running=running,
        waiting=waiting,
        limits=EngineLimits(
            token_budget=8192, max_num_seqs=64, block_size=16, num_free_blocks=100_000
        ),
    )
    plan = _run(policy, inp)
    assert {r.request_id for r in running} <= policy.admitted
    assert not plan.preempted
    assert {rid for rid, _ in plan.hopeless} == {w.request_id for w in waiting}
    assert all(reason == DECLINED_REASON for _, reason in plan.hopeless)


def test_declined_requests_go_best_effort_and_are_evicted_for_admitted_ones() -> None:
    policy = _policy()
    be = _running("be", prompt=200, outputs=3)
    policy.declined.add("be")
    fresh = _request("new", arrival=1.0, prompt=64, ttft=2.0)
    # KV for one of them only: the admitted newcomer takes the best-effort one's blocks
    inp = SchedulerInput(
        now=1.0,
        running=[be],
        waiting=[fresh],
        limits=EngineLimits(token_budget=8192, max_num_seqs=64, block_size=16, num_free_blocks=0),
    )
    plan = _run(policy, inp)
    assert "new" in policy.admitted
    assert [r.request_id for r in plan.preempted] == ["be"]
    assert [r.request_id for r, _ in plan.scheduled] == ["new"]


def test_best_effort_only_gets_the_leftover() -> None:
    policy = _policy()
    declined = _request("late", arrival=0.0, prompt=4000, ttft=0.01)  # already past its TTFT
    fresh = _request("new", arrival=1.0, prompt=4000, ttft=2.0)
    limits = EngineLimits(token_budget=4000, max_num_seqs=64, block_size=16, num_free_blocks=10_000)
    plan = _run(policy, SchedulerInput(1.0, [], [declined, fresh], limits))
    assert "late" in policy.declined and "new" in policy.admitted
    # the admitted prompt takes the whole token budget; nothing is left for best effort
    assert [r.request_id for r, _ in plan.scheduled] == ["new"]
    assert ("late", DECLINED_REASON) in plan.hopeless


def test_policy_never_admits_beyond_kv_at_the_length_bound() -> None:
    policy = _policy()
    # 10 blocks free; each newcomer needs 64 prompt + 50 bound tokens = 8 blocks of 16
    waiting = [_request(f"w{i}", arrival=1.0, prompt=64, ttft=5.0) for i in range(3)]
    limits = EngineLimits(token_budget=8192, max_num_seqs=64, block_size=16, num_free_blocks=10)
    _run(policy, SchedulerInput(1.0, [], waiting, limits))
    assert len(policy.admitted) == 1 and len(policy.declined) == 2


class _Drafting(Request):
    """A decode whose step also verifies ``drafts`` speculative tokens (as an engine shows it)."""

    drafts = 0

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.prompt_tokens + self.num_output_tokens - self.num_computed_tokens + self.drafts


def test_a_decode_is_granted_its_draft_tokens() -> None:
    policy = _policy()  # min_chunk_tokens 32: the token alone is no finished chunk of 4
    base = _running("spec", prompt=200, outputs=5)
    r = _Drafting(
        "spec",
        arrival_s=base.arrival_s,
        prompt_tokens=base.prompt_tokens,
        slo=base.slo,
        max_output_tokens=base.max_output_tokens,
        length=base.length,
    )
    r.status, r.num_output_tokens = base.status, base.num_output_tokens
    r.num_computed_tokens, r.num_kv_blocks = base.num_computed_tokens, base.num_kv_blocks
    r.token_times, r.drafts = base.token_times, 3
    policy.admitted.add("spec")
    limits = EngineLimits(token_budget=8192, max_num_seqs=64, block_size=16, num_free_blocks=100)
    plan = _run(policy, SchedulerInput(1.0, [r], [], limits))  # its token is due: urgent
    assert [(x.request_id, tokens) for x, tokens in plan.scheduled] == [("spec", 4)]


def test_an_admitted_request_is_evicted_only_for_one_admitted_before_it() -> None:
    policy = _policy()
    # both decode and need a new block (208 tokens = 13 full blocks), none is free; "old" was
    # admitted first, "resumed" (an earlier arrival, preempted and resumed) after it, and its
    # token is due first
    old = _running("old", prompt=200, outputs=9)
    old.arrival_s = 0.5
    resumed = _running("resumed", prompt=200, outputs=9)
    resumed.token_times = [t - 0.1 for t in resumed.token_times]
    for r in (old, resumed):
        policy.admitted.add(r.request_id)
    limits = EngineLimits(token_budget=8192, max_num_seqs=64, block_size=16, num_free_blocks=0)
    plan = _run(policy, SchedulerInput(1.0, [old, resumed], [], limits))
    # the later admitted one gives way, not the stream that kept running
    assert [r.request_id for r in plan.preempted] == ["resumed"]
    assert [(r.request_id, tokens) for r, tokens in plan.scheduled] == [("old", 1)]


def test_time2bs_is_the_estimators_inverse() -> None:
    est = _estimator()
    decodes = [500] * 10
    tokens = time2bs(est, 0.05, decodes, token_budget=8192)
    chunk = tokens - len(decodes)
    assert est.batch_time([(chunk, 0)], decodes) <= 0.05 + 1e-12
    assert est.batch_time([(chunk + 1, 0)], decodes) > 0.05
    assert time2bs(est, 0.001, decodes) == 0  # the decodes alone take longer
    assert prefill_capacity(est, 0.05) == pytest.approx(1 - COEFFICIENTS.t_c / 0.05)


# ---- multi-stage requests ---------------------------------------------------------------------


def test_a_multi_stage_request_attains_only_if_every_stage_does() -> None:
    def call(rid: str, workflow: str | None, stage: int) -> Request:
        return Request(rid, 0.0, 10, SLO(ttft_s=1.0, tpot_s=0.1), workflow_id=workflow, stage=stage)

    requests = [call("a0", "a", 0), call("a1", "a", 1), call("b0", "b", 0), call("c", None, 0)]
    # stage 1 of workflow a missed (its own TTFT after the tool call): a fails, b and c attain
    assert multistage_attainment(requests, [True, False, True, True]) == pytest.approx(2 / 3)
    assert multistage_attainment(requests, [True, True, True, True]) == 1.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inp=engine_states())
def test_every_request_is_admitted_or_best_effort_and_running_ones_stay(
    inp: SchedulerInput,
) -> None:
    policy = _policy()
    for r in inp.running[::2]:  # some running requests were admitted earlier, some declined
        policy.admitted.add(r.request_id)
    for r in inp.running[1::2]:
        policy.declined.add(r.request_id)
    before = set(policy.admitted)
    plan = _run(policy, inp)
    assert before <= policy.admitted  # an admission is never taken back
    assert not policy.admitted & policy.declined
    reported = {rid for rid, _ in plan.hopeless}
    for r in inp.waiting:
        decided = r.request_id in policy.admitted or r.request_id in policy.declined
        assert decided or r.kind == "best-effort"
        # the declined ones are reported with the reason, the admitted ones never
        assert (r.request_id in reported) == (
            r.request_id in policy.declined and r.kind != "best-effort"
        )
    # preemption takes a best-effort request before any admitted one
    victims = [r.request_id for r in plan.preempted]
    if any(not policy.is_best_effort(r) for r in plan.preempted):
        scheduled = {r.request_id for r, _ in plan.scheduled}
        assert all(
            r.request_id in victims or r.request_id in scheduled or not r.num_kv_blocks
            for r in inp.running
            if policy.is_best_effort(r)
        )
