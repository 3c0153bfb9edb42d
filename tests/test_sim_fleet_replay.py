"""The simulator side of a fleet replay (``engine_harness.sim_replay.replay_fleet_simulator``):
the API server's rule before the router, placements recorded (PD: prefill and decode instance),
workflows refused (the real side, against vLLM: tests/engines/test_fleet_replay.py)."""

from __future__ import annotations

import pytest

from engine_common.protocol import TPOT_MS, TTFT_MS
from engine_harness.sim_replay import (
    Arrival,
    FleetReplay,
    Replay,
    fleet_admitted,
    placement_share,
    replay_fleet_simulator,
)
from priority.profiles import load_profile
from priority.sim import KvTransferModel, PdConfig
from priority.sim.workflows import WorkflowCall

SLO = {TTFT_MS: 5_000.0, TPOT_MS: 200.0}
FLEET = [load_profile("a100-qwen2-7b"), load_profile("910b-qwen2-7b")]


def test_refused_before_routing_and_every_request_placed() -> None:
    arrivals = [Arrival(0.01 * i, f"r{i}", 500 + 40 * i, 16, SLO) for i in range(20)]
    arrivals.append(Arrival(0.05, "huge", 20_000, 16, SLO))  # beyond 1,000 blocks of 16
    out = replay_fleet_simulator(arrivals, FLEET, "slide", "min-load", num_blocks=1_001)
    assert out.replay.refused == ["huge"] and "huge" not in out.placement
    assert set(out.placement.values()) == {0, 1} and len(out.placement) == 20
    assert all(len(out.replay.token_times[f"r{i}"]) == 16 for i in range(20))
    assert len(out.steps) == 2 and all(s > 0 for s in out.steps)


def test_no_workflows_and_placement_share() -> None:
    call = WorkflowCall("w", 0, None, 0.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="workflow"):
        fleet_admitted([Arrival(0.0, "w0", 10, 4, SLO, call=call)], 8192)
    a = FleetReplay(Replay(), {"x": 0, "y": 1})
    assert placement_share(a, FleetReplay(Replay(), {"x": 0, "y": 0})) == 0.5


def test_pd_records_prefill_and_decode_instances() -> None:
    """PD-disaggregated: every request is placed on the prefill instance and handed to the
    decode instance; "placed alike" needs both to agree."""
    arrivals = [Arrival(0.01 * i, f"r{i}", 500 + 40 * i, 16, SLO) for i in range(12)]
    pd = PdConfig(num_prefill=1, transfer=KvTransferModel(per_token_s=1e-6))
    out = replay_fleet_simulator(arrivals, FLEET, "vllm-v1", "min-load", num_blocks=1_001, pd=pd)
    assert set(out.placement.values()) == {0} and set(out.decode_placement.values()) == {1}
    assert all(len(out.replay.token_times[f"r{i}"]) == 16 for i in range(12))
    assert out.steps[0] > 0 and out.steps[1] > out.steps[0]
    a = FleetReplay(Replay(), {"x": 0, "y": 0}, {"x": 2, "y": 3})
    assert placement_share(a, FleetReplay(Replay(), {"x": 0, "y": 0}, {"x": 2, "y": 2})) == 0.5
