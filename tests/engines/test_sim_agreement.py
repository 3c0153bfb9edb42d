"""The same trace through the real vLLM scheduler and through our simulator's engine core.

Both run SlideBatching with the same profile; step times are the profile's (beta = 1, no noise)
on a virtual clock, so the two runs see identical inputs at every decision. Tolerance: the batches
(who runs, how many tokens) must be *identical* step by step, and so must the step at which each
token is produced; token times agree to 1e-9 s. The only numeric difference is the order in which
one step's per-request times are summed (the simulator adds prefill chunks in plan order, the
harness in vLLM's order: running before waiting), a few ulps per step; a decision could flip
only on an exact tie, which this trace does not produce. The KV pool is large enough that vLLM's
admission rule (whole prompt must fit), which the simulator does not model, never binds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")
vllm_harness = pytest.importorskip("vllm_harness")

from engine_cuda.scheduler import TiergateScheduler  # noqa: E402
from priority.policies.slide import SlideBatchingPolicy  # noqa: E402
from priority.profiles import EngineConfig, load_profile  # noqa: E402
from priority.request import SLO, Request  # noqa: E402
from priority.sim.engine import EngineCore  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

H = vllm_harness
T0 = 1000.0
BLOCK = 16
NUM_BLOCKS = 400  # vLLM keeps one as its null block: 399 usable on both sides
BUDGET = 512
MAX_SEQS = 6


def trace(seed: int = 3, n: int = 14) -> list[vllm_harness.Arrival]:
    rng = np.random.default_rng(seed)
    arrivals = []
    t = T0
    for i in range(n):
        t += float(rng.exponential(0.02))
        tight = i % 3 == 0
        arrivals.append(
            H.Arrival(
                time=t,
                request_id=f"r{i}",
                prompt_tokens=int(rng.integers(16, 600)),
                max_tokens=int(rng.integers(4, 40)),
                extra_args={
                    "tiergate_ttft_ms": 60.0 if tight else 400.0,
                    "tiergate_tpot_ms": 15.0 if tight else 60.0,
                    "tiergate_weight": 2.0 if tight else 1.0,
                },
            )
        )
    return arrivals


def run_simulator(arrivals: list[vllm_harness.Arrival]) -> tuple[dict[str, list[float]], list]:
    base = load_profile("h100-llama3.1-8b")
    profile = dataclasses.replace(
        base,
        engine=EngineConfig(
            block_size=BLOCK,
            num_kv_blocks=NUM_BLOCKS - 1,
            max_num_batched_tokens=BUDGET,
            max_num_seqs=MAX_SEQS,
        ),
    )
    core = EngineCore(profile, SlideBatchingPolicy(profile.estimator()), fast_forward=False)
    requests = [
        Request(
            a.request_id,
            a.time,
            a.prompt_tokens,
            SLO(a.extra_args["tiergate_ttft_ms"] / 1e3, a.extra_args["tiergate_tpot_ms"] / 1e3),
            weight=a.extra_args["tiergate_weight"],
            max_output_tokens=a.max_tokens,
        )
        for a in arrivals
    ]
    batches = []
    now, i = T0, 0
    while True:
        while i < len(requests) and requests[i].arrival_s <= now:
            core.add_request(requests[i], now)
            i += 1
        step = core.start_step(now) if core.has_work else None
        if step is None:
            if i == len(requests):
                break
            now = requests[i].arrival_s
            continue
        batches.append({r.request_id: tokens for r, tokens in step.plan.scheduled})
        core.finish_step(step)
        now = step.end_s
    return {r.request_id: r.token_times for r in requests}, batches


def test_vllm_and_simulator_agree_on_every_token(tiny_model_dir: Path) -> None:
    arrivals = trace()
    sim_times, sim_batches = run_simulator(arrivals)

    clock = H.FakeClock(T0)
    scheduler = H.make_scheduler(
        TiergateScheduler,
        H.make_config(tiny_model_dir, max_num_seqs=MAX_SEQS, max_num_batched_tokens=BUDGET,
                      block_size=BLOCK, num_blocks=NUM_BLOCKS),
    )
    scheduler.tiergate.clock = clock
    profile = load_profile("h100-llama3.1-8b")
    run = H.run_trace(scheduler, arrivals, profile.coefficients, clock)

    assert len(run.batches) == len(sim_batches)
    for k, (ours, theirs) in enumerate(zip(run.batches, sim_batches, strict=True)):
        assert ours == theirs, f"step {k}: vLLM ran {ours}, the simulator {theirs}"
    assert any(len(b) > 1 and any(t > 1 for t in b.values()) for b in run.batches)  # mixed steps
    for a in arrivals:
        assert len(run.token_times[a.request_id]) == a.max_tokens
        np.testing.assert_allclose(run.token_times[a.request_id], sim_times[a.request_id],
                                   rtol=0, atol=1e-9)
    assert scheduler.tiergate.state.plan_deviations == 0
