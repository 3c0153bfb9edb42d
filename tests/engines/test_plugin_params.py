"""The plugin starts inside the real vLLM scheduler with every parameter of every deployable
policy (given as ``TIERGATE_POLICY_PARAMS`` JSON) and serves a trace under KV pressure.

Guards the bug where ``{"gain_weights": {...}}`` passed start-up and raised on the first step.
The parameter examples are the main environment's (``tests/test_policy_params.py``), which
fails when a policy gains a parameter without one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
replay = pytest.importorskip("engine_harness.replay")

import vllm  # noqa: E402
from replay_cases import KV_POOLS, PROFILE, arrivals  # noqa: E402

from priority.policies import POLICY_NAMES, policy_class  # noqa: E402
from priority.profiles import load_profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_policy_params import EXAMPLES  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

DEPLOYABLE = [n for n in POLICY_NAMES if not policy_class(n).uses_oracle_length]


@pytest.mark.parametrize("policy", DEPLOYABLE)
def test_every_parameter_reaches_a_running_plugin(policy: str, tiny_model_dir: Path) -> None:
    params = dict(EXAMPLES[policy])
    if "version" in params:  # the V1 transcriptions follow the vLLM under test
        params["version"] = "0.23" if str(vllm.__version__).startswith("0.23") else "0.33"
    head = arrivals()[:60]
    run = replay.replay_vllm(
        head,
        tiny_model_dir,
        load_profile(PROFILE).coefficients,
        num_blocks=KV_POOLS["tight"],
        policy=policy,
        params=params,
        profile=PROFILE,
    )
    for a in head:
        assert len(run.token_times[a.request_id]) == a.max_tokens, a.request_id
