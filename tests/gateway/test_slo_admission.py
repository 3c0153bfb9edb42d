"""SLOs-Serve's admission across engines (:mod:`gateway.app.slo_admission`): each engine's
planner is asked in turn, a declined request goes to the next engine, and only when every one
declines is it shed (with a retry hint) or demoted. On numbers, without servers; the same path
through the gateway with the ``openai`` client is ``test_slo_admission_e2e.py``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.app.backends import Backend, BackendSpec, ModelGroup
from gateway.app.engine_facts import EngineFacts
from gateway.app.metrics import GatewayMetrics
from gateway.app.slo_admission import (
    Ledger,
    PlanOutcome,
    SloAdmission,
    engine_view,
    placed,
)
from gateway.limits import RejectReason
from priority.estimator import LatencyCoefficients
from priority.profiles import Profile, load_profile
from priority.request import SLO, Request
from priority.routing import InstanceView, make_router

PROMPT = 1000
TTFT_S, TPOT_S = 2.5, 1.0


def _profile(slowdown: float = 10.0) -> Profile:
    profile = load_profile("a100-qwen2-7b")
    scaled = {k: v * slowdown for k, v in profile.coefficients.to_dict().items()}
    return replace(profile, coefficients=LatencyCoefficients.from_dict(scaled))


def _group(*policies: str | None) -> ModelGroup:
    profile = _profile()
    backends = []
    views = []
    for i, policy in enumerate(policies):
        view = InstanceView(i, f"e{i}", profile, profile.estimator())
        views.append(view)
        backend = Backend(BackendSpec(f"e{i}", f"http://e{i}:8000", "m", profile), profile, view)
        backend.facts = EngineFacts(policy=policy) if policy else None
        backends.append(backend)
    return ModelGroup("m", backends, make_router("min-load", views))


def _request(rid: str, now: float, *, ttft_s: float = TTFT_S, prompt: int = PROMPT) -> Request:
    return Request(
        rid, now, prompt, SLO(ttft_s=ttft_s, tpot_s=TPOT_S), max_output_tokens=64, kind="latency"
    )


def _fill(admission: SloAdmission, group: ModelGroup, now: float, n: int) -> list[PlanOutcome]:
    outcomes = []
    for i in range(n):
        placement = admission.place(
            _request(f"r{i}", now), group, 0, best_effort_allowed=False, now=now
        )
        assert placement is not None
        outcomes.append(placement.outcome)
    return outcomes


def test_one_engine_admits_what_its_prefill_budget_covers_by_the_deadlines() -> None:
    group = _group("slos-serve")
    est = group.backends[0].view.estimator
    per = est.prefill_time(PROMPT, 0)
    fits = int(TTFT_S * (1 - est.t_c / (0.95 * TPOT_S)) // per)  # budget line / prefill work
    assert 1 < fits < 10
    outcomes = _fill(SloAdmission(), group, 100.0, fits + 3)
    # the planner's own arithmetic (decode load of the admitted ones included) can take one less
    admitted = outcomes.count(PlanOutcome.ADMITTED)
    assert fits - 1 <= admitted <= fits
    assert outcomes[:admitted] == [PlanOutcome.ADMITTED] * admitted
    assert set(outcomes[admitted:]) == {PlanOutcome.SHED}


def test_a_declined_request_goes_to_the_next_engine_then_is_shed_with_a_retry_hint() -> None:
    group = _group("slos-serve", "slos-serve")
    admission = SloAdmission()
    metrics = GatewayMetrics()
    now = 100.0
    placements = []
    for i in range(20):
        placement = admission.place(
            _request(f"r{i}", now), group, 0, best_effort_allowed=False, now=now,
            metrics=metrics, tier="gold",
        )  # fmt: skip
        assert placement is not None
        placements.append(placement)
    outcomes = [p.outcome for p in placements]
    first = outcomes.count(PlanOutcome.ADMITTED)
    rerouted = [p for p in placements if p.outcome is PlanOutcome.REROUTED]
    shed = [p for p in placements if p.outcome is PlanOutcome.SHED]
    assert first > 0 and len(rerouted) > 0 and len(shed) > 0
    assert all(p.instance == 0 for p in placements[:first])
    assert all(p.instance == 1 and p.declined_by == ("e0",) for p in rerouted)
    # shed only after both engines declined, with the reason and a bounded retry hint
    for p in shed:
        assert p.instance is None and p.declined_by == ("e0", "e1")
        assert p.reason is RejectReason.SLO_DECLINED and p.reason.status_code == 503
        assert p.retry_after_s is not None and 1.0 <= p.retry_after_s <= 60.0
        assert "every engine declined" in p.message("gold")
    # each request decided once: admitted on one engine's ledger at most, shed on none
    on_engines = [set(admission.ledgers[b].entries) for b in ("e0", "e1")]
    assert not on_engines[0] & on_engines[1]
    assert len(on_engines[0]) + len(on_engines[1]) == first + len(rerouted)
    text = metrics.render().decode()
    assert f'tiergate_slo_admission_total{{outcome="shed",tier="gold"}} {len(shed)}.0' in text
    assert f'tiergate_slo_admission_total{{outcome="rerouted",tier="gold"}} {len(rerouted)}.0' in (
        text
    )
    declines_e0 = len(rerouted) + len(shed)
    assert f'tiergate_slo_declines_total{{backend="e0"}} {declines_e0}.0' in text


def test_every_planner_declining_demotes_where_the_tier_allows_best_effort() -> None:
    group = _group("slos-serve")
    admission = SloAdmission()
    now = 100.0
    _fill(admission, group, now, 10)
    placement = admission.place(_request("late", now), group, 0, best_effort_allowed=True, now=now)
    assert placement is not None and placement.outcome is PlanOutcome.DEMOTED
    assert placement.reason is RejectReason.SLO_DECLINED and placement.instance is None
    assert "late" not in admission.ledgers["e0"].entries  # best effort: no budget kept for it


def test_released_requests_free_their_engines_budget() -> None:
    group = _group("slos-serve")
    admission = SloAdmission()
    now = 100.0
    outcomes = _fill(admission, group, now, 10)
    assert outcomes[-1] is PlanOutcome.SHED
    for rid in list(admission.ledgers["e0"].entries):
        admission.release(rid)
    again = admission.place(_request("again", now), group, 0, best_effort_allowed=False, now=now)
    assert again is not None and again.outcome is PlanOutcome.ADMITTED


def test_no_engine_with_the_planner_leaves_the_decision_to_the_gateways_rules() -> None:
    group = _group(None, "gmax")
    assert SloAdmission().place(_request("r", 1.0), group, 0, best_effort_allowed=False) is None


def test_an_engine_without_the_planner_takes_what_the_planners_declined() -> None:
    group = _group("slos-serve", None)
    admission = SloAdmission()
    outcomes = _fill(admission, group, 100.0, 10)
    assert PlanOutcome.SHED not in outcomes and PlanOutcome.REROUTED in outcomes
    assert "e1" not in admission.ledgers  # nothing budgeted where no planner runs


def test_a_ttft_no_idle_engine_meets_gets_no_retry_hint() -> None:
    group = _group("slos-serve")
    est = group.backends[0].view.estimator
    too_tight = 0.5 * est.prefill_time(PROMPT, 0)
    placement = SloAdmission().place(
        _request("r", 5.0, ttft_s=too_tight), group, 0, best_effort_allowed=False, now=5.0
    )
    assert placement is not None and placement.outcome is PlanOutcome.SHED
    assert placement.retry_after_s is None  # retrying cannot help


def test_the_view_counts_unattributed_decodes_and_the_engines_kv_use() -> None:
    group = _group("slos-serve")
    backend = group.backends[0]
    now = 50.0
    request = _request("r", now)
    ledger = Ledger()
    idle, entry = engine_view(backend, ledger, request, now)
    assert idle.running_load.size == 0 and len(idle.forced) == 0
    assert idle.free_memory == backend.profile.engine.num_kv_blocks
    backend.view.num_decoding = 7  # decodes the gateway did not place (another worker's)
    backend.kv_usage = 0.5
    backend.running, backend.waiting = 7, 0
    busy, _ = engine_view(backend, ledger, request, now)
    assert busy.running_load.sum() == pytest.approx(7 * entry.load * (TPOT_S / (0.95 * TPOT_S)))
    assert busy.free_memory == backend.profile.engine.num_kv_blocks // 2
    assert busy.free_seats == backend.profile.engine.max_num_seqs - 7
    # a request placed there and queued for its prefill is a forced item
    ledger.entries["p"] = placed(_request("p", now), backend.view.estimator, 16, now, 0.95)
    backend.view.prefill_queue["p"] = _request("p", now)
    forced, _ = engine_view(backend, ledger, request, now)
    assert len(forced.forced) == 1 and forced.forced.deadline[0] == pytest.approx(now + TTFT_S)
