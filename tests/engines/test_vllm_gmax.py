"""GMAX, gmax-fair and Tempo inside the REAL vLLM scheduler, driven step by step.

Worked examples where the length-aware rule decides something stock vLLM (FCFS) decides the other
way, with the request kinds, deadlines and length distributions arriving as the gateway sends
them (``vllm_xargs``); and the drop-in guarantees — limits, preemption and recompute, nothing
lost, exact outputs under asynchronous scheduling — for every length-aware policy the plugin
accepts. Run by ``.ci/engines.sh`` in each vLLM environment; skipped where vLLM is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
vllm_harness = pytest.importorskip("vllm_harness")

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from engine_common import compat  # noqa: E402
from engine_cuda.scheduler import TiergateScheduler  # noqa: E402
from priority.profiles import load_profile  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

H = vllm_harness
PROFILE = load_profile("h100-llama3.1-8b")
T0 = 1000.0
LENGTH_AWARE = ("gmax", "gmax-fair", "tempo")


def build(
    model_dir: Path,
    policy: str | None,
    monkeypatch: pytest.MonkeyPatch,
    clock: Any,
    **config: Any,
) -> Any:
    """Ours running ``policy``, or stock vLLM's FCFS scheduler (``policy`` None)."""
    if policy is None:
        return H.make_scheduler(Scheduler, H.make_config(model_dir, **config))
    monkeypatch.setenv("TIERGATE_POLICY", policy)
    scheduler = H.make_scheduler(TiergateScheduler, H.make_config(model_dir, **config))
    scheduler.tiergate.clock = clock
    return scheduler


def step(scheduler: Any, clock: Any) -> Any:
    output = scheduler.schedule()
    if output.total_num_scheduled_tokens:
        clock.t += H.step_time(PROFILE.coefficients, scheduler, output)
    scheduler.update_from_output(output, H.model_output(scheduler, output))
    return output


def deadline(ms: float, **more: Any) -> dict[str, Any]:
    """A deadline request's keys, as the gateway writes them for ``x-slo-deadline-ms``."""
    return {"tiergate_kind": "deadline", "tiergate_deadline_ms": ms, **more}


def first_admitted(scheduler: Any, clock: Any) -> dict[str, int]:
    output = step(scheduler, clock)
    return dict(output.num_scheduled_tokens)


def finish_times(scheduler: Any, clock: Any, max_steps: int = 5000) -> dict[str, float]:
    """Run to completion; when each request produced its last token (virtual time)."""
    done: dict[str, float] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return done
        output = scheduler.schedule()
        clock.t += H.step_time(PROFILE.coefficients, scheduler, output)
        runner_output = H.model_output(scheduler, output)
        for engine_outputs in scheduler.update_from_output(output, runner_output).values():
            for o in engine_outputs.outputs:
                if o.finish_reason is not None:
                    done[o.request_id] = clock.t
    raise AssertionError(f"not finished in {max_steps} steps")


def hopeless_gauge(scheduler: Any) -> float | None:
    """``tiergate:hopeless_requests`` as the stat-logger plugin exports it after this step."""
    from prometheus_client import CollectorRegistry

    from engine_cuda.metrics import TiergateStatLogger

    registry = CollectorRegistry()
    TiergateStatLogger(scheduler.vllm_config, 0, registry=registry).record(
        scheduler.make_stats(), None, engine_idx=0
    )
    value: float | None = registry.get_sample_value("tiergate:hopeless_requests", {"engine": "0"})
    return value


# ---- worked examples ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [None, "gmax"])
def test_gmax_serves_the_deadline_that_can_still_be_met_first(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str | None
) -> None:
    """One seat, two deadline requests of 400-token prompts, "doomed" queued first.

    "doomed" (50 tokens to generate, due in 20 ms) cannot finish in time: its prefill alone takes
    about 13 ms on the profile and each of its 50 decode steps about 7 ms. "fine" (200 tokens,
    due in 60 s) can. Stock vLLM serves the queue in order; GMAX's eligibility rule admits "fine"
    — although "doomed" is shorter and more urgent, so its priority alone would put it first —
    meets its deadline, and serves "doomed" afterwards: demoted, not dropped, nothing lost.
    While "doomed" waits, the plan reports it hopeless and the stat logger exports the count.
    """
    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, policy, monkeypatch, clock, max_num_seqs=1, num_blocks=512)
    scheduler.add_request(
        H.make_request("doomed", 400, 50, arrival_time=T0, extra_args=deadline(20))
    )
    scheduler.add_request(
        H.make_request("fine", 400, 200, arrival_time=T0, extra_args=deadline(60_000))
    )
    first = "doomed" if policy is None else "fine"
    assert first_admitted(scheduler, clock) == {first: 400}
    if policy is not None:  # the operator sees it: tiergate:hopeless_requests
        assert hopeless_gauge(scheduler) == 1
    done = finish_times(scheduler, clock)
    assert set(done) == {"doomed", "fine"}  # demoted, never dropped
    if policy is not None:
        assert done["fine"] < done["doomed"]
        assert done["fine"] - T0 <= 60.0
        assert scheduler.tiergate.state.plan_deviations == 0
    assert scheduler.get_request_counts() == (0, 0)


@pytest.mark.parametrize("policy", [None, "gmax"])
def test_the_length_distribution_from_vllm_xargs_decides_gmaxs_order(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str | None
) -> None:
    """Two deadline requests alike to vLLM (same prompt, ``max_tokens`` 1,000, 30 s), one seat.

    The second carries the gateway's length prediction (``tiergate_length``: median 10, 95th
    percentile 40 tokens), sent through vLLM's own OpenAI request object. GMAX's priority is
    goodput per unit of generation time: about 10 decode steps against 1,000, so it admits the
    second first; stock vLLM, which cannot read the key, serves arrival order. The view GMAX
    plans on carries what the gateway sent: kind, workflow, stage, sub-deadline, distribution.
    """
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1000,
        "vllm_xargs": {
            "tiergate_kind": "compound",
            "tiergate_workflow_id": "wf-7",
            "tiergate_stage": 2,
            "tiergate_deadline_ms": 40_000,
            "tiergate_sub_deadline_ms": 30_000,
            "tiergate_length": [0.5, 10, 0.95, 40],
            "tiergate_tenant": "acme",
        },
    }
    request = ChatCompletionRequest.model_validate(body)
    params = request.to_sampling_params(1000, {})
    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, policy, monkeypatch, clock, max_num_seqs=1, num_blocks=512)
    scheduler.add_request(
        H.make_request("unknown", 100, 1000, arrival_time=T0, extra_args=deadline(30_000))
    )
    scheduler.add_request(
        H.make_request("predicted", 100, 1000, arrival_time=T0, sampling_params=params)
    )
    first = "unknown" if policy is None else "predicted"
    assert first_admitted(scheduler, clock) == {first: 100}
    if policy is not None:
        view = scheduler.tiergate.view_of("predicted")
        assert view is not None
        assert (view.kind, view.workflow_id, view.stage, view.tenant) == (
            "compound",
            "wf-7",
            2,
            "acme",
        )
        assert view.slo.deadline_s == 30.0  # the call's share, not the workflow's deadline
        assert view.length is not None and view.length.max_tokens == 1000
        assert view.length_bound(0.5) == 10 and view.length_bound(0.95) == 40
        assert scheduler.tiergate.view_of("unknown").kind == "deadline"
    done = finish_times(scheduler, clock)
    assert set(done) == {"unknown", "predicted"}


@pytest.mark.parametrize("policy", [None, "tempo"])
def test_tempo_density_admits_the_short_request_first(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str | None
) -> None:
    """One seat; "long" (250 tokens to generate, a lax 1,000 s deadline) is queued before
    "short" (5 tokens, due in 100 s). Tempo's service-gain density (tokens of goodput per second
    of generation) is about 30 / 0.05 s for "short" against 520 / 1.8 s for "long": "short"
    goes first. Stock vLLM serves arrival order."""
    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, policy, monkeypatch, clock, max_num_seqs=1, num_blocks=512)
    scheduler.add_request(
        H.make_request("long", 20, 250, arrival_time=T0, extra_args=deadline(1_000_000))
    )
    scheduler.add_request(
        H.make_request("short", 20, 5, arrival_time=T0, extra_args=deadline(100_000))
    )
    first = "long" if policy is None else "short"
    assert first_admitted(scheduler, clock) == {first: 20}
    done = finish_times(scheduler, clock)
    assert set(done) == {"long", "short"}


@pytest.mark.parametrize("policy", ["gmax", "gmax-fair"])
def test_gmax_fair_preempts_for_the_tenant_it_has_served_less(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """One seat. Tenant a's request (300 tokens) runs alone; tenant b's (2,000 tokens, so its
    goodput per generation time is lower) arrives one step later. b's virtual-time counter
    starts at a's (VTC's lift) and stays there while a's grows with every decode, so at the next
    frame boundary (50 executed steps) pure VTC (``fairness`` 1) preempts a for b; plain GMAX
    lets a finish first (b's priority is far below a's). Nothing is lost either way."""
    params = (
        '{"frame_steps": 50, "fairness": 1.0}' if policy == "gmax-fair" else '{"frame_steps": 50}'
    )
    monkeypatch.setenv("TIERGATE_POLICY_PARAMS", params)
    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, policy, monkeypatch, clock, max_num_seqs=1, num_blocks=512)
    arrivals = [
        H.Arrival(T0, "a", 20, 300, deadline(600_000, tiergate_tenant="a")),
        H.Arrival(T0 + 0.001, "b", 20, 2000, deadline(600_000, tiergate_tenant="b")),
    ]
    trace = H.run_trace(scheduler, arrivals, PROFILE.coefficients, clock)
    assert {k: len(v) for k, v in trace.token_times.items()} == {"a": 300, "b": 2000}
    a_done = max(trace.token_times["a"])
    b_start = min(trace.token_times["b"])
    preempted = set().union(*trace.preempted)
    if policy == "gmax-fair":
        assert b_start < a_done and "a" in preempted
        first = next(k for k, p in enumerate(trace.preempted) if "a" in p)
        assert first == 50  # the first frame boundary after the one that admitted a
    else:
        assert a_done < b_start and not preempted


# ---- drop-in guarantees, every length-aware policy ----------------------------------------------

KINDS: tuple[dict[str, Any], ...] = (
    {"tiergate_kind": "latency", "tiergate_ttft_ms": 300, "tiergate_tpot_ms": 40},
    deadline(4000),
    {
        "tiergate_kind": "compound",
        "tiergate_workflow_id": "wf",
        "tiergate_stage": 1,
        "tiergate_deadline_ms": 8000,
        "tiergate_sub_deadline_ms": 3000,
        "tiergate_length": [0.5, 20, 0.95, 60],
    },
    {"tiergate_kind": "best-effort"},
)


@pytest.mark.parametrize("policy", LENGTH_AWARE)
def test_limits_hold_and_nothing_is_lost_under_kv_pressure(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """Every kind, two tenants, a KV pool too small for everyone: the token budget, the seats
    and the KV pool hold every step, preempted requests are recomputed, every request produces
    exactly its tokens and the engine ends empty."""
    clock = H.FakeClock(T0)
    scheduler = build(
        tiny_model_dir,
        policy,
        monkeypatch,
        clock,
        num_blocks=24,
        max_num_seqs=4,
        max_num_batched_tokens=256,
    )
    arrivals = [
        H.Arrival(
            T0 + 0.01 * i,
            f"r{i}",
            60 + 13 * i,
            40 + 7 * i,
            {**KINDS[i % len(KINDS)], "tiergate_tenant": "ab"[i % 2]},
        )
        for i in range(10)
    ]

    def limits_hold(s: Any, output: Any) -> None:
        assert output.total_num_scheduled_tokens <= 256
        assert len(s.running) <= 4
        assert compat.num_free_blocks(s) >= 0
        for request in s.running:
            held = compat.num_kv_blocks(s, request.request_id)
            assert held * s.block_size >= request.num_computed_tokens

    trace = H.run_trace(scheduler, arrivals, PROFILE.coefficients, clock, on_step=limits_hold)
    for a in arrivals:
        assert len(trace.token_times[a.request_id]) == a.max_tokens
    preempted = set().union(*trace.preempted)
    for request_id in preempted:  # each was recomputed: scheduled again after its preemption
        when = next(k for k, p in enumerate(trace.preempted) if request_id in p)
        assert any(request_id in b for b in trace.batches[when + 1 :])
    assert scheduler.get_request_counts() == (0, 0)
    assert compat.kv_cache_usage(scheduler) == 0.0
    assert scheduler.tiergate.state.steps > 0


@pytest.mark.parametrize("policy", LENGTH_AWARE)
def test_async_scheduling_outputs_stay_exact(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """Overlapped steps (the next scheduled before the previous returns): vLLM's request counts
    match its queues every step and every request streams exactly its tokens."""
    clock = H.FakeClock(T0)
    scheduler = build(
        tiny_model_dir,
        policy,
        monkeypatch,
        clock,
        async_scheduling=True,
        max_num_seqs=3,
        max_num_batched_tokens=128,
    )
    for i in range(6):
        scheduler.add_request(
            H.make_request(f"r{i}", 40 + 30 * i, 6, arrival_time=T0, extra_args=KINDS[i % 4])
        )
    in_flight: list[Any] = []
    produced: dict[str, int] = {}
    for _ in range(300):
        if not scheduler.has_unfinished_requests() and not in_flight:
            break
        output = scheduler.schedule()
        stats = scheduler.make_stats()
        assert (stats.num_running_reqs, stats.num_waiting_reqs) == scheduler.get_request_counts()
        in_flight.append((output, H.model_output(scheduler, output)))
        if len(in_flight) == 2 or not scheduler.has_unfinished_requests():
            done, runner_output = in_flight.pop(0)
            clock.t += 0.01
            for outputs in scheduler.update_from_output(done, runner_output).values():
                for o in outputs.outputs:
                    produced[o.request_id] = produced.get(o.request_id, 0) + len(o.new_token_ids)
    assert produced == {f"r{i}": 6 for i in range(6)}
    assert scheduler.get_request_counts() == (0, 0)
