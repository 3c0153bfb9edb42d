"""Policy parameters are validated against the real constructor, and every one of them works.

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
from priority.policies import POLICY_NAMES, make_policy, policy_class
from priority.policies.base import VLLM_ADMISSION, EngineLimits, SchedulerInput
from priority.policies.params import PolicyParamsError, parameter_names
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
        assert set(EXAMPLES[name]) == set(parameter_names(policy_class(name))), name


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_the_plugin_starts_with_every_parameter_and_plans(name: str) -> None:
    env = {"TIERGATE_POLICY": name, "TIERGATE_POLICY_PARAMS": json.dumps(EXAMPLES[name])}
    settings = EngineSettings.from_env("a100-qwen2-7b", env=env)
    policy = settings.make_policy()
    for key, value in EXAMPLES[name].items():
        got = getattr(policy, key, None)
        if isinstance(got, GainWeights):
            assert got == GainWeights(**value)
        elif isinstance(got, GoodputWeights):
            assert got == GoodputWeights(**value)
        elif got is not None:
            assert got == value, key
    for now in (1.0, 5.0):  # on time, then everything overdue
        plan = policy.schedule(step_input(now))
        assert plan.scheduled


def test_slide_gain_weights_reach_the_ranking() -> None:
    """Everything URGENT (huge gamma): the order is by gain density, so w_p : w_d decides
    between the running decode and the new prompts."""
    estimator = load_profile("a100-qwen2-7b").estimator()
    first = make_policy("slide", estimator, gain_weights={"first_token": 1000.0}, gamma=1e6)
    assert first.gain_weights == GainWeights(first_token=1000.0, decode_token=1.0)
    assert first.order(step_input(0.1))[0][-1].request_id == "run"
    plain = make_policy("slide", estimator, gamma=1e6)
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
