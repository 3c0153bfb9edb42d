"""The decode side of the simulator's PD mode: a request whose prompt KV landed joins the waiting
queue with its prompt computed, and the policy admits it as vLLM's scheduler admits a request
whose tokens a KV connector supplies (one token to compute, the whole sequence's blocks under the
engine's admission rule, in queue order); the real-scheduler side of this is
tests/engines/test_fleet_replay.py."""

from __future__ import annotations

import dataclasses

from priority.policies import make_policy
from priority.profiles import load_profile
from priority.request import SLO, Request, RequestStatus
from priority.routing import InstanceRole
from priority.sim.engine import EngineCore

BLOCK = 16


def decode_engine(num_blocks: int) -> EngineCore:
    profile = load_profile("a100-qwen2-7b")
    profile = dataclasses.replace(
        profile, engine=dataclasses.replace(profile.engine, num_kv_blocks=num_blocks)
    )
    return EngineCore(
        profile,
        make_policy("vllm-v1", profile.estimator()),
        name="decode-0",
        role=InstanceRole.DECODE,
        fast_forward=False,
    )


def handed_off(i: int, prompt: int, output: int) -> Request:
    """A request as a prefill instance hands it off: prompt computed, first token out."""
    request = Request(
        request_id=f"r{i}",
        arrival_s=0.0,
        prompt_tokens=prompt,
        slo=SLO(ttft_s=1.0, tpot_s=0.1),
        max_output_tokens=output,
        true_output_tokens=output,
    )
    request.num_computed_tokens = prompt
    request.num_output_tokens = 1
    request.token_times = [0.0]
    request.status = RequestStatus.WAITING
    return request


def test_landed_request_waits_until_its_whole_sequence_fits_then_decodes() -> None:
    engine = decode_engine(40)
    resident = handed_off(0, 20 * BLOCK, 6)
    assert engine.add_transferred(resident, 0.0)
    step = engine.start_step(0.0)
    assert step is not None and step.plan.scheduled == [(resident, 1)]
    engine.finish_step(step)
    # holds 21 blocks (321 tokens); 19 are free: the prompt (19 blocks) would fit, its whole
    # sequence (prompt + first token: 20 blocks) does not, and vLLM admits on the latter
    late = handed_off(1, 19 * BLOCK, 4)
    assert engine.add_transferred(late, step.end_s)
    now = step.end_s
    while resident.num_output_tokens < 6:
        step = engine.start_step(now)
        assert step is not None and [r for r, _ in step.plan.scheduled] == [resident]
        assert engine.waiting == [late] and late.num_kv_blocks == 0
        engine.finish_step(step)
        now = step.end_s
    assert resident.is_finished and engine.pool.free == engine.pool.num_blocks
    step = engine.start_step(now)
    assert step is not None and step.plan.scheduled == [(late, 1)]  # a decode: KV is here
    engine.finish_step(step)
    assert late.num_output_tokens == 2 and late.token_times[-1] == step.end_s
    assert engine.stats.prefill_tokens == 0 and engine.stats.transfers_in == 2


def test_landed_requests_keep_landing_order() -> None:
    """vLLM's FCFS queue holds arrivals in the order it got them: a decode instance gets its
    requests in landing order, not in the order the client sent them."""
    engine = decode_engine(4_096)
    first, second = handed_off(0, 64, 3), handed_off(1, 64, 3)
    first.arrival_s, second.arrival_s = 1.0, 0.5  # the later arrival landed first
    assert engine.add_transferred(first, 2.0) and engine.add_transferred(second, 2.0)
    assert engine.waiting == [first, second]
    step = engine.start_step(2.0)
    assert step is not None and step.plan.scheduled == [(first, 1), (second, 1)]
