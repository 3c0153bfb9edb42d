"""Our policies inside the REAL vLLM scheduler, driven step by step on the CPU.

Run by ``.ci/engines.sh`` in one virtual environment per supported vLLM version; skipped where
vLLM is not installed (the main environment).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
vllm_harness = pytest.importorskip("vllm_harness")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from engine_ascend.scheduler import TiergateScheduler as AscendTiergateScheduler  # noqa: E402
from engine_common import compat  # noqa: E402
from engine_common.settings import SettingsError  # noqa: E402
from engine_cuda.scheduler import TiergateScheduler  # noqa: E402
from priority.policies.base import EngineLimits, SchedulerInput, cdiv  # noqa: E402
from priority.policies.slide import SlideBatchingPolicy  # noqa: E402
from priority.profiles import load_profile  # noqa: E402
from priority.request import SLO, Request  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

H = vllm_harness
PROFILE = load_profile("h100-llama3.1-8b")
T0 = 1000.0


def build(
    model_dir: Path, clock: Any = None, factory: Any = TiergateScheduler, **config: Any
) -> Any:
    scheduler = H.make_scheduler(factory, H.make_config(model_dir, **config))
    if clock is not None:
        scheduler.tiergate.clock = clock
    return scheduler


def slo_args(ttft_ms: float, tpot_ms: float, **more: Any) -> dict[str, Any]:
    return {"tiergate_ttft_ms": ttft_ms, "tiergate_tpot_ms": tpot_ms, **more}


def step(scheduler: Any, clock: Any) -> Any:
    output = scheduler.schedule()
    if output.total_num_scheduled_tokens:
        clock.t += H.step_time(PROFILE.coefficients, scheduler, output)
    scheduler.update_from_output(output, H.model_output(scheduler, output))
    return output


# ---- construction ---------------------------------------------------------------------------


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_base_class_follows_async_scheduling(tiny_model_dir: Path, async_scheduling: bool) -> None:
    scheduler = build(tiny_model_dir, async_scheduling=async_scheduling)
    assert isinstance(scheduler, Scheduler)
    assert isinstance(scheduler, AsyncScheduler) == async_scheduling
    assert scheduler.tiergate.settings.policy == "slide"


def test_base_class_resolved_at_construction(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A platform plugin (vllm-ascend) may rebind vLLM's Scheduler after we are imported."""
    import vllm.v1.core.sched.scheduler as module

    class PatchedScheduler(module.Scheduler):  # type: ignore[misc]
        patched = True

    monkeypatch.setattr(module, "Scheduler", PatchedScheduler)
    monkeypatch.delenv("TIERGATE_PROFILE")
    scheduler = build(tiny_model_dir, factory=AscendTiergateScheduler)
    assert isinstance(scheduler, PatchedScheduler)
    assert scheduler.tiergate.settings.profile.name == load_profile("910b-qwen2-7b").name


def test_ascend_defaults_to_910b_profile(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIERGATE_PROFILE")
    ascend = build(tiny_model_dir, factory=AscendTiergateScheduler).tiergate.settings.profile
    cuda = build(tiny_model_dir).tiergate.settings.profile
    assert "910" in ascend.name and ascend.name != cuda.name


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TIERGATE_POLICY", "nope", "known: vllm-v1"),
        ("TIERGATE_PROFILE", "no-such-gpu", "shipped profiles"),
        ("TIERGATE_POLICY_PARAMS", '{"gama": 1}', "POLICY_PARAMS"),
    ],
)
def test_unknown_names_fail_clearly(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=message):
        build(tiny_model_dir)


# ---- the worked example: SlideBatching decides order, chunk and budget ---------------------------


def test_batch_follows_slidebatching_worked_example(tiny_model_dir: Path) -> None:
    """Two tight-TPOT streams decode while a long, loose prompt waits.

    SlideBatching's budget is ``max(t_min, 0.65 x 10 ms)``, t_min being the streams' time to
    their next token's deadline; the decodes take their share after t_c and the prompt gets the
    largest chunk that fits the rest (GETMAXCHUNK) — far less than the 2048-token budget vLLM
    alone would hand it. The executed batch must be exactly the plan an
    independent SlideBatching instance makes from the same state.
    """
    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, clock, max_num_batched_tokens=2048, num_blocks=512)
    for name in ("a", "b"):
        scheduler.add_request(
            H.make_request(name, 32, 40, arrival_time=T0, extra_args=slo_args(10, 10))
        )
    step(scheduler, clock)  # both prompts
    step(scheduler, clock)  # first decode
    scheduler.add_request(
        H.make_request("c", 2000, 10, arrival_time=clock.t, extra_args=slo_args(10_000, 100))
    )

    def mirror(request_id: str, ttft_s: float, tpot_s: float) -> Request:
        r = scheduler.requests[request_id]
        view = Request(
            request_id,
            r.arrival_time,
            r.num_prompt_tokens,
            SLO(ttft_s, tpot_s),
            max_output_tokens=r.max_tokens,
        )
        view.num_output_tokens = r.num_output_tokens
        view.num_computed_tokens = r.num_computed_tokens
        view.num_kv_blocks = cdiv(r.num_computed_tokens, 16) if r.num_computed_tokens else 0
        return view

    expected = SlideBatchingPolicy(PROFILE.estimator()).schedule(
        SchedulerInput(
            now=clock.t,
            running=[mirror("a", 0.01, 0.01), mirror("b", 0.01, 0.01)],
            waiting=[mirror("c", 10.0, 0.1)],
            limits=EngineLimits(2048, 8, 16, compat.num_free_blocks(scheduler)),
        )
    )
    planned = {r.request_id: tokens for r, tokens in expected.scheduled}
    assert planned["a"] == planned["b"] == 1
    assert 50 <= planned["c"] < 2000 - 2  # a latency-budget chunk, not the token budget's

    output = scheduler.schedule()
    assert dict(output.num_scheduled_tokens) == planned
    assert output.total_num_scheduled_tokens == expected.num_tokens
    # vLLM runs RUNNING before WAITING; within each, the plan's order
    order = list(output.num_scheduled_tokens)
    plan_order = [r.request_id for r, _ in expected.scheduled]
    assert [i for i in order if i != "c"] == [i for i in plan_order if i != "c"]
    est = PROFILE.estimator()
    batch_s = est.batch_time(prefill=[(planned["c"], 0)], decode_kv=[33, 33])
    assert expected.time_budget_s is not None and batch_s <= expected.time_budget_s + 1e-12
    assert scheduler.tiergate.state.latency_budget_s == pytest.approx(expected.time_budget_s)


# ---- limits, preemption, metadata -------------------------------------------------------------


def _limits_hold(max_tokens: int, max_seqs: int) -> Any:
    def check(scheduler: Any, output: Any) -> None:
        assert output.total_num_scheduled_tokens <= max_tokens
        assert len(scheduler.running) <= max_seqs
        assert compat.num_free_blocks(scheduler) >= 0
        for request in scheduler.running:  # every running request's KV covers its tokens
            held = compat.num_kv_blocks(scheduler, request.request_id)
            assert held * scheduler.block_size >= request.num_computed_tokens

    return check


def test_budgets_kv_limits_and_preemption_hold(tiny_model_dir: Path) -> None:
    """A KV pool too small for everyone: the policy preempts, requests resume and all finish."""
    clock = H.FakeClock(T0)
    scheduler = build(
        tiny_model_dir, clock, num_blocks=24, max_num_seqs=4, max_num_batched_tokens=256
    )
    arrivals = [
        H.Arrival(
            T0 + 0.01 * i,
            f"r{i}",
            60 + 13 * i,
            40 + 7 * i,
            slo_args(300, 30 if i % 2 else 80, tiergate_weight=2.0 if i % 2 else 1.0),
        )
        for i in range(8)
    ]
    trace = H.run_trace(
        scheduler, arrivals, PROFILE.coefficients, clock, on_step=_limits_hold(256, 4)
    )
    for a in arrivals:  # every request produced exactly its tokens
        assert len(trace.token_times[a.request_id]) == a.max_tokens
    preempted = set().union(*trace.preempted)
    assert preempted, "the KV pool was sized to force preemption"
    for request_id in preempted:  # each was recomputed later: scheduled again after preemption
        when = next(k for k, p in enumerate(trace.preempted) if request_id in p)
        assert any(request_id in b for b in trace.batches[when + 1 :])
    assert scheduler.tiergate.state.plan_deviations == 0
    assert scheduler.get_request_counts() == (0, 0)
    assert compat.kv_cache_usage(scheduler) == 0.0


def test_requests_without_slo_metadata_are_best_effort(tiny_model_dir: Path) -> None:
    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, clock)
    scheduler.add_request(H.make_request("plain", 50, 5, arrival_time=T0))
    scheduler.add_request(
        H.make_request(
            "junk", 50, 5, arrival_time=T0, extra_args={"tiergate_ttft_ms": "soon", "x": [1]}
        )
    )
    scheduler.add_request(H.make_request("vip", 50, 5, arrival_time=T0, priority=-1))
    step(scheduler, clock)
    for request_id in ("plain", "junk", "vip"):
        view = scheduler.tiergate.view_of(request_id)
        assert view is not None and view.tier == "default" and view.slo.tpot_s == 0.1
        # default TTFT: 5x the zero-load TTFT, at least 200 ms
        assert view.slo.ttft_s == max(5 * PROFILE.zero_load_ttft_s(50), 0.2)
    assert scheduler.tiergate.view_of("plain").weight == 1.0
    assert scheduler.tiergate.view_of("vip").weight == 2.0  # vLLM priority -1: served first
    while scheduler.has_unfinished_requests():
        step(scheduler, clock)


def test_vllm_xargs_reach_the_scheduler_through_openai_protocol(tiny_model_dir: Path) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "priority": -1,
        "vllm_xargs": {
            "tiergate_weight": 3.0,
            "tiergate_ttft_ms": 250,
            "tiergate_tpot_ms": 40,
            "tiergate_deadline_ms": 5000,
            "tiergate_arrival_unix_s": T0 - 0.5,
            "tiergate_tier": "gold",
            "tiergate_tenant": "acme",
        },
    }
    request = ChatCompletionRequest.model_validate(body)
    params = request.to_sampling_params(4, {})
    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, clock)
    scheduler.add_request(
        H.make_request(
            "x", 20, 4, arrival_time=T0, sampling_params=params, priority=request.priority
        )
    )
    step(scheduler, clock)
    view = scheduler.tiergate.view_of("x")
    assert view is not None
    assert (view.weight, view.tier, view.tenant, view.arrival_s) == (3.0, "gold", "acme", T0 - 0.5)
    assert view.slo == SLO(ttft_s=0.25, tpot_s=0.04, deadline_s=5.0)


# ---- asynchronous scheduling, stats, beta -----------------------------------------------------


def test_async_scheduler_runs_overlapped_steps_and_keeps_stats_exact(tiny_model_dir: Path) -> None:
    clock = H.FakeClock(T0)
    scheduler = build(
        tiny_model_dir, clock, async_scheduling=True, max_num_seqs=3, max_num_batched_tokens=128
    )
    for i in range(5):
        scheduler.add_request(
            H.make_request(f"r{i}", 40 + 30 * i, 6, arrival_time=T0, extra_args=slo_args(500, 50))
        )
    in_flight: list[Any] = []
    produced: dict[str, int] = {}
    for _ in range(200):
        if not scheduler.has_unfinished_requests() and not in_flight:
            break
        output = scheduler.schedule()  # the next step is scheduled before the previous returns
        stats = scheduler.make_stats()
        running, waiting = scheduler.get_request_counts()
        assert (stats.num_running_reqs, stats.num_waiting_reqs) == (running, waiting)
        assert running == len(scheduler.running) <= 3
        assert waiting == len(scheduler.waiting) + len(list(compat.other_waiting(scheduler)))
        in_flight.append((output, H.model_output(scheduler, output)))
        if len(in_flight) == 2 or not scheduler.has_unfinished_requests():
            done, runner_output = in_flight.pop(0)
            clock.t += 0.01
            engine_outputs = scheduler.update_from_output(done, runner_output)
            for outputs in engine_outputs.values():
                for o in outputs.outputs:
                    produced[o.request_id] = produced.get(o.request_id, 0) + len(o.new_token_ids)
    assert produced == {f"r{i}": 6 for i in range(5)}
    assert scheduler.get_request_counts() == (0, 0)


def test_policy_state_reaches_the_stat_logger(tiny_model_dir: Path) -> None:
    from prometheus_client import CollectorRegistry

    from engine_cuda.metrics import TiergateStatLogger

    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, clock)
    for i in range(3):
        scheduler.add_request(
            H.make_request(f"r{i}", 64, 8, arrival_time=T0, extra_args=slo_args(100, 20))
        )
    step(scheduler, clock)
    step(scheduler, clock)
    stats = scheduler.make_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == scheduler.get_request_counts()
    registry = CollectorRegistry()
    stat_logger = TiergateStatLogger(scheduler.vllm_config, 0, registry=registry)
    stat_logger.record(stats, None, engine_idx=0)
    assert stats.running_lora_adapters == {}  # our entries are gone before vLLM's loggers run
    state = scheduler.tiergate.state
    assert stat_logger.last_state is not None
    assert stat_logger.last_state.num_urgent == state.num_urgent
    assert stat_logger.last_state.num_urgent + stat_logger.last_state.num_normal == 3

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"engine": "0"})

    assert value("tiergate:latency_budget_seconds") == pytest.approx(
        state.latency_budget_s, abs=1e-6
    )
    assert value("tiergate:estimator_beta") == pytest.approx(state.beta, abs=1e-6)
    assert value("tiergate:urgent_requests") == state.num_urgent
    assert value("tiergate:policy_steps") == 2


def test_beta_learns_from_real_step_times(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps that take twice the profile's time: beta moves from 1 towards 2 (refits off)."""
    monkeypatch.setenv("TIERGATE_REFIT_EVERY", "0")
    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, clock, max_num_seqs=16)
    for i in range(12):
        scheduler.add_request(
            H.make_request(f"r{i}", 30, 120, arrival_time=T0, extra_args=slo_args(1000, 200))
        )
    betas = []
    for _ in range(100):
        output = scheduler.schedule()
        clock.t += 2.0 * H.step_time(PROFILE.coefficients, scheduler, output)
        scheduler.update_from_output(output, H.model_output(scheduler, output))
        betas.append(scheduler.tiergate.policy.estimator.beta)
    window = scheduler.tiergate.policy.estimator.window
    assert betas[window - 2] == 1.0  # no update before a full window
    # after k windows: beta = 2 - 0.8**k exactly (theta 0.8, every ratio 2)
    k = 100 // window
    assert betas[-1] == pytest.approx(2 - 0.8**k, rel=1e-9)
    assert all(b2 >= b1 for b1, b2 in itertools.pairwise(betas))
    assert not math.isclose(betas[-1], 1.0)


def test_the_coefficients_are_refitted_from_real_step_times(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An engine whose decode steps cost 3x the profile's and whose per-step overhead is 2x:
    after a refit the estimator predicts its real steps (beta alone cannot: the two terms are
    off by different factors), every step is in the step log, and the state the stat logger
    exports carries the refitted coefficients."""
    from dataclasses import replace

    from engine_common.state import encode, pop_state
    from priority.estimator import BatchLatencyEstimator
    from priority.profiles.steps import read_steps

    log = tmp_path / "steps.csv"
    monkeypatch.setenv("TIERGATE_REFIT_EVERY", "32")
    monkeypatch.setenv("TIERGATE_STEP_LOG", str(log))
    c = PROFILE.coefficients
    true = replace(c, a_d=3 * c.a_d, b_d=3 * c.b_d, t_c=2 * c.t_c)
    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, clock, max_num_seqs=16)
    for i in range(16):
        scheduler.add_request(
            H.make_request(
                f"r{i}", 20 + 7 * i, 200, arrival_time=T0, extra_args=slo_args(1000, 200)
            )
        )
    errors = []
    for _ in range(120):
        output = scheduler.schedule()
        real = H.step_time(true, scheduler, output)
        predicted = H.step_time(scheduler.tiergate.policy.estimator.coefficients, scheduler, output)
        errors.append(abs(predicted * scheduler.tiergate.policy.estimator.beta / real - 1))
        clock.t += real
        scheduler.update_from_output(output, H.model_output(scheduler, output))
    driver = scheduler.tiergate
    assert driver.learner.refits >= 2
    assert errors[0] > 0.3  # the profile alone
    assert max(errors[-20:]) < 0.05  # the refitted estimator (the prior pulls a little)
    driver.learner.log.close()
    assert len(list(read_steps(log))) == 120
    stats: dict[str, int] = {}
    encode(driver.current_state(), stats)
    state = pop_state(stats)
    assert state is not None and state.refits == driver.learner.refits
    fitted = BatchLatencyEstimator(driver.policy.estimator.coefficients)
    assert state.coefficients == tuple(
        getattr(fitted.coefficients, f) for f in ("a_p", "b_p", "c_p", "a_d", "b_d", "t_c", "d_p")
    )


def test_waiting_views_are_reused_and_follow_vllms_in_place_changes(tiny_model_dir: Path) -> None:
    """While vLLM's waiting queue is unchanged the adapter reuses its waiting views instead of
    re-reading every queued request each step, yet sees what vLLM changes in place: a blocked
    request whose grammar is ready, an output landing on a request that ran before."""
    from vllm.v1.request import RequestStatus

    clock = H.FakeClock(T0)
    scheduler = build(tiny_model_dir, clock, max_num_seqs=1)  # one seat: the others wait
    driver = scheduler.tiergate
    seen: list[dict[str, tuple[int, int]]] = []
    plan = driver.policy.schedule

    def spy(inp: SchedulerInput) -> Any:
        seen.append(
            {v.request_id: (v.num_uncomputed_tokens, v.num_output_tokens) for v in inp.waiting}
        )
        return plan(inp)

    driver.policy.schedule = spy
    refreshed: list[str] = []
    refresh = driver._waiting_view

    def counting(req: Any, *args: Any) -> Any:
        refreshed.append(req.request_id)
        return refresh(req, *args)

    driver._waiting_view = counting
    for i in range(3):
        scheduler.add_request(H.make_request(f"r{i}", 40, 50, arrival_time=T0))
    blocked = H.make_request("fsm", 40, 50, arrival_time=T0)
    blocked.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    scheduler.add_request(blocked)
    step(scheduler, clock)  # r0 takes the seat
    step(scheduler, clock)
    assert set(seen[-1]) == {"r1", "r2"}  # the blocked request is vLLM's business
    refreshed.clear()
    step(scheduler, clock)
    assert refreshed == []  # queue unchanged: no queued request re-read
    assert seen[-1] == seen[-2]

    # vLLM 0.33 queues a blocked request with the others (0.23 in a side queue of its own)
    queued = blocked in scheduler.waiting
    assert queued or blocked in scheduler.skipped_waiting
    blocked.status = RequestStatus.WAITING  # vLLM's grammar is ready: flipped in place
    step(scheduler, clock)
    assert set(seen[-1]) == {"r1", "r2", "fsm"} if queued else {"r1", "r2"}

    # r2 ran before (preempted); an output of a step in flight lands on it while it waits
    r2 = scheduler.requests["r2"]
    r2.num_preemptions = 1
    scheduler.waiting.version += 1  # as vLLM's prepend_request of a preempted request does
    step(scheduler, clock)
    assert seen[-1]["r2"] == (40, 0)
    r2.append_output_token_ids(H.TOKEN)
    step(scheduler, clock)
    assert seen[-1]["r2"] == (41, 1)
    while scheduler.has_unfinished_requests():
        step(scheduler, clock)
    assert not driver._views  # every view dropped once its request finished
