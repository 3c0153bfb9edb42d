"""The vLLM-free parts of the engine plugins: settings, SLO metadata, state codec, step timing.

These run in the main environment (no vLLM needed).
"""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")  # main environment only (not in .ci/engines.sh venvs)

from hypothesis import given
from hypothesis import strategies as st

from engine_common.settings import BestEffortDefaults, EngineSettings, SettingsError
from engine_common.slo import parse_meta
from engine_common.state import KEY_PREFIX, PolicyState, encode, pop_state
from engine_common.timing import StepTimer
from priority.policies.slide import SlideBatchingPolicy
from priority.request import SLO

DEFAULTS = BestEffortDefaults()


def test_settings_defaults_and_overrides() -> None:
    s = EngineSettings.from_env("910b-qwen2-7b", env={})
    assert (s.policy, s.profile.name) == ("slide", "910b-qwen2-7b")
    assert isinstance(s.make_policy(), SlideBatchingPolicy)
    s = EngineSettings.from_env(
        "910b-qwen2-7b",
        env={
            "TIERGATE_POLICY": "sarathi-priority",
            "TIERGATE_PROFILE": "a100-qwen2-7b",
            "TIERGATE_DEFAULT_TPOT_MS": "50",
            "TIERGATE_DEFAULT_TTFT_MS": "400",
            "TIERGATE_ESTIMATOR_WINDOW": "4",
        },
    )
    assert (s.policy, s.profile.name, s.window) == ("sarathi-priority", "a100-qwen2-7b", 4)
    assert (s.defaults.tpot_s, s.defaults.ttft_s) == (0.05, 0.4)
    policy = s.make_policy()
    assert policy.estimator.window == 4 and policy.estimator.beta == 1.0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TIERGATE_POLICY": "fifo"}, "known: vllm-v1"),
        ({"TIERGATE_POLICY": "sjf"}, "only exist in simulation"),
        ({"TIERGATE_PROFILE": "tpu-v9"}, "shipped profiles: .*910b-qwen2-7b"),
        ({"TIERGATE_POLICY_PARAMS": "[1]"}, "JSON object"),
        ({"TIERGATE_POLICY_PARAMS": "{bad"}, "not JSON"),
        ({"TIERGATE_POLICY_PARAMS": '{"gamma": -1}'}, "gamma"),
        ({"TIERGATE_POLICY_PARAMS": '{"gama": 1}'}, "POLICY_PARAMS"),
        ({"TIERGATE_DEFAULT_TPOT_MS": "fast"}, "not a number"),
        ({"TIERGATE_DEFAULT_WEIGHT": "0"}, "must be > 0"),
        ({"TIERGATE_ESTIMATOR_THETA": "1.5"}, "THETA"),
    ],
)
def test_settings_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        EngineSettings.from_env("h100-llama3.1-8b", env=env)


def test_full_metadata_is_parsed() -> None:
    meta = parse_meta(
        {
            "tiergate_weight": 2.5,
            "tiergate_ttft_ms": 300,
            "tiergate_tpot_ms": "40",
            "tiergate_deadline_ms": 9000,
            "tiergate_arrival_unix_s": 1.7e9,
            "tiergate_tier": "gold",
            "tiergate_tenant": "acme",
        },
        priority=5,
        defaults=DEFAULTS,
        zero_load_ttft_s=0.01,
    )
    assert meta.slo == SLO(ttft_s=0.3, tpot_s=0.04, deadline_s=9.0)
    assert (meta.weight, meta.tier, meta.tenant, meta.arrival_s) == (2.5, "gold", "acme", 1.7e9)
    assert meta.has_slo


def test_missing_metadata_is_best_effort() -> None:
    meta = parse_meta(None, 0, defaults=DEFAULTS, zero_load_ttft_s=0.1)
    assert meta.slo == SLO(ttft_s=0.5, tpot_s=0.1)  # 5 x zero-load TTFT
    assert (meta.weight, meta.tier, meta.tenant) == (1.0, "default", "default")
    assert meta.arrival_s is None
    assert not meta.has_slo
    short = parse_meta({}, 0, defaults=DEFAULTS, zero_load_ttft_s=0.001)
    assert short.slo.ttft_s == DEFAULTS.ttft_floor_s


def test_deadline_only_and_half_given_slos() -> None:
    deadline_only = parse_meta(
        {"tiergate_deadline_ms": 2000}, 0, defaults=DEFAULTS, zero_load_ttft_s=0.1
    )
    assert deadline_only.slo == SLO(deadline_s=2.0)
    tpot_only = parse_meta({"tiergate_tpot_ms": 30}, 0, defaults=DEFAULTS, zero_load_ttft_s=0.1)
    assert tpot_only.slo == SLO(ttft_s=0.5, tpot_s=0.03)


def test_priority_maps_to_weight_when_no_weight_is_sent() -> None:
    def weight(priority: int) -> float:
        return parse_meta({}, priority, defaults=DEFAULTS, zero_load_ttft_s=0.1).weight

    assert weight(-1) == 2.0 and weight(0) == 1.0 and weight(1) == 0.5
    assert weight(-1000) == 2.0**10 and weight(1000) == 2.0**-10
    assert [weight(p) for p in range(-3, 4)] == sorted(
        (weight(p) for p in range(-3, 4)), reverse=True
    )


@given(
    st.builds(
        PolicyState,
        num_urgent=st.integers(0, 10_000),
        num_normal=st.integers(0, 10_000),
        latency_budget_s=st.floats(0, 100),
        beta=st.floats(0.01, 100),
        estimator_error=st.floats(0, 100),
        plan_deviations=st.integers(0, 10**9),
        steps=st.integers(0, 10**9),
        num_hopeless=st.integers(0, 10**6),
        refits=st.integers(0, 10**6),
        coefficients=st.tuples(*[st.floats(0, 1, allow_subnormal=True)] * 7),
        received=st.dictionaries(
            st.text(min_size=1, max_size=12).filter(lambda t: "|" not in t),
            st.integers(0, 10**9),
            max_size=5,
        ).map(lambda d: tuple((f"{k}|latency|slo", v) for k, v in d.items())),
    )
)
def test_state_survives_the_stats_channel(state: PolicyState) -> None:
    lora = {"real-adapter": 3}
    encode(state, lora)
    assert all(isinstance(v, int) for v in lora.values())
    back = pop_state(lora)
    assert lora == {"real-adapter": 3}
    assert back is not None
    assert (
        back.num_urgent,
        back.num_normal,
        back.plan_deviations,
        back.steps,
        back.num_hopeless,
    ) == (
        state.num_urgent,
        state.num_normal,
        state.plan_deviations,
        state.steps,
        state.num_hopeless,
    )
    for name in ("latency_budget_s", "beta", "estimator_error"):
        assert getattr(back, name) == pytest.approx(getattr(state, name), abs=1e-6)
    assert back.refits == state.refits
    assert back.coefficients == state.coefficients  # exactly: the double's own bits travel
    assert sorted(back.received) == sorted(state.received)


def test_pop_state_ignores_foreign_dicts_and_strips_unknown_keys() -> None:
    assert pop_state({"adapter": 1}) is None
    stats = {KEY_PREFIX + "future_field": 5, "adapter": 1}
    assert pop_state(stats) == PolicyState()
    assert stats == {"adapter": 1}


def test_step_timer_sync_and_overlapped() -> None:
    timer: StepTimer[str] = StepTimer()
    timer.scheduled(10.0, 0.5, "a")  # synchronous: runs between schedule and update
    m = timer.completed(10.4)
    assert m is not None and (m.raw_predicted_s, m.payload) == (0.5, "a")
    assert m.real_s == pytest.approx(0.4)
    # asynchronous: c is scheduled while b runs; each starts when the previous one finished
    timer.scheduled(10.5, 0.2, "b")
    timer.scheduled(10.6, 0.2, "c")
    b = timer.completed(10.8)
    c = timer.completed(11.1)
    assert b is not None and c is not None
    assert b.real_s == pytest.approx(0.3) and c.real_s == pytest.approx(0.3)
    assert timer.completed(12.0) is None and len(timer) == 0
