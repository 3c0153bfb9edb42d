"""The vLLM replay's livelock guard: a livelocked policy fails the replay instead of hanging it
(GMAX's preemption cycle hung ``bench/sim_fidelity.py`` on the real side)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")
vllm_harness = pytest.importorskip("vllm_harness")

from priority.profiles import load_profile  # noqa: E402
from priority.sim.stall import LivelockError  # noqa: E402
from tests.stuck_policy import StuckPolicy  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

H = vllm_harness
PROFILE = load_profile("h100-llama3.1-8b")


def test_a_livelocked_policy_fails_the_replay_naming_it(tiny_model_dir: Path) -> None:
    clock = H.FakeClock()
    scheduler = H.build_scheduler(tiny_model_dir, num_blocks=64, policy="vllm-v1", clock=clock)
    scheduler.tiergate.policy = StuckPolicy(PROFILE.estimator())
    arrivals = [H.Arrival(clock.t, f"stuck-{i}", 100, 4) for i in (1, 2)]
    with pytest.raises(LivelockError, match=r"'stuck'.* 30 steps.*stuck-"):
        H.run_trace(
            scheduler,
            arrivals,
            PROFILE.coefficients,
            clock,
            max_steps=1_000,
            label="stuck",
            max_stalled_steps=30,
        )
