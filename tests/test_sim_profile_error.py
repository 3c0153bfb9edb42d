"""Profile error in the cluster simulator: instances run at a true speed other than their
profile's, engines learn the correction, the router receives it at each scrape; and the router's
other late knowledge, the PD decode instance bound at the first token."""

from __future__ import annotations

from typing import ClassVar

import pytest
from test_sim_cluster import RoundRobin, config, workload
from test_sim_engine import FcfsPolicy, make_profile

from priority.request import Request
from priority.routing.base import InstanceView, RouteDecision
from priority.sim.cluster import ClusterConfig, KvTransferModel, PdConfig, simulate, true_profile


class Recording(RoundRobin):
    """Round-robin that keeps its views, so a test can read what the router was given."""

    last: ClassVar[list[InstanceView]] = []

    def __init__(self, instances: list[InstanceView]) -> None:
        super().__init__(instances)
        Recording.last = self.instances


def one_instance(**kwargs: object) -> ClusterConfig:
    return config(profiles=[make_profile()], noise_sigma=0.0, router=Recording, **kwargs)


def test_true_time_scale_stretches_every_step() -> None:
    wl = workload(n=1, rps=1.0)
    exact = simulate(wl, one_instance()).requests[0].token_times
    slow = simulate(wl, one_instance(true_time_scale=[1.5])).requests[0].token_times
    arrival = wl.requests()[0].arrival_s
    assert [t - arrival for t in slow] == pytest.approx([1.5 * (t - arrival) for t in exact])


def test_true_profile_scales_coefficients_and_keeps_the_rest() -> None:
    profile = make_profile()
    scaled = true_profile(profile, 0.8)
    assert scaled.coefficients.c_p == pytest.approx(0.8 * profile.coefficients.c_p)
    assert scaled.coefficients.t_c == pytest.approx(0.8 * profile.coefficients.t_c)
    assert (scaled.name, scaled.engine) == (profile.name, profile.engine)
    assert true_profile(profile, 1.0) is profile


@pytest.mark.parametrize("scale", [0.7, 1.3])
def test_the_router_receives_the_engines_learnt_correction_only_when_scraped(scale: float) -> None:
    wl = workload(n=60, rps=8.0)
    simulate(wl, one_instance(true_time_scale=[scale]))
    assert Recording.last[0].estimator.beta == 1.0  # never scraped: the profile's
    simulate(wl, one_instance(true_time_scale=[scale], estimator_scrape_s=0.5))
    learnt = Recording.last[0].estimator.beta
    assert learnt == pytest.approx(scale, rel=0.05)  # noiseless: beta converges to the scale
    # a scrape interval longer than the run: the router never hears of it
    simulate(wl, one_instance(true_time_scale=[scale], estimator_scrape_s=1e6))
    assert Recording.last[0].estimator.beta == 1.0


def test_profile_error_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="one positive finite factor per instance"):
        config(true_time_scale=[1.0])  # three instances
    with pytest.raises(ValueError, match="one positive finite factor per instance"):
        config(true_time_scale=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="estimator_scrape_s"):
        config(estimator_scrape_s=0.0)


def test_policy_estimators_start_from_the_profile() -> None:
    seen: list[float] = []

    def factory(estimator: object) -> FcfsPolicy:
        seen.append(estimator.coefficients.c_p)  # type: ignore[attr-defined]
        return FcfsPolicy(estimator)  # type: ignore[arg-type]

    simulate(workload(n=2), config(policy=factory, true_time_scale=[2.0, 2.0, 2.0]))
    assert seen == [make_profile().coefficients.c_p] * 3


class LateDecode(RoundRobin):
    """Names decode instance 1 at dispatch and re-binds every handoff to instance 2."""

    def route(self, request: Request, now: float) -> RouteDecision:
        return RouteDecision(0, 1)

    def decode_at_handoff(
        self, request: Request, decision: RouteDecision, now: float
    ) -> RouteDecision:
        return RouteDecision(decision.instance, 2)


def test_the_simulator_hands_off_to_the_decode_instance_bound_at_the_first_token() -> None:
    pd = PdConfig(num_prefill=1, transfer=KvTransferModel(per_token_s=1e-6))
    result = simulate(workload(n=20), config(router=LateDecode, pd=pd))
    assert all(r.is_finished for r in result.requests)
    assert [s.transfers_in for s in result.instances] == [0, 0, 20]
    assert {d.decode_instance for d in result.placement.values()} == {2}
