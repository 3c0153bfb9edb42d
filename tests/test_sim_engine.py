"""Engine core: KV accounting, preemption/recompute, exact outputs, fast-forward equivalence."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.policies.base import (
    BatchBuilder,
    SchedulerInput,
    SchedulingPolicy,
    StepPlan,
    cdiv,
)
from priority.profiles import EngineConfig, Profile
from priority.request import SLO, Request, RequestStatus
from priority.routing.base import InstanceRole
from priority.sim.engine import EngineCore, PolicyViolation

COEFFS = LatencyCoefficients(a_p=1e-8, b_p=2e-9, c_p=5e-5, a_d=2e-7, b_d=2e-4, t_c=5e-3)


def make_profile(
    *,
    num_kv_blocks: int = 4096,
    block_size: int = 16,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    coefficients: LatencyCoefficients = COEFFS,
    name: str = "test-profile",
) -> Profile:
    return Profile(
        name=name,
        hardware="test",
        model="test",
        tensor_parallel=1,
        coefficients=coefficients,
        engine=EngineConfig(
            block_size=block_size,
            num_kv_blocks=num_kv_blocks,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
        ),
    )


class FcfsPolicy(SchedulingPolicy):
    """Decode/continue running requests in order (preempting the newest on KV shortage), then
    admit waiting requests in arrival order. Repeatable whenever the plan only continues
    decodes: a waiting request blocked now stays blocked while the decodes keep growing."""

    name: ClassVar[str] = "test-fcfs"

    def __init__(self, estimator: BatchLatencyEstimator, *, repeatable: bool = True) -> None:
        super().__init__(estimator)
        self.repeatable = repeatable
        self.step_ends = 0

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        builder = BatchBuilder(inp)
        running = list(inp.running)
        for request in running:
            if builder.is_scheduled(request):
                continue  # preempted earlier in this walk
            victims = [v for v in reversed(running) if v is not request]
            if builder.add_preempting(request, None, victims) == 0 and request.num_kv_blocks:
                builder.preempt(request)
                break
        admitted = 0
        if not builder.plan.preempted:
            for request in inp.waiting:
                if builder.add(request) == 0:
                    break
                admitted += 1
        plan = builder.plan
        plan.repeatable = (
            self.repeatable
            and not plan.preempted
            and admitted == 0
            and len(plan.scheduled) == len(running)
            and all(t == 1 and r.num_uncomputed_tokens == 1 for r, t in plan.scheduled)
        )
        return plan

    def on_step_end(self, plan: StepPlan, now: float) -> None:
        self.step_ends += 1


def make_request(
    i: int, arrival: float, prompt: int, output: int, *, weight: float = 1.0
) -> Request:
    return Request(
        request_id=f"r{i}",
        arrival_s=arrival,
        prompt_tokens=prompt,
        slo=SLO(ttft_s=1.0, tpot_s=0.1),
        weight=weight,
        max_output_tokens=output,
        true_output_tokens=output,
    )


def make_engine(
    profile: Profile | None = None,
    *,
    fast_forward: bool = True,
    noise_sigma: float = 0.0,
    seed: int = 0,
    repeatable: bool = True,
    role: InstanceRole = InstanceRole.COLOCATED,
) -> EngineCore:
    profile = profile or make_profile()
    return EngineCore(
        profile,
        FcfsPolicy(profile.estimator(), repeatable=repeatable),
        noise_sigma=noise_sigma,
        rng=np.random.default_rng(seed),
        name="test",
        role=role,
        fast_forward=fast_forward,
    )


def check_kv(engine: EngineCore) -> None:
    pool = engine.pool
    assert 0 <= pool.free <= pool.num_blocks
    assert sum(r.num_kv_blocks for r in engine.running) == pool.used
    for r in engine.running:
        assert r.num_kv_blocks >= cdiv(r.num_computed_tokens, pool.block_size)
    for r in engine.waiting:
        assert r.num_kv_blocks == 0 and r.num_computed_tokens == 0


def drive(engine: EngineCore, requests: Sequence[Request], *, check: bool = False) -> float:
    """Run ``requests`` (sorted by arrival) to completion on one engine; returns the end time.

    Arrivals use both mechanisms a caller has: ``until`` when starting a step and
    ``interrupt`` when a request lands during a fast-forward.
    """
    pending = deque(requests)
    now = 0.0
    while True:
        next_arrival = pending[0].arrival_s if pending else math.inf
        step = engine.in_flight
        if step is None and engine.has_work:
            step = engine.start_step(now, until=next_arrival)
            if check:
                check_kv(engine)
        if step is None:
            if not pending:
                return now
            now = next_arrival
            engine.add_request(pending.popleft(), now)
            continue
        if next_arrival <= step.end_s:
            now = next_arrival
            engine.add_request(pending.popleft(), now)
            engine.interrupt(now)
        else:
            now = step.end_s
            engine.finish_step(step)
            if check:
                check_kv(engine)


def staggered_requests(n: int = 12, seed: int = 1) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.3, size=n))
    return [
        make_request(i, float(t), int(rng.integers(1, 600)), int(rng.integers(1, 300)))
        for i, t in enumerate(arrivals)
    ]


def test_requests_finish_with_exactly_their_true_output() -> None:
    engine = make_engine()
    requests = staggered_requests()
    drive(engine, requests, check=True)
    for r in requests:
        assert r.status is RequestStatus.FINISHED
        assert r.num_output_tokens == len(r.token_times) == r.true_output_tokens
        assert r.token_times[0] > r.arrival_s
        assert all(b > a for a, b in zip(r.token_times, r.token_times[1:], strict=False))
        assert r.finished_s == r.token_times[-1]
    assert engine.pool.free == engine.pool.num_blocks
    assert engine.stats.prefill_tokens == sum(r.prompt_tokens for r in requests)


def test_tight_kv_preempts_and_recomputes() -> None:
    # 40 blocks x 16 = 640 tokens: four 100-token prompts fit, their 200-token outputs do not.
    engine = make_engine(make_profile(num_kv_blocks=40))
    requests = [make_request(i, 0.0, 100, 200) for i in range(4)]
    drive(engine, requests, check=True)
    assert engine.stats.preemptions > 0
    assert sum(r.num_preemptions for r in requests) == engine.stats.preemptions
    # Recompute re-prefills prompt + generated tokens: more prefill work than the prompts.
    assert engine.stats.prefill_tokens > sum(r.prompt_tokens for r in requests)
    for r in requests:
        assert r.num_output_tokens == len(r.token_times) == 200
        assert all(b > a for a, b in zip(r.token_times, r.token_times[1:], strict=False))
    assert engine.pool.free == engine.pool.num_blocks


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(
        st.tuples(st.integers(1, 300), st.integers(1, 200), st.floats(0.0, 2.0)),
        min_size=1,
        max_size=10,
    ),
    num_blocks=st.integers(32, 80),
    fast_forward=st.booleans(),
)
def test_kv_never_over_allocated(
    lengths: list[tuple[int, int, float]], num_blocks: int, fast_forward: bool
) -> None:
    engine = make_engine(make_profile(num_kv_blocks=num_blocks), fast_forward=fast_forward)
    arrivals = sorted(t for _, _, t in lengths)
    requests = [
        make_request(i, t, p, o)
        for i, ((p, o, _), t) in enumerate(zip(lengths, arrivals, strict=True))
    ]
    drive(engine, requests, check=True)
    for r in requests:
        if r in engine.rejected:
            assert r.token_times == [] and r.num_kv_blocks == 0
            continue
        assert r.is_finished and len(r.token_times) == r.true_output_tokens
    assert engine.pool.free == engine.pool.num_blocks


def test_oversize_request_is_rejected_and_a_just_fitting_one_runs() -> None:
    engine = make_engine(make_profile(num_kv_blocks=8))  # 128 tokens of KV
    too_big = make_request(0, 0.0, 100, 30)  # peak KV 129 tokens
    just_fits = make_request(1, 0.0, 100, 29)  # peak KV 128 tokens (the last token needs none)
    assert engine.add_request(too_big, 0.0) is False
    assert engine.add_request(just_fits, 0.0) is True
    drive(engine, [])
    assert engine.rejected == [too_big]
    assert too_big.token_times == [] and too_big.first_scheduled_s is None
    assert just_fits.is_finished and len(just_fits.token_times) == 29


def _token_times(engine: EngineCore, requests: list[Request]) -> list[list[float]]:
    drive(engine, requests)
    return [r.token_times for r in requests]


def test_fast_forward_is_bit_identical_without_noise() -> None:
    slow = make_engine(fast_forward=False)
    fast = make_engine(fast_forward=True)
    times_slow = _token_times(slow, staggered_requests())
    times_fast = _token_times(fast, staggered_requests())
    assert times_fast == times_slow
    assert fast.stats.steps == slow.stats.steps
    assert fast.stats.policy_calls < slow.stats.policy_calls  # it did fast-forward
    assert fast.policy.estimator.beta == slow.policy.estimator.beta
    assert isinstance(fast.policy, FcfsPolicy) and isinstance(slow.policy, FcfsPolicy)
    assert fast.policy.step_ends == slow.policy.step_ends == slow.stats.steps


def test_fast_forward_respects_tight_kv_exactly() -> None:
    profile = make_profile(num_kv_blocks=40)
    reqs = [make_request(i, 0.01 * i, 100, 200) for i in range(4)]
    slow, fast = make_engine(profile, fast_forward=False), make_engine(profile)
    assert _token_times(fast, reqs) == _token_times(
        slow, [make_request(i, 0.01 * i, 100, 200) for i in range(4)]
    )
    assert fast.stats.preemptions == slow.stats.preemptions > 0


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_non_repeatable_policy_is_unaffected_by_fast_forward(noise: float) -> None:
    off = make_engine(fast_forward=False, repeatable=False, noise_sigma=noise, seed=7)
    on = make_engine(fast_forward=True, repeatable=False, noise_sigma=noise, seed=7)
    assert _token_times(on, staggered_requests()) == _token_times(off, staggered_requests())
    assert on.stats.policy_calls == on.stats.steps


def test_free_blocks_at_matches_step_by_step_reports() -> None:
    """During a fast-forward, ``free_blocks_at`` equals what a stepping engine reported."""
    profile = make_profile(block_size=4)
    slow, fast = make_engine(profile, fast_forward=False), make_engine(profile)
    for engine in (slow, fast):
        for i in range(3):
            engine.add_request(make_request(i, 0.0, 10 + 3 * i, 40), 0.0)
    reports: list[tuple[float, int]] = []
    now = 0.0
    while slow.has_work:
        step = slow.start_step(now)
        assert step is not None
        slow.finish_step(step)
        now = step.end_s
        reports.append((now, slow.num_free_blocks))
    now = 0.0
    checked = 0
    while fast.has_work:
        step = fast.start_step(now)
        assert step is not None
        for end in step.end_times[:-1].tolist():
            probe = math.nextafter(end, math.inf)
            expected = [free for t, free in reports if t < probe][-1]
            assert fast.free_blocks_at(probe) == expected
            checked += 1
        fast.finish_step(step)
        now = step.end_s
    assert checked > 20


def test_noise_is_mean_one_and_beta_learns_it() -> None:
    engine = make_engine(noise_sigma=0.5, seed=3, fast_forward=False)
    for i in range(8):
        engine.add_request(make_request(i, 0.0, 50, 800), 0.0)
    ratios = []
    now = 0.0
    while engine.has_work:
        step = engine.start_step(now)
        assert step is not None
        ratios.append(step.duration_s / float(step.raw_predicted_s[0]))
        engine.finish_step(step)
        now = step.end_s
    assert len(ratios) >= 800
    assert abs(np.mean(ratios) - 1.0) < 0.06
    assert np.std(np.log(ratios)) == pytest.approx(0.5, rel=0.1)
    assert abs(engine.policy.estimator.beta - 1.0) < 0.25


def test_prefill_role_hands_off_after_the_first_token() -> None:
    prefill = make_engine(role=InstanceRole.PREFILL)
    decode = make_engine(role=InstanceRole.DECODE)
    request = make_request(0, 0.0, 300, 50)
    prefill.add_request(request, 0.0)
    step = prefill.start_step(0.0)
    assert step is not None
    outcome = prefill.finish_step(step)
    assert outcome.first_tokens == [request] and outcome.handoffs == [request]
    assert prefill.pool.free == prefill.pool.num_blocks and not prefill.has_work
    assert request.num_computed_tokens == 300 and request.num_output_tokens == 1
    assert decode.add_transferred(request, step.end_s + 0.01)
    now = step.end_s + 0.01
    while decode.has_work:
        s = decode.start_step(now)
        assert s is not None
        decode.finish_step(s)
        now = s.end_s
    assert request.is_finished and len(request.token_times) == 50
    assert decode.stats.prefill_tokens == 0 and decode.stats.decode_tokens == 49


def test_abort_frees_kv_and_skips_the_request() -> None:
    engine = make_engine()
    keep, drop = make_request(0, 0.0, 100, 20), make_request(1, 0.0, 100, 20)
    for r in (keep, drop):
        engine.add_request(r, 0.0)
    step = engine.start_step(0.0)
    assert step is not None and drop.num_kv_blocks > 0
    assert engine.abort("r1", 0.001) and not engine.abort("r1", 0.001)
    assert drop.num_kv_blocks == 0 and drop.is_finished
    engine.finish_step(step)
    assert drop.token_times == [] and keep.token_times == [step.end_s]
    drive(engine, [], check=True)
    assert len(keep.token_times) == 20 and engine.pool.free == engine.pool.num_blocks


class _GreedyPolicy(SchedulingPolicy):
    """Breaks the token budget on purpose."""

    name: ClassVar[str] = "test-greedy"

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        return StepPlan(scheduled=[(r, r.num_uncomputed_tokens) for r in inp.waiting])


def test_policy_violations_are_loud() -> None:
    profile = make_profile(max_num_batched_tokens=256)
    engine = EngineCore(profile, _GreedyPolicy(profile.estimator()), name="bad")
    engine.add_request(make_request(0, 0.0, 200, 5), 0.0)
    engine.add_request(make_request(1, 0.0, 200, 5), 0.0)
    with pytest.raises(PolicyViolation, match="exceed the budget"):
        engine.start_step(0.0)
