"""Routers on constructed cluster states: GoRouting's branches, lag, heterogeneity, baselines."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority.estimator import LatencyCoefficients
from priority.gain import GainWeights
from priority.profiles import EngineConfig, Profile
from priority.request import SLO, Request
from priority.routing import (
    ROUTER_NAMES,
    GoRouter,
    InstanceRole,
    InstanceView,
    MinLoadRouter,
    NoHealthyInstanceError,
    RoundRobinRouter,
    RouteDecision,
    make_router,
)

NOW = 100.0


def linear_profile(seconds_per_token: float = 1e-4, name: str = "linear") -> Profile:
    """Prefill time proportional to tokens, no overheads: 1000 tokens = 0.1 s at 1e-4."""
    coefficients = LatencyCoefficients(
        a_p=0.0, b_p=0.0, c_p=seconds_per_token, a_d=0.0, b_d=0.0, t_c=0.0
    )
    return Profile(name, "test", "test", 1, coefficients, EngineConfig(max_num_batched_tokens=4096))


def req(
    rid: str,
    prompt: int,
    *,
    ttft: float = 10.0,
    arrival: float = NOW,
    weight: float = 1.0,
    tpot: float = 0.05,
    end_to_end: bool = False,
) -> Request:
    """A streaming request, or with ``end_to_end`` one whose only SLO is a ``ttft``-s deadline."""
    slo = SLO(deadline_s=ttft) if end_to_end else SLO(ttft_s=ttft, tpot_s=tpot)
    return Request(rid, arrival, prompt, slo, weight=weight)


def instance(
    index: int,
    *queued: Request,
    profile: Profile | None = None,
    role: InstanceRole = InstanceRole.COLOCATED,
    updated: float = NOW,
    healthy: bool = True,
    num_decoding: int = 0,
    free_blocks: int | None = None,
) -> InstanceView:
    profile = profile or linear_profile()
    return InstanceView(
        index=index,
        name=f"i{index}",
        profile=profile,
        estimator=profile.estimator(),
        role=role,
        healthy=healthy,
        prefill_queue={r.request_id: r for r in queued},
        queue_updated_s=updated,
        num_decoding=num_decoding,
        num_free_kv_blocks=free_blocks,
    )


def loaded(index: int, tokens: int, **kwargs: Any) -> InstanceView:
    """An instance with one queued request of ``tokens`` prompt tokens and a far deadline."""
    return instance(index, req(f"q{index}", tokens), **kwargs)


# ---- GoRouting: Algorithm 2's branches --------------------------------------------------------


def test_light_branch_picks_least_loaded_light_instance() -> None:
    # Exec = 0.15, 0.05, 0.6 s; mu * TTFT = 0.2 s, so L = {0, 1}
    router = GoRouter([loaded(0, 1500), loaded(1, 500), loaded(2, 6000)])
    decision = router.route(req("new", 500, ttft=1.0, weight=2.0), NOW)
    assert decision.instance == 1
    assert decision.expected_gain == pytest.approx(GainWeights().token_value(2.0, 1))


def test_packing_branch_picks_busiest_safe_instance() -> None:
    # Exec = 0.3, 0.4, 0.7 s, none light; with the request: 0.35, 0.45, 0.75 s
    instances = [loaded(0, 3000), loaded(1, 4000), loaded(2, 7000)]
    new = req("new", 500, ttft=1.0)
    # lambda = 0.6: H = {2}, so pack the busiest of {0, 1}
    assert GoRouter(instances, lambda_=0.6).route(new, NOW).instance == 1
    # lambda = 0.8: nothing is in H, so pack instance 2
    assert GoRouter(instances, lambda_=0.8).route(new, NOW).instance == 2
    # Min-Load balances instead
    assert MinLoadRouter(instances).route(new, NOW).instance == 0


def test_all_heavy_falls_back_to_least_loaded_candidate() -> None:
    # with the request: 0.9 and 0.87 s > lambda * TTFT = 0.8 s, yet both meet the 1 s SLO
    router = GoRouter([loaded(0, 8500), loaded(1, 8200)])
    decision = router.route(req("new", 500, ttft=1.0), NOW)
    assert decision.instance == 1
    assert decision.expected_gain is not None and decision.expected_gain > 0


def test_alpha_drops_instances_where_the_request_harms_queued_ones() -> None:
    # Instance 0 is lighter, but its queued request (due in 0.12 s) would then miss its TTFT:
    # Delta_0 = 2 - 1 = 1, Delta_1 = 2.
    tight = req("tight", 1000, ttft=0.12)
    instances = [instance(0, tight), loaded(1, 1500)]
    new = req("new", 500, ttft=1.0, weight=2.0)
    estimates = [GoRouter(instances).estimate(i, new, NOW) for i in instances]
    assert [e.delta for e in estimates] == pytest.approx([1.0, 2.0])
    assert GoRouter(instances, alpha=0.9).route(new, NOW).instance == 1
    assert GoRouter(instances, alpha=0.5).route(new, NOW).instance == 0  # both light; 0 lighter


def test_random_fallback_is_seeded_when_no_instance_meets_the_slo() -> None:
    instances = [instance(i) for i in range(3)]
    hopeless = req("big", 20_000, ttft=1.0)  # 2 s of prefill everywhere

    def picks(seed: int) -> list[int]:
        router = GoRouter(instances, seed=seed, fallback="random")
        return [router.route(hopeless, NOW).instance for _ in range(60)]

    first = picks(7)
    assert first == picks(7)
    assert set(first) == {0, 1, 2}
    decision = GoRouter(instances, rng=np.random.default_rng(1), fallback="random").route(
        hopeless, NOW
    )
    assert decision.expected_gain == 0.0


def test_random_fallback_avoids_instances_where_the_request_would_harm_others() -> None:
    # On instance 0 the request would push a queued request (due in 1 s) past its deadline.
    instances = [instance(0, req("q", 1000, ttft=1.0)), instance(1), instance(2)]
    hopeless = req("big", 20_000, ttft=1.0)
    careful = GoRouter(instances, seed=3, fallback="random")
    assert {careful.route(hopeless, NOW).instance for _ in range(60)} == {1, 2}
    uniform = GoRouter(instances, seed=3, avoid_harm_on_fallback=False, fallback="random")
    assert 0 in {uniform.route(hopeless, NOW).instance for _ in range(60)}


# ---- GoRouting: estimates -------------------------------------------------------------------


def test_lag_compensation_changes_the_decision() -> None:
    new = req("new", 500, ttft=1.0)
    light = instance(1, req("b", 1000, arrival=NOW - 0.46))  # Exec 0.1 s, fresh

    def with_instance0_updated(at: float) -> int:
        busy = instance(0, req("a", 5000, arrival=NOW - 0.46), updated=at)  # 0.5 s of work
        return GoRouter([busy, light]).route(new, NOW).instance

    assert with_instance0_updated(NOW) == 1  # 0.5 s vs 0.1 s: only instance 1 is light
    assert with_instance0_updated(NOW - 0.46) == 0  # 0.46 s ran since: ~0.04 s left


def test_lag_does_not_shorten_the_new_request() -> None:
    stale = instance(0, req("a", 1000, arrival=NOW - 5.0), updated=NOW - 5.0)
    estimate = GoRouter([stale]).estimate(stale, req("new", 3000), NOW)
    assert estimate.exec_s == 0.0
    assert estimate.exec_with_s == pytest.approx(0.3)


def test_faster_profile_wins_when_only_it_meets_the_ttft_slo() -> None:
    slow = instance(0, profile=linear_profile(4e-4, "910b-like"))  # 2000 tokens: 0.8 s
    fast = instance(1, profile=linear_profile(1e-4, "a100-like"))  # 2000 tokens: 0.2 s
    router = GoRouter([slow, fast])
    assert router.route(req("new", 2000, ttft=0.5), NOW).instance == 1
    # When both meet the SLO both are idle candidates and the lower index wins the tie.
    assert router.route(req("new", 2000, ttft=1.0), NOW).instance == 0


def test_pd_prefill_exec_of_a_lone_request_is_the_profiles_zero_load_ttft() -> None:
    coefficients = LatencyCoefficients(a_p=2e-9, b_p=1e-9, c_p=5e-5, a_d=1e-7, b_d=3e-3, t_c=4e-3)
    profile = Profile(
        "quad", "test", "test", 1, coefficients, EngineConfig(max_num_batched_tokens=512)
    )
    idle = instance(0, profile=profile, role=InstanceRole.PREFILL)
    estimate = GoRouter([idle]).estimate(idle, req("new", 1700), NOW)  # four chunks
    assert estimate.exec_s == 0.0
    assert estimate.exec_with_s == pytest.approx(profile.zero_load_ttft_s(1700))


def test_colocated_exec_scales_by_eq8_and_adds_decode_interference() -> None:
    coefficients = LatencyCoefficients(a_p=0.0, b_p=0.0, c_p=1e-4, a_d=0.0, b_d=2e-3, t_c=0.01)
    profile = Profile(
        "co", "test", "test", 1, coefficients, EngineConfig(max_num_batched_tokens=4096)
    )
    busy = instance(0, req("a", 1000, tpot=0.05), profile=profile, num_decoding=10)
    estimate = GoRouter([busy]).estimate(busy, req("new", 1000, tpot=0.05), NOW)
    factor = 0.05 / (0.05 - 0.01)  # t_budget = the TPOT SLO (deadlines are far)
    assert estimate.exec_s == pytest.approx(factor * 0.1 + 10 * 2e-3)
    assert estimate.exec_with_s == pytest.approx(factor * 0.2 + 10 * 2e-3)


def test_overdue_requests_do_not_blow_up_the_batch_factor() -> None:
    coefficients = LatencyCoefficients(a_p=0.0, b_p=0.0, c_p=1e-4, a_d=0.0, b_d=0.0, t_c=0.01)
    profile = Profile("co", "test", "test", 1, coefficients, EngineConfig())
    late = req("late", 1000, ttft=0.5, arrival=NOW - 3.0)
    inst = instance(0, late, profile=profile)
    estimate = GoRouter([inst]).estimate(inst, req("new", 1000), NOW)
    assert 0.1 <= estimate.exec_s <= 2 * 0.1
    assert estimate.gain_before == 0.0  # the overdue request earns nothing either way


def test_decode_interference_steers_colocated_requests() -> None:
    coefficients = LatencyCoefficients(a_p=0.0, b_p=0.0, c_p=1e-4, a_d=0.0, b_d=2e-3, t_c=0.0)
    profile = Profile("co", "test", "test", 1, coefficients, EngineConfig())
    decoding = loaded(0, 500, profile=profile, num_decoding=100)  # 0.05 + 0.2 s
    quiet = loaded(1, 1000, profile=profile)  # 0.1 s
    assert GoRouter([decoding, quiet]).route(req("new", 500, ttft=1.0), NOW).instance == 1


def test_queue_memo_follows_changes_at_the_same_timestamp() -> None:
    # First token of "a" and dispatch of "b" at the same instant leave length and timestamp
    # unchanged; the router must still see "b"'s longer prompt.
    router = GoRouter([instance(0)])
    a, b = req("a", 1000), req("b", 6000)
    on_0 = RouteDecision(0)
    router.on_dispatch(a, on_0, NOW)
    new = req("new", 500, ttft=1.0)
    router.route(new, NOW)  # fills the memo
    router.on_first_token(a, on_0, NOW)
    router.on_dispatch(b, on_0, NOW)
    cached = router.estimate(router.instances[0], new, NOW)
    fresh = GoRouter(router.instances).estimate(router.instances[0], new, NOW)
    assert cached == fresh
    assert cached.exec_s == pytest.approx(0.6 + 0.0)


# ---- decode-instance choice (PD-disaggregation) -----------------------------------------------


def pd_cluster() -> list[InstanceView]:
    decode = InstanceRole.DECODE
    return [
        instance(0, role=InstanceRole.PREFILL),
        instance(1, role=decode, free_blocks=100),
        instance(2, role=decode, free_blocks=300, num_decoding=4),
        instance(3, role=decode, free_blocks=None),
        instance(4, role=decode, free_blocks=300, num_decoding=2),
        instance(5, role=decode, free_blocks=1000, healthy=False),
        instance(6, role=InstanceRole.PREFILL, healthy=False),
    ]


FREE_KV_DECODE: list[tuple[str, dict[str, Any]]] = [
    ("round-robin", {}),
    ("min-load", {}),
    ("power-of-two", {}),
    ("goroute", {"decode_choice": "free-kv"}),
]
"""Routers whose PD decode instance is the one with the most free KV (the paper's choice)."""


@pytest.mark.parametrize(("name", "params"), FREE_KV_DECODE)
def test_pd_decode_instance_has_most_free_blocks(name: str, params: dict[str, Any]) -> None:
    router = make_router(name, pd_cluster(), **params)
    decision = router.route(req("new", 500, ttft=1.0), NOW)
    assert decision.instance == 0  # the only healthy prefill instance
    assert decision.decode_instance == 4  # 300 free blocks, fewer decoding than instance 2
    router.on_kv_report(3, 5000)
    assert router.route(req("new", 500, ttft=1.0), NOW).decode_instance == 3


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_colocated_decisions_have_no_decode_instance(name: str) -> None:
    decision = make_router(name, [instance(0), instance(1)]).route(req("new", 100), NOW)
    assert decision.decode_instance is None


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_no_healthy_instance_raises(name: str) -> None:
    with pytest.raises(NoHealthyInstanceError):
        make_router(name, [instance(0, healthy=False)]).route(req("new", 100), NOW)
    cluster = [
        instance(0, role=InstanceRole.PREFILL),
        instance(1, role=InstanceRole.DECODE, healthy=False),
    ]
    with pytest.raises(NoHealthyInstanceError):
        make_router(name, cluster).route(req("new", 100), NOW)


# ---- baselines --------------------------------------------------------------------------------


def test_round_robin_cycles_and_skips_unhealthy() -> None:
    instances = [instance(i) for i in range(4)]
    instances[2].healthy = False
    router = RoundRobinRouter(instances)
    picks = []
    for n in range(7):
        r = req(f"r{n}", 100)
        decision = router.route(r, NOW)
        assert router.route(r, NOW) == decision  # route alone does not advance the cycle
        router.on_dispatch(r, decision, NOW)
        picks.append(decision.instance)
        if n == 3:
            instances[2].healthy = True
    assert picks == [0, 1, 3, 0, 1, 2, 3]


def test_min_load_counts_queued_and_decoding_and_breaks_ties_low() -> None:
    instances = [
        instance(0, req("a", 10), req("b", 10)),
        instance(1, num_decoding=1),
        instance(2, req("c", 10)),
        instance(3, num_decoding=3, healthy=False),
    ]
    router = MinLoadRouter(instances)
    assert router.route(req("new", 10), NOW).instance == 1
    router.on_first_token(req("x", 10), RouteDecision(2), NOW)  # instance 2: 1 queued + 1 decoding
    assert router.route(req("new", 10), NOW).instance == 1
    router.on_dispatch(req("y", 10), RouteDecision(1), NOW)
    assert router.route(req("new", 10), NOW).instance == 0  # 2 vs 2 vs 2: lowest index


# ---- registry ---------------------------------------------------------------------------------


def test_make_router_builds_each_router_and_forwards_parameters() -> None:
    instances = [instance(0)]
    assert ROUTER_NAMES == (
        "round-robin",
        "min-load",
        "goroute",
        "power-of-two",
        "least-predicted-ttft",
    )
    assert isinstance(make_router("round-robin", instances), RoundRobinRouter)
    assert isinstance(make_router("min-load", instances), MinLoadRouter)
    router = make_router("goroute", instances, alpha=0.5, weights=GainWeights(3.0, 1.0))
    assert isinstance(router, GoRouter) and router.alpha == 0.5


def test_make_router_rejects_unknown_names_and_bad_parameters() -> None:
    with pytest.raises(KeyError, match="round-robin, min-load, goroute"):
        make_router("least-latency", [instance(0)])
    with pytest.raises(ValueError, match="mu < lambda"):
        make_router("goroute", [instance(0)], mu=0.8, lambda_=0.5)
    with pytest.raises(ValueError, match="alpha"):
        make_router("goroute", [instance(0)], alpha=0.0)
    with pytest.raises(ValueError):
        make_router("min-load", [])


# ---- properties -------------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> list[InstanceView]:
    n = draw(st.integers(1, 6))
    out = []
    for i in range(n):
        queued = [
            req(
                f"q{i}-{j}",
                draw(st.integers(1, 9000)),
                ttft=draw(st.floats(0.05, 5.0)),
                arrival=NOW - draw(st.floats(0.0, 3.0)),
                weight=draw(st.sampled_from([1.0, 2.0])),
                end_to_end=draw(st.booleans()),
            )
            for j in range(draw(st.integers(0, 5)))
        ]
        out.append(
            instance(
                i,
                *queued,
                profile=linear_profile(draw(st.sampled_from([1e-4, 3e-4]))),
                updated=NOW - draw(st.floats(0.0, 2.0)),
                healthy=draw(st.booleans()) or i == 0,
                num_decoding=draw(st.integers(0, 20)),
            )
        )
    return out


@settings(max_examples=60, deadline=None)
@given(
    cluster=clusters(),
    prompt=st.integers(1, 20_000),
    ttft=st.floats(0.05, 5.0),
    end_to_end=st.booleans(),
)
def test_routers_are_pure_and_pick_healthy_instances(
    cluster: list[InstanceView], prompt: int, ttft: float, end_to_end: bool
) -> None:
    def snapshot() -> list[tuple[object, ...]]:
        return [(tuple(i.prefill_queue), i.queue_updated_s, i.num_decoding) for i in cluster]

    new = req("new", prompt, ttft=ttft, end_to_end=end_to_end)
    before = snapshot()
    for name in ROUTER_NAMES:
        router = make_router(name, cluster)
        decision = router.route(new, NOW)
        assert cluster[decision.instance].healthy
        assert snapshot() == before
    go = GoRouter(cluster, seed=0)
    decision = go.route(new, NOW)
    deltas = {i.index: go.estimate(i, new, NOW).delta for i in cluster if i.healthy}
    assert decision.expected_gain == pytest.approx(deltas[decision.instance])
    # a placement that meets the SLO is never traded for one far below the best gain
    if max(deltas.values()) > 0:
        assert deltas[decision.instance] >= go.alpha * max(deltas.values())
