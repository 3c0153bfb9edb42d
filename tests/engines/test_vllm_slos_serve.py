"""SLOs-Serve's Fig. 3 inside the REAL vLLM scheduler (the plugin running ``slos-serve``).

The toy engine (6 tokens per time unit, 3 decodes running, a burst of 4 six-token prompts,
TTFT 6 units, TPOT 1 unit) replayed through vLLM on a virtual clock and through the simulator's
engine core with the same policy and profile: the same tokens at the same times, all three
running streams and three of the four new requests on time, the fourth best effort. Skipped
where vLLM is not installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")
replay = pytest.importorskip("engine_harness.replay")

from engine_harness.sim_replay import arrivals_from_workload, replay_simulator  # noqa: E402
from priority.gain import token_deadlines  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_scenarios import FIG3_PROFILE, fig3_workload  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

# the toy's steps last the whole TPOT, chunks may be any size, and at exactly its capacity the
# prompt's last token waits for its deadline (tests/test_slos_serve.py, the simulator's run)
PARAMS = {"tpot_share": 1.0, "min_chunk_tokens": 1, "hold_first_token": True}
SEATS = 6  # vLLM wants at least as many batched tokens as sequences: the toy's 6 tokens


def test_fig3_in_the_real_scheduler(tiny_model_dir: Path, tmp_path: Path) -> None:
    profile_path = tmp_path / "fig3.json"
    profile_path.write_text(json.dumps(FIG3_PROFILE.to_dict()))
    workload = fig3_workload()
    arrivals = arrivals_from_workload(workload)
    real = replay.replay_vllm(
        arrivals,
        tiny_model_dir,
        FIG3_PROFILE.coefficients,
        num_blocks=2000,
        policy="slos-serve",
        params=PARAMS,
        profile=str(profile_path),
        token_budget=6,
        max_num_seqs=SEATS,
    )
    sim = replay_simulator(
        arrivals,
        FIG3_PROFILE,
        "slos-serve",
        num_blocks=2000,
        params=PARAMS,
        token_budget=6,
        max_num_seqs=SEATS,
    )
    specs = {s.request_id: s for s in workload.specs}
    on_time = {}
    for rid, times in real.token_times.items():
        spec = specs[rid]
        assert len(times) == spec.output_tokens
        np.testing.assert_allclose(times, sim.token_times[rid], rtol=0, atol=1e-9)
        due = token_deadlines(spec.arrival_s, spec.slo, len(times))
        on_time[rid] = bool(np.all(np.asarray(times) <= due + 1e-9))
    assert all(on_time[f"d{i}"] for i in (1, 2, 3))
    assert sum(on_time[f"n{i}"] for i in (1, 2, 3, 4)) == 3
