"""Summary metrics on a hand-computed case, and on a real simulation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from test_sim_engine import FcfsPolicy, make_profile

from priority.gain import GainWeights
from priority.request import SLO, Request, RequestStatus
from priority.routing.base import RouteDecision, Router
from priority.sim.cluster import ClusterConfig, simulate
from priority.sim.metrics import summarize
from priority.sim.workload import poisson_workload


@dataclass
class FakeResult:
    requests: list[Request]


@dataclass
class FakeWorkload:
    gain_weights: GainWeights
    tier_weights: dict[str, float] = field(default_factory=dict)


def req(
    rid: str,
    arrival: float,
    weight: float,
    tier: str,
    slo: SLO,
    output: int,
    times: list[float],
    *,
    finished: bool,
) -> Request:
    r = Request(
        request_id=rid,
        arrival_s=arrival,
        prompt_tokens=10,
        slo=slo,
        weight=weight,
        tier=tier,
        max_output_tokens=output,
        true_output_tokens=output,
    )
    r.token_times = list(times)
    r.num_output_tokens = len(times)
    if finished:
        r.status = RequestStatus.FINISHED
        r.finished_s = times[-1]
    return r


def hand_case() -> tuple[FakeResult, FakeWorkload]:
    requests = [
        # deadlines 1.0, 1.5, 2.0: the third token (2.0) is not strictly early; mean TPOT 0.75
        req("A", 0.0, 2.0, "high", SLO(1.0, 0.5), 3, [0.5, 1.2, 2.0], finished=True),
        # deadlines 1.5, 1.7: both on time; TTFT 0.3, TPOT 0.15: attains its SLO
        req("B", 1.0, 1.0, "low", SLO(0.5, 0.2), 2, [1.3, 1.45], finished=True),
        # one late token, unfinished (4 expected)
        req("C", 2.0, 1.0, "low", SLO(0.5, 0.2), 4, [3.0], finished=False),
        # rejected: no tokens, 5 expected
        req("D", 3.0, 2.0, "high", SLO(0.5, 0.2), 5, [], finished=False),
    ]
    return FakeResult(requests), FakeWorkload(GainWeights(3.0, 1.0), {"high": 2.0, "low": 1.0})


def test_hand_computed_summary() -> None:
    result, workload = hand_case()
    m = summarize(result, workload)
    # TDG: A = 2*(3+1) = 8, B = 1*(3+1) = 4. Ideal: A 2*(3+2), B 1*(3+1), C 1*(3+3), D 2*(3+4).
    assert m["tdg_ratio"] == pytest.approx(12 / 34)
    assert m["submitted"] == 4 and m["finished"] == 2
    assert m["slo_attainment"] == pytest.approx(1 / 4)
    assert m["goodput_requests"] == 1
    assert m["goodput_tokens"] == pytest.approx(3 + 2)  # JITServe counts due-time ties as on time
    assert m["ttft_p50_s"] == pytest.approx(0.5)  # of 0.5, 0.3, 1.0
    assert m["ttft_p99_s"] == pytest.approx(0.5 + 0.98 * 0.5)
    assert m["tpot_p50_s"] == pytest.approx((0.75 + 0.15) / 2)
    high, low = m["per_tier"]["high"], m["per_tier"]["low"]
    assert high == {
        "weight": 2.0,
        "tdg_ratio": pytest.approx(8 / 24),
        "slo_attainment": 0.0,
        "submitted": 2,
    }
    assert low["tdg_ratio"] == pytest.approx(4 / 10) and low["slo_attainment"] == 0.5


def test_unbuffered_first_token_pulls_deadlines_forward() -> None:
    result, workload = hand_case()
    m = summarize(result, workload, first_token_buffered=False)
    # A: deadlines 0.5, 1.0, 1.5 -> none strictly early; B: 1.3, 1.5 -> only the second.
    assert m["tdg_ratio"] == pytest.approx(1 / 34)


def test_empty_latency_sets_are_nan() -> None:
    _, workload = hand_case()
    only_rejected = FakeResult([req("D", 0.0, 1.0, "low", SLO(0.5, 0.2), 5, [], finished=False)])
    m = summarize(only_rejected, workload)
    assert m["tdg_ratio"] == 0.0 and m["slo_attainment"] == 0.0
    assert math.isnan(m["ttft_p50_s"]) and math.isnan(m["tpot_p99_s"])


def test_summary_of_a_simulation_is_consistent() -> None:
    profile = make_profile()
    wl = poisson_workload(20.0, reference_profile=profile, num_requests=100, seed=3)
    config = ClusterConfig(profiles=[profile], policy=FcfsPolicy, router=OnlyInstanceZero)
    result = simulate(wl, config)
    m = summarize(result, wl)
    assert m["submitted"] == m["finished"] == 100
    assert 0.0 < m["tdg_ratio"] <= 1.0 and 0.0 <= m["slo_attainment"] <= 1.0
    assert m["goodput_requests"] == round(m["slo_attainment"] * 100)
    assert sum(t["submitted"] for t in m["per_tier"].values()) == 100
    assert m["ttft_p50_s"] <= m["ttft_p99_s"]


class OnlyInstanceZero(Router):
    def route(self, request: Request, now: float) -> RouteDecision:
        return RouteDecision(0)
