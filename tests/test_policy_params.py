"""Policy parameters are validated against the policy's dataclass, and every one of them works.

The bug this guards against: ``TIERGATE_POLICY_PARAMS={"gain_weights": {...}}`` passed start-up
(only the names were checked) and raised ``AttributeError`` on the first ``schedule()``. Here
every deployable policy is built from JSON with *every* parameter it has, through the engine
plugin's settings, and plans steps; a parameter added without an example here fails the test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_common.settings import EngineSettings, SettingsError
from priority.gain import GainWeights, GoodputWeights
from priority.policies import POLICY_NAMES, make_policy, policy_class, policy_plugin
from priority.policies.base import VLLM_ADMISSION, EngineLimits, SchedulerInput
from priority.policies.gmax import GmaxFairPolicy, GmaxParams, GmaxPolicy
from priority.policies.params import PolicyParamsError
from priority.policies.slide import SlideBatchingPolicy
from priority.profiles import load_profile
from priority.request import SLO, Request, RequestStatus

EXAMPLES: dict[str, dict[str, Any]] = {
    "vllm-v1": {"version": "0.23"},
    "vllm-v1-priority": {"version": "0.23"},
    "vllm-v0-fcfs": {},
    "sarathi-fcfs": {"min_prefill_tokens": 32},
    "sarathi-priority": {"min_prefill_tokens": 32},
    "fairbatching": {"urgent_steps": 3.0},
    "wvtc": {"input_weight": 0.5, "output_weight": 2.0, "client": "tier"},
    "rr-sjf": {"quantum": 64, "noise_sigma": 0.0, "seed": 1, "wait_resolution_s": 0.5},
    "sjf": {"noise_sigma": 0.0, "seed": 1},
    "slide": {
        "gain_weights": {"first_token": 4.0, "decode_token": 1.0},
        "gamma": 1.2,
        "eta_factor": 0.5,
        "eta_s": 0.03,
        "phi": "c",
        "min_chunk_tokens": 32,
        "starvation_prevention": True,
        "starve_threshold": 2.0,
        "max_starved_per_step": 2,
        "starve_share": 0.2,
        "kv_reserve_tokens": 16,
        "preempt_for_admission": True,
    },
    "gmax": {
        "quantile": 0.9,
        "refine_every": 8,
        "objective": "tokens",
        "goodput_weights": {"input_token": 1.0, "output_token": 8.0},
        "cutoff": 0.9,
        "frame_steps": 20,
        "preempt_margin": 0.2,
        "max_preempt_per_frame": 2,
        "aging": 0.1,
        "slack_weight": 0.3,
        "wait_timeout_s": 3.0,
        "kv_reserve_tokens": 16,
        "best_effort_deadline_s": 60.0,
        "fairness": 0.4,
        "tpot_share": 0.8,
        "min_chunk_tokens": 32,
        "likely_quantile": 0.6,
    },
    "tempo": {
        "quantile": 0.9,
        "refine_every": 8,
        "decay_alpha": 2.0,
        "goodput_weights": {"input_token": 1.0, "output_token": 8.0},
        "best_effort_deadline_s": 60.0,
        "tpot_share": 0.8,
        "min_chunk_tokens": 32,
        "frame_steps": 10,
        "preempt_margin": 0.1,
        "max_preempt_per_frame": 2,
    },
    "slos-serve": {
        "quantile": 0.8,
        "refine_every": 8,
        "tpot_share": 0.9,
        "min_chunk_tokens": 16,
        "dp_window": 8,
        "planner_budget_s": 0.002,
        "replan_interval_s": 0.1,
        "hold_first_token": False,
        "plan_margin_steps": 0.5,
    },
}
EXAMPLES["gmax-fair"] = EXAMPLES["gmax-oracle"] = EXAMPLES["gmax-fair-oracle"] = EXAMPLES["gmax"]
EXAMPLES["tempo-oracle"] = EXAMPLES["tempo"]
DEPLOYABLE = [n for n in POLICY_NAMES if not policy_class(n).uses_oracle_length]


def step_input(now: float = 1.0) -> SchedulerInput:
    slo = SLO(ttft_s=0.5, tpot_s=0.05)
    running = Request("run", 0.0, 64, slo, weight=2.0, tenant="a", tier="gold")
    running.status = RequestStatus.RUNNING
    running.num_computed_tokens = 64
    running.num_output_tokens = 1
    running.num_kv_blocks = 5
    waiting = [Request(f"w{i}", 0.1 * i, 100 + 40 * i, slo, tenant=f"t{i}") for i in range(4)]
    limits = EngineLimits(256, 8, 16, 40, VLLM_ADMISSION)
    return SchedulerInput(now, [running], waiting, limits)


def test_every_policy_parameter_has_an_example() -> None:
    for name in POLICY_NAMES:
        assert set(EXAMPLES[name]) == set(policy_plugin(name).parameter_names), name


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_the_plugin_starts_with_every_parameter_and_plans(name: str) -> None:
    env = {"TIERGATE_POLICY": name, "TIERGATE_POLICY_PARAMS": json.dumps(EXAMPLES[name])}
    settings = EngineSettings.from_env("a100-qwen2-7b", env=env)
    policy = settings.make_policy()
    for key, value in EXAMPLES[name].items():
        got = getattr(policy.params, key)
        if isinstance(got, GainWeights):
            assert got == GainWeights(**value)
        elif isinstance(got, GoodputWeights):
            assert got == GoodputWeights(**value)
        else:
            assert got == value, key
        if hasattr(policy, key):  # the attribute the policy reads is the parameter's value
            assert getattr(policy, key) == got, key
    for now in (1.0, 5.0):  # on time, then everything overdue
        plan = policy.schedule(step_input(now))
        assert plan.scheduled


def test_slide_gain_weights_reach_the_ranking() -> None:
    """Everything URGENT (huge gamma): the order is by gain density, so w_p : w_d decides
    between the running decode and the new prompts."""
    estimator = load_profile("a100-qwen2-7b").estimator()
    first = make_policy("slide", estimator, gain_weights={"first_token": 1000.0}, gamma=1e6)
    assert isinstance(first, SlideBatchingPolicy)
    assert first.params.gain_weights == GainWeights(first_token=1000.0, decode_token=1.0)
    assert first.order(step_input(0.1))[0][-1].request_id == "run"
    plain = make_policy("slide", estimator, gamma=1e6)
    assert isinstance(plain, SlideBatchingPolicy)
    assert plain.order(step_input(0.1))[0][0].request_id == "run"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"gain_weights": {"first": 4}}, "unknown field.*first"),
        ({"gain_weights": {"first_token": "many"}}, "gain_weights.first_token"),
        ({"gain_weights": 3}, "gain_weights"),
        ({"phi": "z"}, "phi"),
        ({"gamma": "fast"}, "gamma"),
        ({"min_chunk_tokens": 1.5}, "min_chunk_tokens"),
        ({"gama": 1.0}, "no parameter 'gama'"),
    ],
)
def test_bad_parameters_fail_at_start_up_with_the_parameter_named(
    params: dict[str, Any], message: str
) -> None:
    env = {"TIERGATE_POLICY": "slide", "TIERGATE_POLICY_PARAMS": json.dumps(params)}
    with pytest.raises(SettingsError, match=message):
        EngineSettings.from_env("a100-qwen2-7b", env=env)
    estimator = load_profile("a100-qwen2-7b").estimator()
    with pytest.raises(PolicyParamsError, match=message):
        make_policy("slide", estimator, **params)


def test_renamed_policies_say_their_new_name() -> None:
    with pytest.raises(KeyError, match="now 'vllm-v0-fcfs'"):
        policy_class("vllm-fcfs")
    with pytest.raises(KeyError, match="now 'vllm-v1-priority'"):
        policy_class("vllm-priority")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"gamma": 0.0}, "gamma must be > 0"),
        ({"starve_share": 2.0}, "starve_share must be in"),
    ],
)
def test_out_of_range_parameters_fail_at_start_up(params: dict[str, Any], message: str) -> None:
    """The dataclass's range checks run when the JSON is parsed, before any policy exists."""
    env = {"TIERGATE_POLICY": "slide", "TIERGATE_POLICY_PARAMS": json.dumps(params)}
    with pytest.raises(SettingsError, match=message):
        EngineSettings.from_env("a100-qwen2-7b", env=env)
    with pytest.raises(PolicyParamsError, match=f"slide: {message}"):
        policy_plugin("slide").parse(params)


def test_a_variant_is_its_family_with_other_defaults() -> None:
    """gmax-fair is GMAX with f = 0.3, not a copied constructor: a parameter it is given
    overrides only that default, and its class takes GMAX's dataclass."""
    plugin = policy_plugin("gmax-fair")
    assert plugin.params is GmaxParams is policy_plugin("gmax").params
    assert plugin.defaults == GmaxParams(fairness=0.3)
    assert plugin.parse({"cutoff": 0.5}) == GmaxParams(fairness=0.3, cutoff=0.5)
    estimator = load_profile("a100-qwen2-7b").estimator()
    assert GmaxFairPolicy(estimator).fairness == 0.3
    assert GmaxPolicy(estimator).fairness == 0.0
    assert policy_plugin("tempo").defaults.frame_steps == 20
    with pytest.raises(TypeError, match="takes GmaxParams"):
        GmaxPolicy(estimator, policy_plugin("tempo").defaults)
