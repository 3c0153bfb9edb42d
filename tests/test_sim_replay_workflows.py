"""Replays of the goodput mix without vLLM: workflow release, the xargs a released call carries,
and the request-goodput scorer on hand-checked token times (``engine_harness.sim_replay``)."""

from __future__ import annotations

import pytest

from engine_common.protocol import (
    DEADLINE_MS,
    KIND,
    LENGTH,
    SUB_DEADLINE_MS,
    TPOT_MS,
    TTFT_MS,
    WORKFLOW_ID,
)
from engine_harness.sim_replay import (
    Arrival,
    ArrivalQueue,
    Replay,
    arrivals_from_workload,
    replay_simulator,
    request_goodput,
    request_of,
)
from priority.profiles import load_profile
from priority.sim import build_workload, load_trace
from priority.sim.workflows import WorkflowCall
from tests.scripts_loader import load_script

PROFILE = load_profile("a100-qwen2-7b")


def compound(rid: str, t: float, call: WorkflowCall, *, tokens: int = 4) -> Arrival:
    args = {KIND: "compound", WORKFLOW_ID: call.workflow_id, "tiergate_stage": call.stage}
    return Arrival(t, rid, 32, 64, args, output_tokens=tokens, call=call)


def workflow(name: str, deadline_s: float, think_s: float = 0.5) -> tuple[Arrival, Arrival]:
    """Two stages from t = 0, their sub-deadlines 40% and 80% of the way to the deadline."""
    first = WorkflowCall(name, 0, None, 0.0, 0.4 * deadline_s, deadline_s)
    second = WorkflowCall(name, 1, f"{name}0", think_s, 0.8 * deadline_s, deadline_s)
    return compound(f"{name}0", 0.0, first), compound(f"{name}1", 0.1, second)


def test_queue_holds_a_stage_until_its_previous_finishes() -> None:
    w0, w1 = workflow("w", deadline_s=5.0)
    other = Arrival(2.0, "x", 16, 4, {TTFT_MS: 500.0, TPOT_MS: 100.0})
    queue = ArrivalQueue([w1, other, w0])
    assert queue.held == 1 and queue.next_time() == 0.0
    (first,) = queue.pop_due(0.0)
    assert first.request_id == "w0"
    assert first.extra_args[DEADLINE_MS] == pytest.approx(5000.0)  # time left: all of it
    assert first.extra_args[SUB_DEADLINE_MS] == pytest.approx(2000.0)  # 0.4 x 5 s
    assert queue.next_time() == 2.0  # w1's planned 0.1 s means nothing: it waits for w0
    queue.finished("w0", 3.0)
    assert queue.held == 0
    assert [a.request_id for a in queue.pop_due(3.4)] == ["x"]
    assert queue.pop_due(3.49) == []
    (second,) = queue.pop_due(3.5)
    assert second.request_id == "w1" and second.time == 3.5
    assert second.extra_args[DEADLINE_MS] == pytest.approx(1500.0)  # 0 + 5 - 3.5 s left
    assert second.extra_args[SUB_DEADLINE_MS] == pytest.approx(500.0)  # 0 + 4 - 3.5 s
    assert queue.next_time() is None
    assert set(queue.released) == {"w0", "w1", "x"}
    assert request_of(second).slo.deadline_s == pytest.approx(0.5)  # the plugin's reading


def test_a_late_stage_gets_the_minimum_deadline() -> None:
    w0, w1 = workflow("w", deadline_s=1.0)
    queue = ArrivalQueue([w0, w1])
    queue.pop_due(0.0)
    queue.finished("w0", 2.0)
    (late,) = queue.pop_due(2.5)
    assert late.extra_args[SUB_DEADLINE_MS] == pytest.approx(1.0)  # 1 ms: already missed
    assert late.extra_args[DEADLINE_MS] == pytest.approx(1.0)


def test_simulator_releases_each_stage_after_its_previous_finished() -> None:
    w0, w1 = workflow("w", deadline_s=60.0, think_s=0.25)
    busy = Arrival(0.0, "busy", 4000, 50, {TTFT_MS: 60_000.0, TPOT_MS: 1000.0})
    replay = replay_simulator([busy, w0, w1], PROFILE, "vllm-v1", num_blocks=4096)
    finish = replay.token_times["w0"][-1]
    assert replay.arrivals["w1"].time == finish + 0.25
    assert replay.token_times["w1"][0] > replay.arrivals["w1"].time > w1.time
    assert {k: len(v) for k, v in replay.token_times.items()} == {"busy": 50, "w0": 4, "w1": 4}


def test_request_goodput_hand_checked() -> None:
    """Nine requests, four on time: the latency one whose tokens meet TTFT + TPOT, the deadline
    one done by its deadline, and both calls of the workflow whose last call ends by the
    workflow deadline although that call missed its own sub-deadline."""
    stream = {KIND: "latency", TTFT_MS: 100.0, TPOT_MS: 50.0}
    deadline = {KIND: "deadline", DEADLINE_MS: 1000.0}
    a0, a1 = workflow("a", deadline_s=2.0)
    b0, b1 = workflow("b", deadline_s=2.0)
    arrivals = [
        Arrival(0.0, "lat", 8, 3, stream),
        Arrival(0.0, "lat-late", 8, 3, stream),
        Arrival(0.0, "dl", 8, 2, deadline),
        Arrival(0.0, "dl-late", 8, 2, deadline),
        Arrival(0.0, "dl-unfinished", 8, 3, deadline),
        a0,
        a1,
        b0,
        b1,
    ]
    queue = ArrivalQueue(arrivals)
    queue.pop_due(0.0)
    queue.finished("a0", 0.5)
    queue.finished("b0", 0.5)
    queue.pop_due(1.0)
    times = {
        "lat": [0.05, 0.10, 0.15],  # due 0.10, 0.15, 0.20
        "lat-late": [0.2, 0.25, 0.3],  # first token after its 0.1 s TTFT
        "dl": [0.5, 0.9],
        "dl-late": [0.5, 1.2],
        "dl-unfinished": [0.1, 0.2],  # 2 of its 3 tokens
        "a0": [0.2, 0.3, 0.4, 0.5],
        "a1": [1.2, 1.5, 1.8, 1.9],  # after its sub-deadline (1.6 s), before the workflow's
        "b0": [0.2, 0.3, 0.4, 0.5],
        "b1": [1.2, 1.5, 1.8, 2.5],  # after the workflow's 2 s
    }
    assert queue.released["a1"].time == 1.0  # a0 done at 0.5, think 0.5
    assert request_of(queue.released["a1"]).slo.deadline_s == pytest.approx(0.6)
    scored = request_goodput(Replay(token_times=times, arrivals=queue.released), arrivals)
    assert scored["request_goodput"] == 4
    assert scored["request_goodput_share"] == pytest.approx(4 / 9)
    kinds = scored["per_kind"]
    assert {k: v["goodput_requests"] for k, v in kinds.items()} == {
        "latency": 1,
        "deadline": 1,
        "compound": 2,
    }
    assert {k: v["submitted"] for k, v in kinds.items()} == {
        "latency": 2,
        "deadline": 3,
        "compound": 4,
    }


def test_goodput_mix_carries_kinds_lengths_and_workflows() -> None:
    goodput = load_script("bench/goodput.py")
    traces = [load_trace("azure_conv"), load_trace("azure_code")]
    mix, _ = goodput.build_mix(traces, PROFILE, 12, 0)
    workload = build_workload(mix, rps=2.0, reference_profile=PROFILE, seed=0, lengths="predicted")
    arrivals = arrivals_from_workload(workload)
    assert {a.extra_args[KIND] for a in arrivals} == {"latency", "deadline", "compound"}
    assert all(LENGTH in a.extra_args for a in arrivals)
    assert all(a.output_tokens is not None and a.target_tokens <= a.max_tokens for a in arrivals)
    later = [a for a in arrivals if a.call is not None and a.call.previous is not None]
    assert later, "the mix has multi-stage workflows"
    replay = replay_simulator(arrivals, PROFILE, "gmax", num_blocks=67_659)
    for a in later:
        assert a.call is not None and a.call.previous is not None
        sent = replay.arrivals[a.request_id]
        assert sent.time == replay.token_times[a.call.previous][-1] + a.call.think_s
    assert all(len(replay.token_times[a.request_id]) == a.target_tokens for a in arrivals)
    scored = request_goodput(replay, arrivals)
    assert 0 < scored["request_goodput"] <= len(arrivals)
