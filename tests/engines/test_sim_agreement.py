"""The same trace through the real vLLM scheduler and through our simulator's engine core.

Both run the same policy with the same profile; step times are the profile's (beta = 1, no
noise) on a virtual clock, so the two runs see identical inputs at every decision. Tolerance:
the batches (who runs, how many tokens) and the preemptions must be *identical* step by step,
and so must the step at which each token is produced; token times agree to 1e-9 s. The only
numeric difference is the order in which one step's per-request times are summed (the simulator
adds prefill chunks in plan order, the harness in vLLM's order: running before waiting), a few
ulps per step; a decision could flip only on an exact tie, which these traces do not produce.

Two scenarios: a small synthetic trace on a tiny engine (mixed prefill/decode steps), and the
bundled Azure trace's head on the profile's engine with a KV pool that never binds and one that
binds (vLLM's full-sequence admission and whole-sequence resumption then decide; the simulator
follows the same rules, ``priority.sim.rules``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")
replay = pytest.importorskip("engine_harness.replay")

from replay_cases import KV_POOLS, PROFILE, arrivals  # noqa: E402

from engine_cuda.scheduler import TiergateScheduler  # noqa: E402
from engine_harness.sim_replay import Arrival, first_divergence, replay_simulator  # noqa: E402
from priority.profiles import load_profile  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

T0 = 1000.0
BLOCK = 16
NUM_BLOCKS = 400  # vLLM keeps one as its null block: 399 usable on both sides
BUDGET = 512
MAX_SEQS = 6


def trace(seed: int = 3, n: int = 14) -> list[Arrival]:
    rng = np.random.default_rng(seed)
    arrivals = []
    t = T0
    for i in range(n):
        t += float(rng.exponential(0.02))
        tight = i % 3 == 0
        arrivals.append(
            Arrival(
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


def test_vllm_and_simulator_agree_on_every_token(tiny_model_dir: Path) -> None:
    arrivals = trace()
    profile = load_profile("h100-llama3.1-8b")
    sim = replay_simulator(
        arrivals,
        profile,
        "slide",
        num_blocks=NUM_BLOCKS,
        block_size=BLOCK,
        token_budget=BUDGET,
        max_num_seqs=MAX_SEQS,
    )

    clock = replay.FakeClock(T0)
    scheduler = replay.make_scheduler(
        TiergateScheduler,
        replay.make_config(
            tiny_model_dir,
            max_num_seqs=MAX_SEQS,
            max_num_batched_tokens=BUDGET,
            block_size=BLOCK,
            num_blocks=NUM_BLOCKS,
        ),
    )
    scheduler.tiergate.clock = clock
    run = replay.run_trace(scheduler, arrivals, profile.coefficients, clock)

    assert len(run.batches) == len(sim.batches)
    for k, (ours, theirs) in enumerate(zip(run.batches, sim.batches, strict=True)):
        assert ours == theirs, f"step {k}: vLLM ran {ours}, the simulator {theirs}"
    assert any(len(b) > 1 and any(t > 1 for t in b.values()) for b in run.batches)  # mixed steps
    for a in arrivals:
        assert len(run.token_times[a.request_id]) == a.max_tokens
        np.testing.assert_allclose(
            run.token_times[a.request_id], sim.token_times[a.request_id], rtol=0, atol=1e-9
        )
    assert scheduler.tiergate.state.plan_deviations == 0


@pytest.mark.parametrize("pool", list(KV_POOLS))
@pytest.mark.parametrize("policy", ["slide", "sarathi-priority"])
def test_agreement_with_and_without_kv_pressure(
    policy: str, pool: str, tiny_model_dir: Path
) -> None:
    cases = arrivals()
    profile = load_profile(PROFILE)
    blocks = KV_POOLS[pool]
    sim = replay_simulator(cases, profile, policy, num_blocks=blocks)
    drivers = []
    real = replay.replay_vllm(
        cases,
        tiny_model_dir,
        profile.coefficients,
        num_blocks=blocks,
        policy=policy,
        profile=PROFILE,
        on_step=lambda s, _o: drivers.append(s.tiergate),
    )
    k = first_divergence(real, sim)
    assert k is None, f"step {k}: vLLM ran {real.batches[k]}, the simulator {sim.batches[k]}"
    assert real.preempted == sim.preempted
    for a in cases:
        assert len(real.token_times[a.request_id]) == a.max_tokens
        np.testing.assert_allclose(
            real.token_times[a.request_id], sim.token_times[a.request_id], rtol=0, atol=1e-9
        )
    assert drivers[-1].state.plan_deviations == 0 and drivers[-1].replans == 0
    if pool == "tight":  # the pool binds: admissions wait for whole sequences to fit
        assert max(len(b) for b in real.batches) < 256
