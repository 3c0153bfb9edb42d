"""``vllm-v1`` / ``vllm-v1-priority`` are stock vLLM: the same decisions, step by step.

The bundled Azure trace's head is replayed on a virtual clock through stock vLLM's scheduler
(``--scheduling-policy fcfs`` / ``priority``) and through ``TiergateScheduler`` running the
transcription, with a KV pool that never binds and one that binds (preemptions, refused
admissions); every step must schedule the same requests with the same tokens and preempt the
same ones, and the simulator with the same policy must produce every token at the same time.
Run in each supported vLLM version (0.23 with ``version="0.23"``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")
replay = pytest.importorskip("engine_harness.replay")

import vllm  # noqa: E402
from replay_cases import KV_POOLS, PROFILE, arrivals, vllm_params  # noqa: E402

from engine_harness.sim_replay import Replay, first_divergence, replay_simulator  # noqa: E402
from priority.profiles import load_profile  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

VERSION = str(vllm.__version__)
MODES = {"vllm-v1": "fcfs", "vllm-v1-priority": "priority"}
COEFFICIENTS = load_profile(PROFILE).coefficients


_STOCK: dict[tuple[str, str], Replay] = {}


def stock_replay(policy: str, pool: str, model_dir: Path) -> Replay:
    """Stock vLLM's replay of the case (once per session: both tests compare with it)."""
    key = (policy, pool)
    if key not in _STOCK:
        _STOCK[key] = replay.replay_vllm(
            arrivals(),
            model_dir,
            COEFFICIENTS,
            num_blocks=KV_POOLS[pool],
            stock_policy=MODES[policy],
        )
    return _STOCK[key]


def assert_same_steps(ours: Replay, theirs: Replay, what: str) -> None:
    k = first_divergence(ours, theirs)
    assert k is None, (
        f"{what}: step {k} differs: {ours.batches[k] if k < len(ours.batches) else None} "
        f"(preempted {ours.preempted[k] if k < len(ours.preempted) else None}) vs "
        f"{theirs.batches[k] if k < len(theirs.batches) else None} "
        f"(preempted {theirs.preempted[k] if k < len(theirs.preempted) else None})"
    )
    assert ours.preempted == theirs.preempted, f"{what}: preemptions differ"


@pytest.mark.parametrize("pool", list(KV_POOLS))
@pytest.mark.parametrize("policy", list(MODES))
def test_transcription_is_stock_vllm(policy: str, pool: str, tiny_model_dir: Path) -> None:
    blocks = KV_POOLS[pool]
    cases = arrivals()
    stock = stock_replay(policy, pool, tiny_model_dir)
    drivers = []
    ours = replay.replay_vllm(
        cases,
        tiny_model_dir,
        COEFFICIENTS,
        num_blocks=blocks,
        policy=policy,
        params=vllm_params(policy, VERSION),
        profile=PROFILE,
        on_step=lambda scheduler, _output: drivers.append(scheduler.tiergate),
    )
    assert_same_steps(ours, stock, f"{policy} vs stock vLLM {VERSION} ({pool} KV)")
    assert ours.token_times == stock.token_times  # the same steps on the same clock: bit-equal
    assert all(len(ours.token_times[a.request_id]) == a.max_tokens for a in cases)
    driver = drivers[-1]
    assert driver.state.plan_deviations == 0 and driver.replans == 0
    if pool == "tight":
        assert stock.preemptions > 0, "the tight pool must make vLLM preempt"
    else:
        assert stock.preemptions == 0


@pytest.mark.parametrize("pool", list(KV_POOLS))
@pytest.mark.parametrize("policy", list(MODES))
def test_simulator_is_stock_vllm(policy: str, pool: str, tiny_model_dir: Path) -> None:
    blocks = KV_POOLS[pool]
    cases = arrivals()
    stock = stock_replay(policy, pool, tiny_model_dir)
    sim = replay_simulator(
        cases,
        load_profile(PROFILE),
        policy,
        num_blocks=blocks,
        params=vllm_params(policy, VERSION),
    )
    assert_same_steps(sim, stock, f"simulated {policy} vs stock vLLM {VERSION} ({pool} KV)")
    for a in cases:
        np.testing.assert_allclose(
            sim.token_times[a.request_id], stock.token_times[a.request_id], rtol=0, atol=1e-9
        )
