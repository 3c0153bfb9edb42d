"""Cluster event loop: determinism, heterogeneous fleets, PD-disaggregation, fast-forward."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from test_sim_engine import COEFFS, FcfsPolicy, make_profile  # the shared test policy/profile

from priority.estimator import LatencyCoefficients
from priority.policies.base import SchedulerInput, StepPlan
from priority.request import Request
from priority.routing.base import InstanceRole, InstanceView, RouteDecision, Router
from priority.sim.cluster import ClusterConfig, KvTransferModel, PdConfig, SimResult, simulate
from priority.sim.traces import shared_data_dir
from priority.sim.workload import Workload, build_workload, poisson_workload


class RoundRobin(Router):
    """Cycles over prefill-capable instances; under PD also cycles over decode instances."""

    name = "test-rr"

    def __init__(self, instances: Sequence[InstanceView]) -> None:
        super().__init__(instances)
        self.front = [i.index for i in instances if i.role is not InstanceRole.DECODE]
        self.back = [i.index for i in instances if i.role is InstanceRole.DECODE]
        self.count = 0

    def route(self, request: Request, now: float) -> RouteDecision:
        decode = self.back[self.count % len(self.back)] if self.back else None
        return RouteDecision(self.front[self.count % len(self.front)], decode)

    def on_dispatch(self, request: Request, decision: RouteDecision, now: float) -> None:
        super().on_dispatch(request, decision, now)
        self.count += 1


class MostFreeKvDecode(RoundRobin):
    """Round-robin prefills; the decode instance with the most reported free KV blocks."""

    def route(self, request: Request, now: float) -> RouteDecision:
        free = {i.index: i.num_free_kv_blocks or 0 for i in self.instances}
        decode = max(self.back, key=lambda i: (free[i], -i))
        return RouteDecision(self.front[self.count % len(self.front)], decode)


def workload(n: int = 60, rps: float = 8.0, seed: int = 0) -> Workload:
    return poisson_workload(
        rps,
        reference_profile=make_profile(),
        num_requests=n,
        prompt_tokens=[64, 200, 700, 1500],
        output_tokens=[5, 40, 120, 300],
        seed=seed,
    )


def config(**kwargs: object) -> ClusterConfig:
    defaults: dict[str, object] = {
        "profiles": [make_profile()] * 3,
        "policy": FcfsPolicy,
        "router": RoundRobin,
        "noise_sigma": 0.1,
        "seed": 5,
    }
    defaults.update(kwargs)
    return ClusterConfig(**defaults)  # type: ignore[arg-type]


def times(result: SimResult) -> list[list[float]]:
    return [r.token_times for r in result.requests]


def test_same_seed_same_run_and_fresh_requests() -> None:
    wl = workload()
    a, b = simulate(wl, config()), simulate(wl, config())
    assert times(a) == times(b)
    assert a.requests[0] is not b.requests[0]  # every run gets fresh requests
    assert times(simulate(wl, config(seed=6))) != times(a)
    for r in a.requests:
        assert r.is_finished and len(r.token_times) == r.true_output_tokens
    assert a.horizon_s == max(r.token_times[-1] for r in a.requests)


@pytest.mark.parametrize("noise", [0.0, 0.2])
def test_fast_forward_does_not_change_a_cluster_run(noise: float) -> None:
    wl = workload(n=80, rps=20.0)
    on = simulate(wl, config(noise_sigma=noise, fast_forward=True))
    off = simulate(wl, config(noise_sigma=noise, fast_forward=False))
    steps_on = sum(s.steps for s in on.instances)
    assert sum(s.policy_calls for s in on.instances) < steps_on
    if noise == 0.0:
        assert times(on) == times(off)
        assert steps_on == sum(s.steps for s in off.instances)
    else:  # same distribution, different draws: compare a coarse statistic
        mean_on = sum(r.token_times[-1] - r.arrival_s for r in on.requests) / len(wl)
        mean_off = sum(r.token_times[-1] - r.arrival_s for r in off.requests) / len(wl)
        assert mean_on == pytest.approx(mean_off, rel=0.1)


def test_heterogeneous_profiles_each_use_their_own_speed() -> None:
    slow = LatencyCoefficients(**{**COEFFS.to_dict(), "a_d": 6e-7, "b_d": 2e-3, "t_c": 2e-2})
    profiles = [make_profile(name="fast"), make_profile(name="slow", coefficients=slow)]
    result = simulate(workload(n=40, rps=4.0), config(profiles=profiles))
    assert all(s.steps > 0 and s.decode_tokens > 0 for s in result.instances)
    assert [s.profile for s in result.instances] == ["fast", "slow"]

    def mean_tpot(instance: int) -> float:
        tpots = [
            (r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1)
            for r in result.requests
            if result.placement[r.request_id].instance == instance and len(r.token_times) > 1
        ]
        return sum(tpots) / len(tpots)

    assert mean_tpot(1) > 2 * mean_tpot(0)


def test_pd_disaggregation_decodes_on_decode_instances() -> None:
    transfer = KvTransferModel(per_token_s=1e-5, fixed_s=2e-3)
    cfg = config(profiles=[make_profile()] * 4, pd=PdConfig(num_prefill=2, transfer=transfer))
    wl = workload(n=50)
    result = simulate(wl, cfg)
    assert not result.unfinished and not result.rejected
    prefill, decode = result.instances[:2], result.instances[2:]
    assert [s.role for s in result.instances] == ["prefill", "prefill", "decode", "decode"]
    assert all(s.decode_tokens == 0 and s.prefill_tokens > 0 for s in prefill)
    assert all(s.prefill_tokens == 0 and s.decode_tokens > 0 for s in decode)
    multi = [r for r in result.requests if r.true_output_tokens and r.true_output_tokens > 1]
    assert sum(s.transfers_in for s in decode) == len(multi)
    assert sum(s.decode_tokens for s in decode) == sum(len(r.token_times) - 1 for r in multi)
    for r in multi:
        # The second token comes after the KV transfer (plus at least one decode step).
        assert r.token_times[1] > r.token_times[0] + transfer.transfer_s(r.prompt_tokens)
        decision = result.placement[r.request_id]
        assert decision.instance in (0, 1) and decision.decode_instance in (2, 3)


def test_pd_fast_forward_keeps_kv_reports_exact() -> None:
    """Routing on reported free KV sees the same values whether decodes fast-forward or not."""
    pd = PdConfig(num_prefill=2, transfer=KvTransferModel(per_token_s=1e-5, fixed_s=1e-3))
    wl = workload(n=80, rps=20.0)

    def run(fast_forward: bool) -> SimResult:
        return simulate(
            wl,
            config(
                profiles=[make_profile(num_kv_blocks=200)] * 5,
                pd=pd,
                router=MostFreeKvDecode,
                noise_sigma=0.0,
                fast_forward=fast_forward,
            ),
        )

    on, off = run(True), run(False)
    assert times(on) == times(off)
    assert len({d.decode_instance for d in on.placement.values()}) == 3  # all decode used
    assert sum(s.preemptions for s in on.instances) > 0  # tight KV on the decode side


def test_transfer_model_from_model_shape() -> None:
    # Llama-2-7B-like: 32 layers, 32 KV heads, head_dim 128, fp16 -> 512 KiB per token.
    model = KvTransferModel.from_model_shape(
        num_layers=32, num_kv_heads=32, head_dim=128, bandwidth_bytes_per_s=50e9, fixed_s=1e-3
    )
    assert model.transfer_s(1000) == pytest.approx(1e-3 + 1000 * 2 * 32 * 32 * 128 * 2 / 50e9)


def test_rejected_requests_are_recorded_and_router_state_drains() -> None:
    small = make_profile(num_kv_blocks=64)  # 1024 tokens
    wl = poisson_workload(
        5.0,
        reference_profile=small,
        num_requests=30,
        prompt_tokens=[100, 2000],
        output_tokens=[50, 50],
        seed=2,
    )
    cfg = config(profiles=[small, small])
    fractions: list[float] = []
    result = simulate(wl, cfg, progress=fractions.append)
    big = [r for r in result.requests if r.prompt_tokens == 2000]
    assert big and result.rejected == big
    assert all(not r.token_times for r in big)
    assert len(result.finished) == len(wl) - len(big)
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_registered_policy_and_router_names_resolve() -> None:
    result = simulate(workload(n=20), config(policy="sarathi-fcfs", router="round-robin"))
    assert result.policy == "sarathi-fcfs" and result.router == "round-robin"
    assert not result.unfinished


class Idle(FcfsPolicy):
    """Never schedules anything: the cluster must end and name the stalled instance."""

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        return StepPlan()


def test_a_policy_that_stops_scheduling_is_reported_not_hung() -> None:
    result = simulate(workload(n=5), config(profiles=[make_profile()], policy=Idle))
    assert result.stalled == ["colocated-0"] and len(result.unfinished) == 5


def test_pd_config_is_validated() -> None:
    with pytest.raises(ValueError, match="prefill instances"):
        config(profiles=[make_profile()] * 2, pd=PdConfig(num_prefill=2))


def _shared_trace_available() -> bool:
    try:
        return (shared_data_dir() / "traces" / "azure_conv.csv").is_file()
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _shared_trace_available(), reason="shared trace data not available")
def test_an_hour_of_azure_conv_on_eight_instances() -> None:
    profile = make_profile(num_kv_blocks=8192)
    wl = build_workload("azure_conv", reference_profile=profile, seed=0)
    result = simulate(wl, config(profiles=[profile] * 8, noise_sigma=0.05))
    assert len(wl) == 19_366 and not result.unfinished and not result.stalled
    assert result.horizon_s > 3500.0
    assert all(s.steps > 0 for s in result.instances)
    # Fast-forward is what makes this affordable: far fewer policy calls than steps.
    assert sum(s.policy_calls for s in result.instances) * 10 < sum(
        s.steps for s in result.instances
    )
