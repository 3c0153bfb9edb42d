"""GMAX's window and preemption rules, Tempo's order, on worked examples."""

from __future__ import annotations

import numpy as np
import pytest

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.lengths.distribution import LengthDistribution
from priority.policies import make_policy
from priority.policies.base import EngineLimits, SchedulerInput, StepPlan, cdiv
from priority.policies.gmax import GmaxParams, GmaxPolicy
from priority.request import SLO, Request, RequestStatus

COEFFICIENTS = LatencyCoefficients(a_p=1e-8, b_p=2e-9, c_p=5e-5, a_d=2e-7, b_d=2e-4, t_c=5e-3)
LAX = SLO(deadline_s=1000.0)


def _estimator() -> BatchLatencyEstimator:
    return BatchLatencyEstimator(COEFFICIENTS)


def _running(rid: str, prompt: int, outputs: int, length: int, block_size: int = 16) -> Request:
    r = Request(rid, 0.0, prompt, LAX, length=LengthDistribution.point(length))
    r.status = RequestStatus.RUNNING
    r.num_output_tokens = outputs
    r.num_computed_tokens = r.num_tokens - 1
    r.num_kv_blocks = cdiv(r.num_computed_tokens, block_size)
    return r


def _waiting(rid: str, prompt: int, length: int, slo: SLO = LAX, arrival: float = 1.0) -> Request:
    return Request(rid, arrival, prompt, slo, length=LengthDistribution.point(length))


def test_window_groups_similar_lengths() -> None:
    """prio 10, 9.6, 9.9, 9.7 with prompt lengths 100, 500, 2000, 110 and two seats.

    B-th highest = 9.9, cut-off 0.95 · 9.9 = 9.405: all four are candidates. By length:
    100 (10), 110 (9.7), 500 (9.6), 2000 (9.9); pairs sum to 19.7, 19.3, 19.5, so the window is
    the 100- and 110-token prompts — not the top two by priority (10 and 9.9, 100 vs 2000).
    """
    policy = GmaxPolicy(_estimator(), GmaxParams(cutoff=0.95))
    prio = np.array([10.0, 9.6, 9.9, 9.7])
    lengths = np.array([100.0, 500.0, 2000.0, 110.0])
    assert policy.window(prio, lengths, 2).tolist() == [0, 3]
    # a strict cut-off (p = 1) keeps only the top two: the window is exactly them
    assert GmaxPolicy(_estimator(), GmaxParams(cutoff=1.0)).window(prio, lengths, 2).tolist() == [
        0,
        2,
    ]
    # fewer candidates than seats: all of them
    assert policy.window(prio[:2], lengths[:2], 3).tolist() == [0, 1]


def _one_seat_state() -> SchedulerInput:
    victim = _running("long", prompt=100, outputs=10, length=1000)
    fresh = _waiting("short", prompt=50, length=5)
    limits = EngineLimits(token_budget=512, max_num_seqs=1, block_size=16, num_free_blocks=100)
    return SchedulerInput(now=2.0, running=[victim], waiting=[fresh], limits=limits)


def test_frame_boundary_preempts_a_much_worse_victim_once_per_frame() -> None:
    """One seat; the runner has ~990 tokens to go, the newcomer 5. At the frame boundary the
    newcomer's goodput (1 request) beats the victim's stall loss (recompute time ÷ step time ×
    1/990 per token) and its priority is far above 1.1× the victim's: preempt and admit.
    Inside the frame (after one executed step) the same state preempts nothing."""
    policy = GmaxPolicy(_estimator(), GmaxParams(slack_weight=0.0, aging=0.0, frame_steps=50))
    inp = _one_seat_state()
    plan = policy.schedule(inp)
    assert [r.request_id for r in plan.preempted] == ["long"]
    assert [r.request_id for r, _ in plan.scheduled] == ["short"]
    policy.on_step_end(plan, 2.1)  # a frame starts with the executed boundary step
    again = policy.schedule(_one_seat_state())
    assert not again.preempted
    assert [r.request_id for r, _ in again.scheduled] == ["long"]


def test_preemption_needs_the_priority_margin() -> None:
    policy = GmaxPolicy(_estimator(), GmaxParams(slack_weight=0.0, aging=0.0, preempt_margin=1e6))
    plan = policy.schedule(_one_seat_state())
    assert not plan.preempted
    assert [r.request_id for r, _ in plan.scheduled] == ["long"]


def test_hopeless_requests_are_demoted_and_reported() -> None:
    """Two waiting, one seat: the one that cannot finish in 10 ms yields to the feasible one
    even though it is shorter, and is reported with its reason."""
    doomed = _waiting("doomed", prompt=400, length=50, slo=SLO(deadline_s=0.01), arrival=2.0)
    fine = _waiting("fine", prompt=400, length=200, arrival=2.0)
    limits = EngineLimits(token_budget=2048, max_num_seqs=1, block_size=16, num_free_blocks=100)
    inp = SchedulerInput(now=2.0, running=[], waiting=[doomed, fine], limits=limits)
    plan = GmaxPolicy(_estimator()).schedule(inp)
    assert [r.request_id for r, _ in plan.scheduled] == ["fine"]
    assert plan.hopeless == [("doomed", "deadline_unreachable")]


def test_slack_term_serves_the_tight_request_first() -> None:
    """Same length and value; one has 1000 s of slack, the other little: with the slack-aware
    term the tight one takes the only seat, without it (the published rule) arrival order does."""
    lax = _waiting("lax", prompt=100, length=100, arrival=1.0)
    tight = _waiting("tight", prompt=100, length=100, slo=SLO(deadline_s=2.0), arrival=1.0)
    limits = EngineLimits(token_budget=2048, max_num_seqs=1, block_size=16, num_free_blocks=100)
    inp = SchedulerInput(now=1.0, running=[], waiting=[lax, tight], limits=limits)
    aware = GmaxPolicy(_estimator()).schedule(inp)
    assert [r.request_id for r, _ in aware.scheduled] == ["tight"]
    blind = GmaxPolicy(_estimator(), GmaxParams(slack_weight=0.0)).schedule(inp)
    assert [r.request_id for r, _ in blind.scheduled] == ["lax"]


def test_gmax_fair_prefers_the_tenant_with_less_service() -> None:
    """Tenant a is served 100 decode steps while tenant b waits (one seat). With f = 1 (pure
    VTC) b then goes first, although a's new request is ten times shorter; b was backlogged all
    along, so VTC's lift does not erase its credit."""
    policy = make_policy("gmax-fair", _estimator(), fairness=1.0)
    served = _running("a-run", prompt=20, outputs=1, length=500)
    served.tenant = "a"
    b = _waiting("b-new", prompt=10, length=50)
    b.tenant = "b"
    limits = EngineLimits(token_budget=64, max_num_seqs=1, block_size=16, num_free_blocks=100)
    first = SchedulerInput(now=1.0, running=[served], waiting=[b], limits=limits)
    plan = policy.schedule(first)
    assert [r.request_id for r, _ in plan.scheduled] == ["a-run"]
    for k in range(100):
        policy.on_step_end(plan, 1.0 + k)
    a = _waiting("a-new", prompt=10, length=5)
    a.tenant = "a"
    inp = SchedulerInput(now=200.0, running=[], waiting=[a, b], limits=limits)
    assert [r.request_id for r, _ in policy.schedule(inp).scheduled] == ["b-new"]
    # without fairness the shorter request of tenant a goes first
    plain = make_policy("gmax", _estimator())
    assert [r.request_id for r, _ in plain.schedule(inp).scheduled] == ["a-new"]


@pytest.mark.parametrize("name", ["gmax-oracle", "tempo-oracle", "gmax-fair-oracle"])
def test_oracle_variants_read_the_true_length(name: str) -> None:
    from priority.policies import policy_class

    assert policy_class(name).uses_oracle_length
    assert not policy_class(name.removesuffix("-oracle")).uses_oracle_length


def test_tempo_graded_decay_changes_the_order() -> None:
    """Tempo's value is tokens (w_in : w_out = 1 : 2). Short (20 + 2·5 = 30 over ~0.027 s) beats
    long (20 + 2·250 = 520 over ~1.3 s) on density — unless short is ten times past its
    deadline: decay (0.1 / 1.03) cuts it below long. No eligibility cut: it keeps that value."""
    limits = EngineLimits(token_budget=256, max_num_seqs=1, block_size=16, num_free_blocks=100)
    long = _waiting("long", prompt=20, length=250, arrival=0.0)
    for deadline, first in ((100.0, "short"), (0.1, "long")):
        short = _waiting("short", prompt=20, length=5, slo=SLO(deadline_s=deadline), arrival=0.0)
        inp = SchedulerInput(now=1.0, running=[], waiting=[long, short], limits=limits)
        plan = make_policy("tempo", _estimator()).schedule(inp)
        assert [r.request_id for r, _ in plan.scheduled] == [first]


@pytest.mark.parametrize("name", ["gmax", "gmax-fair", "tempo"])
def test_a_prefill_that_misses_the_time_budget_is_not_preempted(name: str) -> None:
    """One running stream still prefilling 10 tokens, with a step budget (0.9 × its TPOT) too
    short for any chunk: freeing its KV would not make it fit, so it must not preempt itself
    (a deadlock hypothesis found: an empty plan with the request preempted). It runs instead."""
    stream = Request(
        "r0", 0.0, 11, SLO(ttft_s=1.0, tpot_s=0.005), length=LengthDistribution.point(8)
    )
    stream.status = RequestStatus.RUNNING
    stream.num_computed_tokens = 1
    stream.num_kv_blocks = 1
    limits = EngineLimits(token_budget=10, max_num_seqs=1, block_size=1, num_free_blocks=12)
    plan = make_policy(name, _estimator()).schedule(
        SchedulerInput(now=0.0, running=[stream], waiting=[], limits=limits)
    )
    assert plan.preempted == []
    assert [(r.request_id, tokens) for r, tokens in plan.scheduled] == [("r0", 10)]


def test_tempo_density_decides_who_gets_a_contested_step() -> None:
    """Regression (bench: ``tempo`` within 0.01 of ``vllm-v1`` at every load). One
    running stream (TPOT 50 ms) and two 2,000-token prompts: "long" (500 tokens to generate,
    density ≈ 3,000 / 2.7 s) arrived first, "short" (5 tokens, ≈ 2,010 / 0.13 s) later. The
    engine's limits (8,192 tokens, 256 seats) admit both, so Tempo used to admit both and its
    density only sequenced what vLLM admits anyway, while the 0.2 s step broke the stream's
    TPOT. The step's bandwidth is now 0.9 × the stream's TPOT (45 ms): only a chunk of one
    prompt fits, and density — not arrival — gives it to "short"."""
    stream = Request("stream", 0.0, 100, SLO(ttft_s=1.0, tpot_s=0.05))
    stream.length = LengthDistribution.point(200)
    stream.status = RequestStatus.RUNNING
    stream.num_output_tokens = 1
    stream.num_computed_tokens = stream.num_tokens - 1
    stream.num_kv_blocks = cdiv(stream.num_computed_tokens, 16)
    long = _waiting("long", prompt=2000, length=500, arrival=0.5)
    short = _waiting("short", prompt=2000, length=5, arrival=0.9)
    limits = EngineLimits(token_budget=8192, max_num_seqs=256, block_size=16, num_free_blocks=1000)
    inp = SchedulerInput(now=1.0, running=[stream], waiting=[long, short], limits=limits)
    plan = make_policy("tempo", _estimator()).schedule(inp)
    granted = {r.request_id: tokens for r, tokens in plan.scheduled}
    assert set(granted) == {"stream", "short"}
    assert granted["stream"] == 1 and 64 <= granted["short"] < 2000
    est = _estimator()
    step = est.batch_time(prefill=[(granted["short"], 0)], decode_kv=[stream.num_computed_tokens])
    assert step <= 0.9 * 0.05


def _stream(rid: str, prompt: int, outputs: int, length: int, slo: SLO) -> Request:
    r = Request(rid, 0.0, prompt, slo, length=LengthDistribution.point(length))
    r.status = RequestStatus.RUNNING
    r.num_output_tokens = outputs
    r.num_computed_tokens = r.num_tokens - 1
    r.num_kv_blocks = cdiv(r.num_computed_tokens, 16)
    return r


def test_a_better_newcomer_goes_before_a_running_chunked_prefill() -> None:
    """A stream decodes (TPOT 50 ms: a 45 ms step budget, room for ~600 prefill tokens). A
    4,000-token prompt is mid-prefill (1,000 computed, 500 tokens to generate); a 200-token
    stream with a 300 ms TTFT arrives. Continuing every running request first (vLLM's order)
    gave the chunk to the long prompt for 5 steps and the newcomer missed its TTFT; by
    (eligible, priority) the newcomer's whole prompt goes first and the long prompt, which keeps
    its KV, takes what is left of the step."""
    stream = _stream("stream", 100, 1, 200, SLO(ttft_s=1.0, tpot_s=0.05))
    big = _running("big", prompt=4000, outputs=0, length=500)
    big.num_computed_tokens = 1000
    big.num_kv_blocks = cdiv(1000, 16)
    short = _waiting("short", 200, 20, SLO(ttft_s=0.3, tpot_s=0.05), arrival=1.0)
    limits = EngineLimits(token_budget=8192, max_num_seqs=256, block_size=16, num_free_blocks=1000)
    inp = SchedulerInput(now=1.0, running=[stream, big], waiting=[short], limits=limits)
    plan = GmaxPolicy(_estimator()).schedule(inp)
    order = [r.request_id for r, _ in plan.scheduled]
    granted = {r.request_id: tokens for r, tokens in plan.scheduled}
    assert granted["short"] == 200 and granted["stream"] == 1
    assert order.index("short") < order.index("big")  # the rest of the step: a chunk
    assert 64 <= granted["big"] < 3000 and not plan.preempted


def test_eligibility_and_priority_use_the_likely_length() -> None:
    """Deadline 2 s; median 100 tokens, 95th percentile 1,000 (the measured predictor's spread
    is about this wide). At ~5 ms a step the median fits, the bound does not: GMAX gives up on
    the request only under the published rule (bound for everything, ``likely_quantile=None``);
    with the likely length it is eligible and served."""
    dist = LengthDistribution(levels=(0.5, 0.95), values=(100.0, 1000.0))
    req = Request("r", 1.0, 100, SLO(deadline_s=2.0), kind="deadline", length=dist)
    limits = EngineLimits(token_budget=2048, max_num_seqs=4, block_size=16, num_free_blocks=100)
    inp = SchedulerInput(now=1.0, running=[], waiting=[req], limits=limits)
    likely = GmaxPolicy(_estimator()).schedule(inp)
    assert likely.hopeless == [] and [r.request_id for r, _ in likely.scheduled] == ["r"]
    published = GmaxPolicy(_estimator(), GmaxParams(likely_quantile=None)).schedule(inp)
    assert published.hopeless == [("r", "deadline_unreachable")]


def test_a_stream_past_its_ttft_is_hopeless_for_request_goodput() -> None:
    """An unstarted stream whose first token can no longer come by its TTFT earns no request
    goodput (strict TTFT), however far its last token's due time is: demoted and reported
    under ``objective="requests"``; under ``"tokens"`` its later tokens still count."""
    late = _waiting("late", 100, 50, SLO(ttft_s=0.2, tpot_s=0.05), arrival=0.0)
    limits = EngineLimits(token_budget=2048, max_num_seqs=4, block_size=16, num_free_blocks=100)
    inp = SchedulerInput(now=0.5, running=[], waiting=[late], limits=limits)
    assert GmaxPolicy(_estimator()).schedule(inp).hopeless == [("late", "deadline_unreachable")]
    assert GmaxPolicy(_estimator(), GmaxParams(objective="tokens")).schedule(inp).hopeless == []


# ---- Tempo's cost-aware preemption (Tempo §4.2: every 20 steps, gain vs stall loss) ----------
#
# One seat, deadlines 1000 s away (no decay: ESG = R = w_in·L_in + w_out·L_out, w = 1 : 2), the
# victim decoding. With the test coefficients a step of the running batch is
# t_c + a_d·kv + b_d, a prefill of n tokens n·(a_p·n + c_p), and the victim's stall is the
# prefill of its computed tokens.


def _tempo_seat(victim: Request, newcomer: Request) -> SchedulerInput:
    limits = EngineLimits(token_budget=512, max_num_seqs=1, block_size=16, num_free_blocks=500)
    return SchedulerInput(now=2.0, running=[victim], waiting=[newcomer], limits=limits)


def _ids(plan: StepPlan) -> tuple[list[str], list[str]]:
    return [r.request_id for r in plan.preempted], [r.request_id for r, _ in plan.scheduled]


def test_tempo_preempts_for_a_denser_newcomer_at_the_frame_boundary() -> None:
    """Victim: 100-token prompt, 10 of 1,000 tokens generated (109 computed): step 5e-3 +
    2e-7·109 + 2e-4 = 5.222 ms; R = 100 + 2·1,000 = 2,100 over 990 steps (5.170 s): density
    406. Newcomer: 50-token prompt, 5 tokens: R = 50 + 2·5 = 60 over 2.525 ms + 5 steps
    (28.6 ms): density 2,095 > 406. Stall: prefill of 109 tokens = 5.569 ms = 1.066 steps ×
    2,100 / 990 per token = 2.26 < 60. So the first step (a frame boundary) preempts."""
    est = _estimator()
    assert est.prefill_time(109, 0) / (5e-3 + est.decode_time(109)) == pytest.approx(1.066, 1e-3)
    victim = _running("long", prompt=100, outputs=10, length=1000)
    plan = make_policy("tempo", est).schedule(_tempo_seat(victim, _waiting("short", 50, 5)))
    assert _ids(plan) == (["long"], ["short"])


def test_tempo_does_not_preempt_when_the_stall_costs_more_than_the_gain() -> None:
    """Victim: 4,000-token prompt, 10 of 1,010 generated (4,009 computed): step 5e-3 + 2e-7·4,009
    + 2e-4 = 6.002 ms; R = 4,000 + 2·1,010 = 6,020 over 1,000 steps (6.0 s): density 1,003, 6.02
    per token. Its stall is the prefill of 4,009 tokens: 4,009·(1e-8·4,009 + 5e-5) = 0.3612 s =
    60.2 steps, a loss of 60.2 × 6.02 = 362. Newcomer of 100 prompt tokens, 5 to generate:
    R = 110 over 5.1 ms + 5 steps (35.1 ms), density 3,133 — denser, but 110 < 362: no
    preemption. One of 400 prompt tokens (R = 410 > 362, density 410 / 51.6 ms = 7,944) does."""
    est = _estimator()
    step = 5e-3 + est.decode_time(4009)
    assert est.prefill_time(4009, 0) / step * 6020 / 1000 == pytest.approx(362.3, 1e-3)
    for prompt, preempted in ((100, False), (400, True)):
        victim = _running("big", prompt=4000, outputs=10, length=1010)
        policy = make_policy("tempo", est)
        plan = policy.schedule(_tempo_seat(victim, _waiting("new", prompt, 5)))
        want = (["big"], ["new"]) if preempted else ([], ["big"])
        assert _ids(plan) == want, prompt


def test_tempo_preemption_margin() -> None:
    """Victim: 100-token prompt, 10 of 24 generated: R = 100 + 2·24 = 148 over 14 steps of
    5.222 ms (73.1 ms): density 2,025. Newcomer as above: density 2,095, 1.035× the victim's;
    its gain 60 beats the stall loss (1.066 steps × 148 / 14 = 11.3). Tempo asks only for a
    higher density (margin 0): preempt. With JITServe's δ = 0.1 it needs 1.1×: no preemption."""
    for margin, want in ((0.0, (["long"], ["short"])), (0.1, ([], ["long"]))):
        victim = _running("long", prompt=100, outputs=10, length=24)
        policy = make_policy("tempo", _estimator(), preempt_margin=margin)
        plan = policy.schedule(_tempo_seat(victim, _waiting("short", 50, 5)))
        assert _ids(plan) == want, margin


def test_tempo_preempts_only_at_frame_boundaries() -> None:
    """The state of the first test preempts at the boundary step. Once that plan ran, the next
    19 executed steps are inside the frame (no preemption, the victim keeps its seat); after
    the 20th the next step is a boundary again. A boundary plan that did not run (an engine
    re-planned the step) starts no frame: the next plan is still a boundary."""

    def state() -> SchedulerInput:
        victim = _running("long", prompt=100, outputs=10, length=1000)
        return _tempo_seat(victim, _waiting("short", 50, 5))

    policy = make_policy("tempo", _estimator())
    discarded = policy.schedule(state())
    assert _ids(discarded) == (["long"], ["short"])
    boundary = policy.schedule(state())  # the discarded plan never ran: still a boundary
    assert _ids(boundary) == (["long"], ["short"])
    policy.on_step_end(boundary, 2.01)
    for step in range(1, 20):
        inside = policy.schedule(state())
        assert _ids(inside) == ([], ["long"]), step
        policy.on_step_end(inside, 2.01 + step)
    assert _ids(policy.schedule(state())) == (["long"], ["short"])
