"""SlideBatching (PROSERVE Algorithm 1) on a worked example."""

from __future__ import annotations

from typing import Any

import pytest

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.gain import GainWeights
from priority.policies import make_policy
from priority.policies.base import VLLM_ADMISSION, EngineLimits, SchedulerInput, cdiv
from priority.policies.slide import SlideBatchingPolicy, SlideParams
from priority.request import SLO, Request, RequestStatus

# 1 ms per prefill token, 10 ms per decode, 5 ms per batch: easy to follow by hand.
COEFFS = LatencyCoefficients(a_p=0.0, b_p=0.0, c_p=1e-3, a_d=0.0, b_d=0.01, t_c=0.005)
WEIGHTS = GainWeights(first_token=5.0, decode_token=1.0)
NOW = 10.0


def decoding(rid: str, *, remain: float, weight: float, outputs: int = 4) -> Request:
    """A running request whose next token is due ``remain`` seconds from NOW."""
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    arrival = NOW + remain - (1.0 + outputs * 0.05)
    req = Request(rid, arrival, prompt_tokens=100, slo=slo, weight=weight)
    req.status = RequestStatus.RUNNING
    req.num_output_tokens = outputs
    req.num_computed_tokens = req.num_tokens - 1
    req.num_kv_blocks = cdiv(req.num_computed_tokens, 16)
    return req


def waiting(rid: str, *, prompt: int, remain: float, weight: float) -> Request:
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    return Request(rid, NOW + remain - 1.0, prompt_tokens=prompt, slo=slo, weight=weight)


def scenario() -> SchedulerInput:
    running = [decoding("D1", remain=0.03, weight=1.0), decoding("D2", remain=0.2, weight=2.0)]
    queued = [
        waiting("P1", prompt=100, remain=0.5, weight=1.0),
        waiting("P2", prompt=200, remain=2.0, weight=2.0),
    ]
    limits = EngineLimits(token_budget=8192, max_num_seqs=256, block_size=16, num_free_blocks=1000)
    return SchedulerInput(now=NOW, running=running, waiting=queued, limits=limits)


def policy(**kwargs: Any) -> SlideBatchingPolicy:
    return SlideBatchingPolicy(
        BatchLatencyEstimator(COEFFS), SlideParams(gain_weights=WEIGHTS, **kwargs)
    )


def test_worked_example_partition_and_order() -> None:
    # exec: D1 .01, D2 .01, P1 .1, P2 .2 (sum .32). t_min = .03 (D1), eta = .65*.05 = .0325
    # -> budget .0325; phi_a = .0325/(.0325-.005)*.32 = .378. URGENT: remain < .378 -> D1, D2.
    # URGENT by density desc: D2 (2/.01=200) before D1 (1/.01=100); NORMAL by remain: P1, P2.
    ordered, budget, urgent = policy().order(scenario())
    assert budget == pytest.approx(0.0325)
    assert urgent == 2
    assert [r.request_id for r in ordered] == ["D2", "D1", "P1", "P2"]


def test_worked_example_batch_fills_the_latency_budget() -> None:
    plan = policy().schedule(scenario())
    # t = .005 + .01 + .01 = .025; .0075 left -> a 7-token chunk of P1 is below the 50-token
    # minimum, so the batch holds the two decodes only.
    assert [(r.request_id, n) for r, n in plan.scheduled] == [("D2", 1), ("D1", 1)]
    assert plan.time_budget_s == pytest.approx(0.0325)
    assert plan.num_urgent == 2


def test_small_gamma_is_deadline_first() -> None:
    # gamma*phi = .05*.378 = .0189 < every remain -> all NORMAL, ordered by remain
    ordered, _, urgent = policy(gamma=0.05).order(scenario())
    assert urgent == 0
    assert [r.request_id for r in ordered] == ["D1", "D2", "P1", "P2"]


def test_phi_c_uses_position_in_remain_order() -> None:
    # cumulative exec in remain order: D1 .01, D2 .02, P1 .12, P2 .32 (x1.1818):
    # every remain exceeds it -> no URGENT request
    _, _, urgent = policy(phi="c").order(scenario())
    assert urgent == 0


def test_larger_budget_admits_a_prefill_chunk() -> None:
    # with eta = 0.3 s the budget leaves room to chunk P1 entirely (0.1 s)
    plan = policy(eta_s=0.3).schedule(scenario())
    granted = {r.request_id: n for r, n in plan.scheduled}
    assert granted["P1"] == 100
    # P2 would need 0.2 s but only ~0.17 s is left: it gets the largest chunk that fits
    # 0.3 - (0.005 + 0.01 + 0.01 + 0.1) = 0.175 s left -> 175 tokens, or 174 after rounding
    assert granted["P2"] in (174, 175)


def test_starved_request_follows_the_urgent_decodes() -> None:
    inp = scenario()
    # P3: 3 s past its TTFT deadline (more than 1x its TTFT SLO) with a long, low-density prompt;
    # P4: an URGENT short prompt of a high tier (density 2*5/.06 = 167).
    inp.waiting.append(waiting("P3", prompt=2000, remain=-3.0, weight=1.0))
    inp.waiting.append(waiting("P4", prompt=60, remain=0.1, weight=2.0))
    ordered, _, _ = policy().order(inp)
    assert [r.request_id for r in ordered][:4] == ["D2", "D1", "P3", "P4"]
    # without the guard: Algorithm 1's pure density order. P3's 2 s prompt lifts phi_a to
    # ~2.8 s, so every request is URGENT and P3 (density 5/2.0 = 2.5) comes last.
    ordered_off, _, urgent = policy(starvation_prevention=False).order(inp)
    assert urgent == 6
    assert [r.request_id for r in ordered_off] == ["D2", "P4", "D1", "P1", "P2", "P3"]


def test_starvation_guard_takes_a_bounded_share_of_the_step() -> None:
    inp = scenario()
    inp.waiting.append(waiting("P3", prompt=2000, remain=-3.0, weight=1.0))
    plan = policy(eta_s=1.0, starve_share=0.1).schedule(inp)
    granted = {r.request_id: n for r, n in plan.scheduled}
    # 10% of a 1 s budget at 1 ms/token -> 100 tokens (99 after float rounding)
    assert granted["P3"] in (99, 100)
    assert policy().params.max_starved_per_step == 1


def test_kv_exhaustion_preempts_from_the_tail() -> None:
    inp = scenario()
    # no free blocks: D1 needs a new block only if its next token crosses a block boundary
    # (104 computed -> 105 needs 7 blocks, holds 7) so decodes fit; P1 needs 7 blocks.
    inp = SchedulerInput(
        now=inp.now,
        running=inp.running,
        waiting=inp.waiting,
        limits=EngineLimits(token_budget=8192, max_num_seqs=256, block_size=16, num_free_blocks=0),
    )
    plan = policy(eta_s=0.3).schedule(inp)
    scheduled = {r.request_id for r, _ in plan.scheduled}
    assert {"D1", "D2"} <= scheduled
    assert not plan.preempted  # the tail holds no KV worth taking from URGENT decodes


def test_registry_builds_slide() -> None:
    p = make_policy("slide", BatchLatencyEstimator(COEFFS), gamma=2.0)
    assert isinstance(p, SlideBatchingPolicy)
    assert p.params.gamma == 2.0
    with pytest.raises(KeyError, match="known policies"):
        make_policy("nope", BatchLatencyEstimator(COEFFS))


# ---- KV as vLLM pays for it: whole-sequence admission, no preemption to admit -----------------


def kv_scenario(free: int, *, boundary: bool = False) -> SchedulerInput:
    """Two running decodes (7 blocks each) and an urgent, heavy new prompt of 100 tokens
    (7 blocks); ``boundary``: the low-tier decode's next token needs a fresh block."""
    low = decoding("low", remain=3.0, weight=1.0, outputs=13 if boundary else 4)
    high = decoding("high", remain=0.2, weight=2.0)
    urgent = waiting("new", prompt=100, remain=0.01, weight=2.0)
    limits = EngineLimits(8192, 256, 16, free, VLLM_ADMISSION)
    return SchedulerInput(now=NOW, running=[high, low], waiting=[urgent], limits=limits)


def test_a_waiting_request_never_preempts_a_running_one() -> None:
    plan = policy(eta_s=0.5).schedule(kv_scenario(free=3))
    assert not plan.preempted  # the published rule would preempt "low" to admit "new"
    assert "new" not in {r.request_id for r, _ in plan.scheduled}
    plan = policy(eta_s=0.5, kv_reserve_tokens=0, preempt_for_admission=True).schedule(
        kv_scenario(free=3)
    )
    assert [r.request_id for r in plan.preempted] == ["low"]


def test_admission_leaves_room_for_the_running_requests_growth() -> None:
    # "new" needs 7 blocks; the two decodes need 2 + 2 more for their next 32 tokens
    assert "new" not in {
        r.request_id for r, _ in policy(eta_s=0.5).schedule(kv_scenario(10)).scheduled
    }
    plan = policy(eta_s=0.5).schedule(kv_scenario(11))
    assert {r.request_id for r, _ in plan.scheduled} == {"high", "low", "new"}
    plan = policy(eta_s=0.5, kv_reserve_tokens=0).schedule(kv_scenario(7))
    assert "new" in {r.request_id for r, _ in plan.scheduled}


def test_a_running_request_short_of_blocks_still_preempts_the_tail() -> None:
    inp = kv_scenario(free=0, boundary=True)
    inp.running.append(decoding("tail", remain=9.0, weight=1.0))
    plan = policy(eta_s=0.5).schedule(inp)
    assert [r.request_id for r in plan.preempted] == ["tail"]
    assert {"high", "low"} <= {r.request_id for r, _ in plan.scheduled}
