"""The goodput mix in the real vLLM scheduler: kinds, lengths and workflow stages in the replay.

``bench/sim_fidelity.py --mix goodput`` rests on three things checked here on a few dozen
requests: every call reaches the plugin with its kind, workflow, stage, sub-deadline and length
distribution (as the gateway sends them); a later workflow stage arrives only ``think`` after its
previous stage finished *in the real replay*, and every request ends at its true length below
its ``max_tokens`` cap (a stop token); and the request goodput of the real replay is the
simulator's scorer's — on a case built so the on-time requests are known by hand, and equal to
the simulator side's where both sides produce identical token times (``vllm-v1``, stock vLLM's
own behaviour, and ``gmax``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
replay = pytest.importorskip("engine_harness.replay")

from replay_cases import PROFILE  # noqa: E402

from engine_common.protocol import (  # noqa: E402
    DEADLINE_MS,
    KIND,
    STAGE,
    SUB_DEADLINE_MS,
    TPOT_MS,
    TTFT_MS,
    WORKFLOW_ID,
)
from engine_harness.sim_replay import (  # noqa: E402
    Arrival,
    arrivals_from_workload,
    identical_share,
    replay_simulator,
    request_goodput,
)
from priority.profiles import load_profile  # noqa: E402
from priority.sim import build_workload, load_trace  # noqa: E402
from priority.sim.workflows import WorkflowCall  # noqa: E402
from tests.scripts_loader import load_script  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

T0 = 1000.0
NUM_BLOCKS = 4096
LOAD = load_profile(PROFILE)


def mix_arrivals(requests_per_trace: int = 10, rps: float = 4.0) -> list[Arrival]:
    """bench/goodput.py's mix of the two Azure traces' heads, predicted lengths."""
    goodput = load_script("bench/goodput.py")
    traces = [load_trace("azure_conv"), load_trace("azure_code")]
    mix, _ = goodput.build_mix(traces, LOAD, requests_per_trace, 0)
    workload = build_workload(mix, rps=rps, reference_profile=LOAD, seed=0, lengths="predicted")
    return arrivals_from_workload(workload)


def run_real(arrivals: list[Arrival], model_dir: Path, policy: str, **kwargs: Any) -> Any:
    return replay.replay_vllm(
        arrivals,
        model_dir,
        LOAD.coefficients,
        num_blocks=NUM_BLOCKS,
        policy=policy,
        profile=PROFILE,
        **kwargs,
    )


@pytest.mark.parametrize("policy", ["vllm-v1", "gmax"])
def test_mix_replays_identically_with_stages_released_after_finish(
    policy: str, tiny_model_dir: Path
) -> None:
    arrivals = mix_arrivals()
    seen: dict[str, Any] = {}

    def record(scheduler: Any, output: Any) -> None:
        for rid in output.num_scheduled_tokens:
            seen.setdefault(rid, scheduler.tiergate.view_of(rid))

    real = run_real(arrivals, tiny_model_dir, policy, on_step=record)
    sim = replay_simulator(arrivals, LOAD, policy, num_blocks=NUM_BLOCKS)
    # every request ends at its true length, below the cap it sent
    assert any(a.target_tokens < a.max_tokens for a in arrivals)
    for a in arrivals:
        assert len(real.token_times[a.request_id]) == a.target_tokens, a.request_id
    # a later stage arrives think after its previous stage finished in this replay
    later = [a for a in arrivals if a.call is not None and a.call.previous is not None]
    assert later
    for a in later:
        assert a.call is not None and a.call.previous is not None
        done = real.token_times[a.call.previous][-1]
        sent = real.arrivals[a.request_id]
        assert sent.time == done + a.call.think_s
        assert real.token_times[a.request_id][0] > sent.time
    # the plugin read each call's metadata as sent (its sub-deadline is what it schedules for)
    for a in arrivals:
        view, sent = seen[a.request_id], real.arrivals[a.request_id]
        assert view.kind == sent.extra_args[KIND]
        assert view.arrival_s == sent.time
        assert view.length is not None and view.length.max_tokens == a.max_tokens
        if a.call is not None:
            assert view.workflow_id == sent.extra_args[WORKFLOW_ID]
            assert view.stage == sent.extra_args[STAGE] == a.call.stage
            assert view.slo.deadline_s == sent.extra_args[SUB_DEADLINE_MS] / 1e3
    # the two sides agree token by token, so the scorer gives one answer
    assert identical_share(real, sim, arrivals) == 1.0
    assert real.arrivals == sim.arrivals
    assert request_goodput(real, arrivals) == request_goodput(sim, arrivals)


def test_request_goodput_of_a_hand_checked_case(tiny_model_dir: Path) -> None:
    """Objectives either far beyond what the idle engine needs or below one step (1 ms), so the
    on-time set is known without the step times: the generous latency and deadline requests and
    the generous workflow's two calls (4 of 7)."""
    generous, impossible = 600_000.0, 1.0

    def deadline(ms: float) -> dict[str, Any]:
        return {KIND: "deadline", DEADLINE_MS: ms}

    def workflow(name: str, deadline_s: float) -> list[Arrival]:
        calls = [
            WorkflowCall(name, 0, None, 0.0, 0.5 * deadline_s, deadline_s),
            WorkflowCall(name, 1, f"{name}0", 0.2, deadline_s, deadline_s),
        ]
        return [
            Arrival(
                T0 + 0.01 * k,
                f"{name}{k}",
                64,
                200,
                {KIND: "compound", WORKFLOW_ID: name, STAGE: k},
                output_tokens=20,
                call=call,
            )
            for k, call in enumerate(calls)
        ]

    arrivals = [
        Arrival(T0, "lat", 128, 16, {KIND: "latency", TTFT_MS: generous, TPOT_MS: generous}),
        Arrival(T0, "lat-tight", 128, 16, {KIND: "latency", TTFT_MS: impossible, TPOT_MS: 1.0}),
        Arrival(T0, "dl", 256, 100, deadline(generous), output_tokens=30),
        Arrival(T0, "dl-tight", 256, 30, deadline(impossible)),
        *workflow("easy", generous / 1e3),
        *workflow("hard", impossible / 1e3)[:1],
    ]
    real = run_real(arrivals, tiny_model_dir, "vllm-v1")
    scored = request_goodput(real, arrivals)
    on_time = {k: v["goodput_requests"] for k, v in scored["per_kind"].items()}
    assert on_time == {"latency": 1, "deadline": 1, "compound": 2}
    assert scored["request_goodput"] == 4
    assert scored["request_goodput_share"] == pytest.approx(4 / 7)
    sim = replay_simulator(arrivals, LOAD, "vllm-v1", num_blocks=NUM_BLOCKS)
    assert request_goodput(sim, arrivals) == scored
