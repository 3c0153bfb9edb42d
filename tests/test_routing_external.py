"""GoRouting with other routers' queued prefills (gateway workers in front of the same engines)."""

from __future__ import annotations

import math

import pytest

from priority.estimator import LatencyCoefficients
from priority.profiles import EngineConfig, Profile
from priority.routing import ExternalPrefills, GoRouter, MinLoadRouter
from priority.routing.goroute import own_prefills
from tests.test_routing import NOW, instance, req


def test_own_prefills_summarises_what_phi_needs() -> None:
    view = instance(0, req("a", 1000, ttft=2.0, tpot=0.05), req("b", 3000, ttft=5.0, tpot=0.02))
    summary = own_prefills(view)
    assert (summary.count, summary.prompt_tokens, summary.chunks) == (2, 4000, 2)
    assert summary.raw_work == pytest.approx(0.4)  # 1e-4 s per token
    assert summary.min_tpot_s == 0.02
    assert summary.earliest_deadline_s == NOW + 2.0
    assert summary.updated_s == NOW


def test_another_workers_prefills_make_an_instance_look_busier() -> None:
    # two identical idle instances; instance 0 holds 0.6 s of another worker's prefills
    idle = [instance(0), instance(1)]
    router = GoRouter(idle)
    new = req("new", 500, ttft=1.0)
    assert router.drain_s(idle[0], NOW) == router.drain_s(idle[1], NOW) == 0.0
    theirs = own_prefills(instance(0, req("x", 6000, tpot=0.05)))
    idle[0].external_prefills = theirs
    busy, free = router.estimate(idle[0], new, NOW), router.estimate(idle[1], new, NOW)
    assert busy.exec_s == pytest.approx(0.6) and free.exec_s == 0.0
    assert router.route(new, NOW).instance == 1
    # the same as if this router had queued them itself
    mine = GoRouter([instance(0, req("x", 6000, tpot=0.05))])
    assert busy.exec_with_s == pytest.approx(mine.estimate(mine.instances[0], new, NOW).exec_with_s)


def test_external_deadline_tightens_the_batch_budget_but_adds_no_gain() -> None:
    coefficients = LatencyCoefficients(a_p=0.0, b_p=0.0, c_p=1e-4, a_d=0.0, b_d=0.0, t_c=0.01)
    profile = Profile("tc", "test", "test", 1, coefficients, EngineConfig())
    view = instance(0, profile=profile)
    router = GoRouter([view])
    view.external_prefills = ExternalPrefills(1, 1000, 0.1, 1, updated_s=NOW)
    relaxed = router.drain_s(view, NOW)
    view.external_prefills = ExternalPrefills(1, 1000, 0.1, 1, math.inf, NOW + 0.05, NOW)
    # Eq. 8 with t_b = 0.05 s (the other worker's deadline): 0.05 / (0.05 - 0.01) = 1.25
    assert router.drain_s(view, NOW) == pytest.approx(1.25 * relaxed)
    new = req("new", 500, ttft=1.0)
    estimate = router.estimate(view, new, NOW)
    # the other worker's request misses its deadline; it carries no gain of ours
    assert estimate.gain_before == 0.0
    assert estimate.gain_after == pytest.approx(router.weights.token_value(new.weight, 1))


def test_external_update_time_limits_lag_compensation() -> None:
    view = instance(0, updated=NOW - 10.0)  # our own queue changed long ago (empty now)
    router = GoRouter([view])
    view.external_prefills = ExternalPrefills(1, 6000, 0.6, 2, math.inf, math.inf, NOW - 0.2)
    assert router.drain_s(view, NOW) == pytest.approx(0.4)


def test_memo_follows_a_changed_external_summary() -> None:
    view = instance(0)
    router = GoRouter([view])
    assert router.drain_s(view, NOW) == 0.0
    view.external_prefills = ExternalPrefills(1, 3000, 0.3, 1, updated_s=NOW)
    assert router.drain_s(view, NOW) == pytest.approx(0.3)
    view.external_prefills = None
    assert router.drain_s(view, NOW) == 0.0


def test_least_loaded_router_counts_external_prefills() -> None:
    a, b = instance(0), instance(1, req("q", 100))
    a.external_prefills = ExternalPrefills(3, 300, 0.03, 3)
    assert a.num_outstanding == 3
    assert MinLoadRouter([a, b]).route(req("new", 10), NOW).instance == 1
