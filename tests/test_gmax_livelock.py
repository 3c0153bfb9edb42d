"""GMAX's preemption cycle under KV pressure (a former bug) and the simulator's livelock guard.

The bug, as found on the goodput mix at 2x load with a 2,048-block pool: each step GMAX started
one long prompt's first chunk and, to do so, preempted the prompt it had started the step before,
so no prompt ever finished. The smallest case that cycled: one stream decoding (its TPOT makes
the step budget room for one ~810-token chunk), three 1,600-token prompts that waited 20 s, a
180-block pool. The first prompt ran alone; the other two then took turns, one preemption a
step, for as long as the stream decoded.
"""

from __future__ import annotations

import dataclasses

import pytest

from priority.lengths.distribution import LengthDistribution
from priority.policies import make_policy
from priority.policies.base import SchedulingPolicy
from priority.profiles import EngineConfig, load_profile
from priority.request import SLO, Request
from priority.sim.engine import EngineCore
from priority.sim.stall import LivelockError
from tests.stuck_policy import StuckPolicy


def _engine(
    policy: str | SchedulingPolicy, blocks: int, *, max_stalled_steps: int, token_budget: int = 8192
) -> EngineCore:
    base = load_profile("a100-qwen2-7b")
    engine = EngineConfig(block_size=16, num_kv_blocks=blocks, max_num_batched_tokens=token_budget)
    profile = dataclasses.replace(base, engine=engine)
    if isinstance(policy, str):
        policy = make_policy(policy, profile.estimator())
    return EngineCore(profile, policy, fast_forward=False, max_stalled_steps=max_stalled_steps)


def _request(rid: str, prompt: int, output: int, slo: SLO, kind: str) -> Request:
    return Request(
        rid,
        0.0,
        prompt,
        slo,
        kind=kind,
        true_output_tokens=output,
        max_output_tokens=output,
        length=LengthDistribution.point(output),
    )


def _run(core: EngineCore, requests: list[Request], start: float, max_steps: int) -> dict[str, int]:
    """Step ``core`` from ``start`` (at most ``max_steps`` steps); the step at which each
    request finished (unfinished ones are missing)."""
    for request in requests:
        assert core.add_request(request, start)
    now = start
    finished: dict[str, int] = {}
    for steps in range(1, max_steps + 1):
        step = core.start_step(now)
        assert step is not None, "nothing scheduled with work queued"
        finished |= {r.request_id: steps for r in core.finish_step(step).finished}
        now = step.end_s
        if len(finished) == len(requests):
            break
    return finished


@pytest.mark.parametrize("name", ["gmax", "gmax-fair", "tempo"])
def test_long_prompts_under_kv_pressure_all_finish(name: str) -> None:
    """The cycle above: each prompt needs 2 chunks and 4 tokens, so ~20 steps serve all three
    beside the stream; the stream's 450 tokens bound the whole run. Before the fix GMAX spent
    every step from the 5th on starting one of the two prompts and preempting the other."""
    stream = _request("stream", 16, 450, SLO(ttft_s=1.0, tpot_s=0.056), "latency")
    prompts = [_request(f"p{i}", 1600, 4, SLO(deadline_s=60.0), "deadline") for i in range(3)]
    core = _engine(name, 180, max_stalled_steps=1_000)
    finished = _run(core, [stream, *prompts], start=20.0, max_steps=1_000)
    assert set(finished) == {"stream", "p0", "p1", "p2"}
    assert max(finished[p.request_id] for p in prompts) <= 40
    assert core.stats.preemptions == 0


def test_the_engine_raises_on_a_livelock_naming_policy_and_requests() -> None:
    base = load_profile("a100-qwen2-7b")
    core = _engine(StuckPolicy(base.estimator()), 64, max_stalled_steps=50)
    stuck = [_request(f"stuck-{i}", 100, 4, SLO(deadline_s=60.0), "deadline") for i in (1, 2)]
    with pytest.raises(LivelockError, match=r"'stuck'.* 50 steps.*stuck-1"):
        _run(core, stuck, start=0.0, max_steps=10_000)
    assert core.stats.steps == 50


@pytest.mark.parametrize(("limit", "stuck"), [(3, False), (2, True)])
def test_a_long_prefill_is_no_livelock(limit: int, stuck: bool) -> None:
    """A 6,000-token prompt at 2,000 tokens a step: 2 steps without a token, then tokens every
    step. The guard counts consecutive steps without a token or a finish, so it stays quiet
    with a limit of 3 and fires only with a limit of 2."""
    request = _request("long", 6000, 3, SLO(deadline_s=600.0), "deadline")
    core = _engine("vllm-v1", 512, max_stalled_steps=limit, token_budget=2000)
    if stuck:
        with pytest.raises(LivelockError, match="long"):
            _run(core, [request], start=0.0, max_steps=100)
    else:
        assert _run(core, [request], start=0.0, max_steps=100) == {"long": 5}
