"""The routers users run (power-of-two, least predicted TTFT) and GoRouting's expected-gain
fallback, on constructed cluster states."""

from __future__ import annotations

import bisect
import math
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority.estimator import LatencyCoefficients
from priority.gain import GainWeights
from priority.profiles import EngineConfig, Profile
from priority.request import SLO, Request
from priority.routing import (
    USERS_ROUTERS,
    GoRouter,
    InstanceRole,
    InstanceView,
    LeastTtftRouter,
    PowerOfTwoRouter,
    make_router,
    pick_decode_instance,
    router_plugin,
)
from priority.routing.decode import pick_decode_by_capacity
from priority.routing.goroute import on_time_decode_tokens
from priority.routing.least_ttft import predict
from priority.routing.prefill_queue import PrefillQueue, slide_rank_work
from priority.sim import ClusterConfig
from priority.sim.compare import configure
from priority.sim.workload import Workload
from tests.test_routing import clusters

NOW = 100.0


def profile(
    prefill_s_per_token: float = 1e-4, decode_step_s: float = 0.0, name: str = "p"
) -> Profile:
    coefficients = LatencyCoefficients(
        a_p=0.0, b_p=0.0, c_p=prefill_s_per_token, a_d=0.0, b_d=decode_step_s, t_c=0.0
    )
    return Profile(name, "test", "test", 1, coefficients, EngineConfig(max_num_batched_tokens=4096))


def req(rid: str, prompt: int, *, ttft: float = 10.0, tpot: float = 0.1, out: int = 100) -> Request:
    return Request(rid, NOW, prompt, SLO(ttft_s=ttft, tpot_s=tpot), true_output_tokens=out)


def view(
    index: int,
    *queued: Request,
    prof: Profile | None = None,
    num_decoding: int = 0,
    role: InstanceRole = InstanceRole.COLOCATED,
) -> InstanceView:
    prof = prof or profile()
    return InstanceView(
        index,
        f"i{index}",
        prof,
        prof.estimator(),
        role,
        prefill_queue={r.request_id: r for r in queued},
        queue_updated_s=NOW,
        num_decoding=num_decoding,
    )


# ---- registry ---------------------------------------------------------------------------------


def test_users_routers_are_registered_with_defaulted_params_and_a_summary() -> None:
    for name in USERS_ROUTERS:
        plugin = router_plugin(name)
        assert plugin.summary
        assert plugin.build([view(0)]).name == name  # every parameter has a default
    assert router_plugin("power-of-two").accepts("seed")
    assert not router_plugin("min-load").accepts("seed")
    assert router_plugin("goroute").accepts("weights")


def test_bad_router_parameters_fail_at_build_time() -> None:
    with pytest.raises(TypeError):
        make_router("power-of-two", [view(0)], bogus=1)
    with pytest.raises(ValueError, match="headroom"):
        make_router("least-predicted-ttft", [view(0)], headroom=1.5)
    with pytest.raises(ValueError, match="fallback"):
        make_router("goroute", [view(0)], fallback="coin")


def test_the_simulator_seeds_routers_that_draw() -> None:
    config = ClusterConfig([profile()], "vllm-v1", "power-of-two", seed=5)
    workload = cast(Workload, SimpleNamespace(gain_weights=GainWeights()))  # all configure reads
    assert configure(config, "vllm-v1", workload).router_params == {"seed": 5}
    goroute = configure(replace(config, router="goroute"), "vllm-v1", workload)
    assert goroute.router_params == {"seed": 5, "weights": GainWeights()}
    plain = configure(ClusterConfig([profile()], "vllm-v1", "min-load"), "vllm-v1", workload)
    assert plain.router_params == {}


# ---- power-of-two -----------------------------------------------------------------------------


def test_power_of_two_is_min_load_on_two_instances() -> None:
    instances = [view(0, req("a", 10), req("b", 10)), view(1, req("c", 10))]
    assert PowerOfTwoRouter(instances).route(req("new", 10), NOW).instance == 1


def test_power_of_two_never_picks_the_most_loaded_and_reproduces_by_seed() -> None:
    instances = [view(i, *[req(f"q{i}-{j}", 10) for j in range(i)]) for i in range(4)]

    def picks(seed: int) -> list[int]:
        router = make_router("power-of-two", instances, seed=seed)
        return [router.route(req("new", 10), NOW).instance for _ in range(200)]

    first = picks(11)
    assert first == picks(11)
    assert set(first) == {0, 1, 2}  # 3 is the most loaded: it loses every pair it is drawn in
    assert first.count(0) > first.count(2)  # the lightest wins every pair it is drawn in


# ---- least predicted TTFT ---------------------------------------------------------------------


def test_prediction_of_a_lone_request_on_a_prefill_instance_is_its_zero_load_ttft() -> None:
    coefficients = LatencyCoefficients(a_p=2e-9, b_p=1e-9, c_p=5e-5, a_d=1e-7, b_d=3e-3, t_c=4e-3)
    prof = Profile("q", "test", "test", 1, coefficients, EngineConfig(max_num_batched_tokens=512))
    idle = view(0, prof=prof, role=InstanceRole.PREFILL)
    got = predict(idle, req("new", 1700), NOW)
    assert got.ttft_s == pytest.approx(prof.zero_load_ttft_s(1700))
    assert got.tpot_s == 0.0


def test_least_ttft_picks_the_fastest_predicted_first_token() -> None:
    slow = view(0, prof=profile(4e-4))  # 1000 tokens: 0.4 s
    fast = view(1, req("q", 2000), prof=profile(1e-4))  # 0.2 s queued + 0.1 s
    decision = LeastTtftRouter([slow, fast]).route(req("new", 1000), NOW)
    assert decision.instance == 1
    assert decision.predicted_ttft_s == pytest.approx(0.3)


def test_least_ttft_headroom_filter_drops_instances_that_would_miss_tpot() -> None:
    # instance 0 has the shortest queue but 50 decodes of 4 ms: a 0.2 s step > TPOT 0.1 s
    busy = view(0, prof=profile(1e-4, decode_step_s=4e-3), num_decoding=50)
    queued = view(1, req("q", 3000), prof=profile(1e-4, decode_step_s=4e-3))
    assert LeastTtftRouter([busy, queued]).route(req("new", 1000), NOW).instance == 1


def test_least_ttft_falls_back_to_least_loaded_when_none_has_headroom() -> None:
    # TTFT 0.05 s is met nowhere; instance 1 has the faster prefill but two requests queued
    instances = [view(0, req("a", 10), prof=profile(4e-4)), view(1, req("b", 10), req("c", 10))]
    assert LeastTtftRouter(instances).route(req("new", 1000, ttft=0.05), NOW).instance == 0


# ---- GoRouting's expected-gain fallback -------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    slack=st.floats(-5.0, 5.0),
    tpot=st.sampled_from([None, 0.05, 0.1]),
    step=st.floats(0.01, 0.3),
    tokens=st.integers(0, 200),
    deadline=st.one_of(st.just(math.inf), st.floats(0.0, 20.0)),
)
def test_on_time_decode_tokens_counts_like_a_token_by_token_walk(
    slack: float, tpot: float | None, step: float, tokens: int, deadline: float
) -> None:
    """Within one token of a walk over tokens 2..n (the closed form does not round)."""
    walk = 0
    for j in range(1, tokens + 1):
        stream_ok = tpot is None or slack + j * (tpot - step) > 0
        if stream_ok and j * step < deadline:
            walk += 1
    got = on_time_decode_tokens(
        slack_s=slack, tpot_s=tpot, step_s=step, tokens=tokens, deadline_slack_s=deadline
    )
    assert 0.0 <= got <= tokens
    assert abs(got - walk) <= 1.0 + 1e-9


def hopeless(rid: str = "late", *, out: int = 200) -> Request:
    return req(rid, 20_000, ttft=1.0, out=out)  # 2 s of prefill everywhere below


def test_fallback_prefers_the_instance_that_decodes_fast_enough_to_catch_up() -> None:
    # Same prefill speed and empty queues; instance 0 decodes in 0.15 s (> TPOT 0.1 s: a late
    # request never catches up), instance 1 in 0.03 s. Random would pick either.
    slow = view(0, prof=profile(1e-4, decode_step_s=0.15), num_decoding=0)
    fast = view(1, prof=profile(1e-4, decode_step_s=0.03), num_decoding=0)
    router = GoRouter([slow, fast], seed=0)
    decision = router.route(hopeless(), NOW)
    assert decision.instance == 1
    assert decision.expected_gain is not None and decision.expected_gain <= 0.0  # still Delta_p
    gains = router.fallback_gains([slow, fast], hopeless(), NOW, None)
    assert gains[1] > gains[0]


def test_fallback_prefers_the_least_late_first_token_when_decoding_alike() -> None:
    slow = view(0, prof=profile(2e-4, decode_step_s=0.03))  # first token at 4 s
    quick = view(1, prof=profile(1e-4, decode_step_s=0.03))  # at 2 s
    assert GoRouter([slow, quick], seed=0).route(hopeless(), NOW).instance == 1


def test_fallback_counts_the_decode_tokens_queued_late_requests_lose() -> None:
    # Both instances equally fast; instance 0 holds ten late streaming requests that would wait
    # 2 s longer (and catch up 2 s later), instance 1 holds one whose work is the same.
    crowd = [req(f"c{j}", 100, ttft=0.01, out=300) for j in range(10)]
    crowded = view(0, *crowd, prof=profile(1e-4, decode_step_s=0.03))
    lone = view(1, req("l", 1000, ttft=0.01, out=300), prof=profile(1e-4, decode_step_s=0.03))
    assert GoRouter([crowded, lone], seed=0).route(hopeless(), NOW).instance == 1
    # The paper's random fallback sends it to the crowd about half the time.
    random = GoRouter([crowded, lone], seed=0, fallback="random")
    assert 0 in {random.route(hopeless(), NOW).instance for _ in range(40)}


ENGINE = "engine-order"
"""GoRouting's fallback in the engine's own order (opt-in)."""


def test_engine_order_fallback_sees_a_short_request_jump_a_queue_of_long_prompts() -> None:
    # No instance meets the newcomer's 0.5 s TTFT behind its whole queue (4 s and 2 s of work),
    # so the fallback decides. Instance 0 holds long prompts (8,000 tokens: the engine serves a
    # 100-token prompt first), instance 1 short ones (50 tokens: served before it).
    longs = view(0, *[req(f"L{j}", 8_000, ttft=60.0, out=50) for j in range(5)])
    shorts = view(1, *[req(f"s{j}", 50, ttft=0.01, out=50) for j in range(400)])
    new = req("new", 100, ttft=0.5, out=100)
    decision = GoRouter([longs, shorts], seed=0, fallback=ENGINE).route(new, NOW)
    assert decision.expected_gain is not None and decision.expected_gain <= 0.0
    assert decision.predicted_ttft_s is not None and decision.predicted_ttft_s > 2.0
    engine = GoRouter([longs, shorts], seed=0, fallback=ENGINE)
    assert engine.route(new, NOW).instance == 0  # ahead of the long prompts: on time there
    swapped = GoRouter(
        [view(0, *shorts.prefill_queue.values()), view(1, *longs.prefill_queue.values())],
        seed=0,
        fallback=ENGINE,
    )
    assert swapped.route(new, NOW).instance == 1


def test_engine_order_fallback_avoids_delaying_queued_requests_that_can_still_catch_up() -> None:
    # Equal queues of equal work; the newcomer (a short prompt, served first on either) delays
    # every queued request by its prefill. On instance 0 they are late but decode fast enough
    # to catch up; on instance 1 they arrived 1,000 s ago, long past catching up.
    def queued(tag: str, arrival: float) -> list[Request]:
        return [
            Request(f"{tag}{j}", arrival, 4_000, SLO(ttft_s=0.01, tpot_s=0.1)) for j in range(5)
        ]

    fast = profile(1e-4, decode_step_s=0.03)
    hopeful = view(0, *queued("h", NOW), prof=fast)
    lost = view(1, *queued("x", NOW - 1_000.0), prof=fast)
    new = req("new", 1_000, ttft=0.05, out=100)
    assert GoRouter([hopeful, lost], seed=0, fallback=ENGINE).route(new, NOW).instance == 1
    swapped = [
        view(0, *queued("x", NOW - 1_000.0), prof=fast),
        view(1, *queued("h", NOW), prof=fast),
    ]
    assert GoRouter(swapped, seed=0, fallback=ENGINE).route(new, NOW).instance == 0


def test_fallback_under_pd_uses_the_decode_instance_for_every_prefill_candidate() -> None:
    prefill = [
        view(0, prof=profile(2e-4), role=InstanceRole.PREFILL),
        view(1, prof=profile(1e-4), role=InstanceRole.PREFILL),
    ]
    decode = view(2, prof=profile(1e-4, decode_step_s=0.03), role=InstanceRole.DECODE)
    decision = GoRouter([*prefill, decode], seed=0).route(hopeless(), NOW)
    assert (decision.instance, decision.decode_instance) == (1, 2)


# ---- the decode instance under PD -------------------------------------------------------------


def decode_view(
    index: int, *, step_s: float, block_size: int, free: int, decoding: int = 0
) -> InstanceView:
    coefficients = LatencyCoefficients(a_p=0.0, b_p=0.0, c_p=1e-4, a_d=0.0, b_d=0.0, t_c=step_s)
    engine = EngineConfig(block_size=block_size, num_kv_blocks=100_000, max_num_seqs=4)
    prof = Profile(f"d{index}", "test", "test", 1, coefficients, engine)
    v = view(index, prof=prof, role=InstanceRole.DECODE, num_decoding=decoding)
    v.num_free_kv_blocks = free
    return v


def test_most_free_kv_compares_tokens_not_blocks() -> None:
    # 2,000 free 16-token blocks (32k tokens) vs 1,000 free 128-token blocks (128k tokens)
    small = decode_view(1, step_s=0.01, block_size=16, free=2000)
    large = decode_view(2, step_s=0.01, block_size=128, free=1000)
    prefill = view(0, role=InstanceRole.PREFILL)
    assert pick_decode_instance([prefill, small, large]) == 2


def test_decode_by_capacity_prefers_a_fast_step_a_tpot_within_slo_and_a_free_slot() -> None:
    prefill = view(0, role=InstanceRole.PREFILL)
    fast = decode_view(1, step_s=0.02, block_size=16, free=90_000)
    slow = decode_view(2, step_s=0.06, block_size=16, free=99_000)
    new = req("new", 500, tpot=0.05)
    assert pick_decode_instance([prefill, fast, slow]) == 2  # most free KV
    assert pick_decode_by_capacity([prefill, fast, slow], new) == 1  # decodes within TPOT
    # the fast one full (max_num_seqs = 4 decoding): the slow one, though over TPOT
    fast.num_decoding = 4
    assert pick_decode_by_capacity([prefill, fast, slow], new) == 2
    # both within TPOT: the faster step
    assert pick_decode_by_capacity([prefill, fast, slow], req("new", 500, tpot=0.1)) == 2
    fast.num_decoding = 0
    assert pick_decode_by_capacity([prefill, fast, slow], req("new", 500, tpot=0.1)) == 1
    assert GoRouter([prefill, fast, slow]).route(new, NOW).decode_instance == 1
    paper = GoRouter([prefill, fast, slow], decode_choice="free-kv")
    assert paper.route(new, NOW).decode_instance == 2


# ---- one estimate, however it is asked for ----------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), prompt=st.integers(1, 20_000), ttft=st.floats(0.05, 5.0))
def test_batch_estimates_equal_one_by_one_and_drain_is_exec(
    cluster: list[InstanceView], prompt: int, ttft: float
) -> None:
    router = GoRouter(cluster, seed=0)
    new = req("new", prompt, ttft=ttft)
    batch = router.estimates(cluster, new, NOW)
    assert batch == [router.estimate(i, new, NOW) for i in cluster]
    for instance, estimate in zip(cluster, batch, strict=True):
        assert router.drain_s(instance, NOW) == pytest.approx(estimate.exec_s, rel=1e-12, abs=1e-12)


def test_goroute_rebinds_the_decode_instance_at_the_first_token() -> None:
    prefill = view(0, role=InstanceRole.PREFILL)
    fast = decode_view(1, step_s=0.02, block_size=16, free=90_000)
    slow = decode_view(2, step_s=0.06, block_size=16, free=99_000)
    router = GoRouter([prefill, fast, slow])
    new = req("new", 500, tpot=0.05)
    decision = router.route(new, NOW)
    assert decision.decode_instance == 1
    fast.num_decoding = 4  # filled up while the request waited for its prefill
    assert router.decode_at_handoff(new, decision, NOW + 5).decode_instance == 2
    paper = GoRouter([prefill, fast, slow], decode_choice="free-kv")
    assert paper.decode_at_handoff(new, decision, NOW + 5) is decision


def test_engine_order_is_rebuilt_once_enough_of_the_queue_changed() -> None:
    # 32 queued: kept through 2 changes (1/16 of them), rebuilt on the third.
    queued = [req(f"q{j}", 2_000, ttft=0.01) for j in range(32)]
    instances = [view(0, *queued), view(1, *queued)]
    router = GoRouter(instances, seed=0, fallback=ENGINE)
    router.route(hopeless(), NOW)
    built = router._orders[0][1]
    assert built.size == 32
    queue = instances[0].prefill_queue
    for j in range(2):
        queue[f"n{j}"] = req(f"n{j}", 100, ttft=0.01)
        router.route(hopeless(), NOW)
        assert router._orders[0][1] is built
    queue["n2"] = req("n2", 100, ttft=0.01)
    router.route(hopeless(), NOW)
    assert router._orders[0][1].size == 35


def test_engine_order_fallback_counts_the_first_tokens_it_pushes_past_their_deadline() -> None:
    # One queued end-to-end request (no TPOT: no decode catch-up to price; its deadline is its
    # first token's) of the same work on each instance; the newcomer (served first: a shorter
    # prompt) takes 0.1 s.
    # On instance 0 the queued one has 0.05 s of slack left, on instance 1 4.6 s.
    def queued(ttft: float) -> Request:
        return Request(f"q{ttft}", NOW, 4_000, SLO(deadline_s=ttft))

    new = req("new", 1_000, ttft=0.05, out=100)
    tight, loose = view(0, queued(0.45)), view(1, queued(5.0))
    assert GoRouter([tight, loose], seed=0, fallback=ENGINE).route(new, NOW).instance == 1
    assert (
        GoRouter([view(0, queued(5.0)), view(1, queued(0.45))], seed=0, fallback=ENGINE)
        .route(new, NOW)
        .instance
        == 0
    )


def test_engine_order_believes_the_head_of_the_order_progressed_and_ranks_its_rest() -> None:
    # One long prompt (8,000 tokens, 0.8 s of prefill) queued on instance 0: behind it, the
    # router's model serves it for the time that passes, so that 0.7 s later (once the queue
    # changed and the order is read again) what is left of it (~1,000 tokens) ranks ahead of a
    # 4,000-token newcomer, as slide ranks a prompt partly prefilled by what is left.
    instances = [view(0, req("L", 8_000, ttft=0.01)), view(1, req("M", 8_000, ttft=0.01))]
    router = GoRouter(instances, seed=0, fallback=ENGINE)
    router.route(hopeless(), NOW)
    queue = instances[0].prefill_queue
    assert isinstance(queue, PrefillQueue)
    assert queue.computed("L") == 0
    queue["tiny"] = req("tiny", 10, ttft=0.01)  # served first (0.001 s), then L
    router.route(hopeless(), NOW + 0.7)
    assert queue.computed("tiny") == 10
    assert queue.computed("L") == 6_990
    order = router._orders[0][1]
    newcomer = -1.0 / slide_rank_work(instances[0].estimator.coefficients, 4_000)
    assert bisect.bisect_right(order.neg_density, newcomer) == 2  # behind tiny and L's rest
    assert order.cum[2] == pytest.approx(0.101, rel=1e-3)  # what is left of them, not 0.801 s


def test_engine_order_learns_each_instance_pace_from_the_first_tokens_it_promised() -> None:
    # The newcomer is promised its first token at some wait on the instance chosen; it comes
    # twice as late: that instance's pace slows (a tenth of the way, geometrically), the other
    # keeps its own, and a router told not to calibrate keeps both.
    def fleet() -> list[InstanceView]:
        return [view(0, req("a", 8_000, ttft=0.01)), view(1, req("b", 8_000, ttft=0.01))]

    for calibrate in (True, False):
        instances = fleet()
        router = GoRouter(instances, seed=0, fallback=ENGINE, calibrate=calibrate)
        new = hopeless("new")
        decision = router.route(new, NOW)
        _, first_s = router.engine_order_terms(
            router._estimate_arrays(instances, new, NOW), new, NOW, None
        )
        promised = float(first_s[decision.instance]) - NOW
        router.on_dispatch(new, decision, NOW)
        router.on_first_token(new, decision, NOW + 2 * promised)
        other = 1 - decision.instance
        if calibrate:
            assert router._pace_correction[decision.instance] == pytest.approx(2**0.1)
            assert other not in router._pace_correction
        else:
            assert router._pace_correction == {}
