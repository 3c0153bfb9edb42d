"""Replays on a virtual clock, simulator side (imports nothing from vLLM).

A replay is a list of :class:`Arrival` (what a client sends vLLM: lengths, SLO metadata as
``vllm_xargs``, a ``priority``) run to completion, every step lasting the profile's prediction
(beta = 1, no noise) for the batch that ran. :mod:`engine_common.replay` runs the same arrivals
through the real vLLM scheduler; both return a :class:`Replay`, so the two can be compared
request by request and step by step (``bench/sim_fidelity.py``, ``tests/engines/``).

The simulator side reads each request's SLO, weight, tier and tenant from the arrival's extra
args exactly as the plugin parses them (milliseconds / 1e3), so both sides plan with bit-identical
inputs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_common.protocol import (
    DEADLINE_MS,
    TENANT,
    TIER,
    TPOT_MS,
    TTFT_MS,
    WEIGHT,
    priority_from_weight,
)
from priority.gain import GainWeights, ideal_tdg, tdg
from priority.policies import make_policy
from priority.profiles import EngineConfig, Profile
from priority.request import SLO, Request
from priority.sim.engine import EngineCore
from priority.sim.rules import DEFAULT_ENGINE_RULES, EngineRules
from priority.sim.workload import Workload

BLOCK_SIZE = 16
TOKEN_BUDGET = 8192
MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class Arrival:
    """One request as a client sends it to vLLM (``ignore_eos``: it produces ``max_tokens``)."""

    time: float
    request_id: str
    prompt_tokens: int
    max_tokens: int
    extra_args: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    """vLLM's ``priority`` (lower first), consistent with the weight: ``2 ** -priority``."""


@dataclass
class Replay:
    """What a replay produced, in the same shape on both sides."""

    token_times: dict[str, list[float]] = field(default_factory=dict)
    batches: list[dict[str, int]] = field(default_factory=list)
    """Per step: request id -> tokens computed, in the engine's batch order."""
    preempted: list[set[str]] = field(default_factory=list)
    """Per step: requests preempted in it."""
    decision_s: list[float] = field(default_factory=list)
    """Per step: wall-clock seconds of the scheduling decision (vLLM: ``schedule()``)."""

    @property
    def preemptions(self) -> int:
        return sum(len(p) for p in self.preempted)


def priority_of(weight: float) -> int:
    """vLLM's ``priority`` for a tier weight, as the gateway sends it."""
    return priority_from_weight(weight)


def arrivals_from_workload(workload: Workload) -> list[Arrival]:
    """The workload's requests as vLLM would receive them, SLOs in ``vllm_xargs``."""
    arrivals = []
    for spec in workload.specs:
        xargs: dict[str, Any] = {WEIGHT: spec.weight, TIER: spec.tier, TENANT: spec.tenant}
        if spec.slo.ttft_s is not None and spec.slo.tpot_s is not None:
            xargs[TTFT_MS] = spec.slo.ttft_s * 1e3
            xargs[TPOT_MS] = spec.slo.tpot_s * 1e3
        if spec.slo.deadline_s is not None:
            xargs[DEADLINE_MS] = spec.slo.deadline_s * 1e3
        arrivals.append(
            Arrival(
                time=spec.arrival_s,
                request_id=spec.request_id,
                prompt_tokens=spec.prompt_tokens,
                max_tokens=spec.output_tokens,
                extra_args=xargs,
                priority=priority_of(spec.weight),
            )
        )
    return arrivals


def slo_of(arrival: Arrival) -> SLO:
    """The SLO the plugin parses from the arrival's extra args."""
    args = arrival.extra_args

    def seconds(key: str) -> float | None:
        value = args.get(key)
        return None if value is None else float(value) / 1e3

    return SLO(ttft_s=seconds(TTFT_MS), tpot_s=seconds(TPOT_MS), deadline_s=seconds(DEADLINE_MS))


def request_of(arrival: Arrival) -> Request:
    """The simulator's request for an arrival, with the metadata the plugin would read."""
    args = arrival.extra_args
    return Request(
        request_id=arrival.request_id,
        arrival_s=arrival.time,
        prompt_tokens=max(1, arrival.prompt_tokens),
        slo=slo_of(arrival),
        weight=float(args.get(WEIGHT, 2.0**-arrival.priority)),
        tier=str(args.get(TIER, "default")),
        tenant=str(args.get(TENANT, "default")),
        max_output_tokens=arrival.max_tokens,
    )


def engine_profile(
    profile: Profile,
    num_blocks: int,
    *,
    block_size: int = BLOCK_SIZE,
    token_budget: int = TOKEN_BUDGET,
    max_num_seqs: int = MAX_NUM_SEQS,
) -> Profile:
    """``profile`` on the engine a vLLM replay builds: ``num_blocks`` in vLLM's pool, one of
    which vLLM keeps as its null block, so the simulator gets ``num_blocks - 1``."""
    engine = EngineConfig(
        block_size=block_size,
        num_kv_blocks=num_blocks - 1,
        max_num_batched_tokens=token_budget,
        max_num_seqs=max_num_seqs,
    )
    return dataclasses.replace(profile, engine=engine)


def replay_simulator(
    arrivals: Iterable[Arrival],
    profile: Profile,
    policy: str,
    *,
    num_blocks: int,
    params: Mapping[str, Any] | None = None,
    block_size: int = BLOCK_SIZE,
    token_budget: int = TOKEN_BUDGET,
    max_num_seqs: int = MAX_NUM_SEQS,
    rules: EngineRules = DEFAULT_ENGINE_RULES,
) -> Replay:
    """Run ``arrivals`` through :class:`EngineCore` step by step (no fast-forward)."""
    engine = engine_profile(
        profile,
        num_blocks,
        block_size=block_size,
        token_budget=token_budget,
        max_num_seqs=max_num_seqs,
    )
    core = EngineCore(
        engine,
        make_policy(policy, engine.estimator(), **dict(params or {})),
        fast_forward=False,
        rules=rules,
    )
    requests = [request_of(a) for a in sorted(arrivals, key=lambda a: a.time)]
    replay = Replay()
    now = requests[0].arrival_s if requests else 0.0
    i = 0
    while True:
        while i < len(requests) and requests[i].arrival_s <= now:
            if not core.add_request(requests[i], now):
                raise ValueError(f"{requests[i].request_id} can never fit {num_blocks} blocks")
            i += 1
        started = time.perf_counter()
        step = core.start_step(now) if core.has_work else None
        decided = time.perf_counter() - started
        if step is None:
            if i == len(requests):
                break
            now = requests[i].arrival_s
            continue
        replay.decision_s.append(decided)
        replay.batches.append({r.request_id: tokens for r, tokens in step.plan.scheduled})
        replay.preempted.append({r.request_id for r in step.plan.preempted})
        core.finish_step(step)
        now = step.end_s
    replay.token_times = {r.request_id: list(r.token_times) for r in requests}
    return replay


# ---- comparing two replays ------------------------------------------------------------------


def tdg_ratio(replay: Replay, arrivals: Sequence[Arrival], weights: GainWeights) -> float:
    """PROSERVE's TDG ratio of the replayed requests (gain / gain if every token were on time)."""
    gain = ideal = 0.0
    for a in arrivals:
        weight = float(a.extra_args.get(WEIGHT, 2.0**-a.priority))
        times = replay.token_times.get(a.request_id, [])
        gain += tdg(a.time, slo_of(a), weight, times, weights)
        ideal += ideal_tdg(weight, a.max_tokens, weights)
    return gain / ideal if ideal > 0 else math.nan


def identical_share(
    real: Replay, sim: Replay, arrivals: Sequence[Arrival], *, atol: float = 1e-9
) -> float:
    """Share of requests whose every token time agrees within ``atol`` seconds."""
    same = 0
    for a in arrivals:
        x = real.token_times.get(a.request_id, [])
        y = sim.token_times.get(a.request_id, [])
        if len(x) == len(y) and np.allclose(x, y, rtol=0.0, atol=atol):
            same += 1
    return same / len(arrivals) if arrivals else math.nan


def ttft_abs_p99_s(real: Replay, sim: Replay, arrivals: Sequence[Arrival]) -> float:
    """p99 of |TTFT real - TTFT simulated| over requests with a first token on both sides."""
    gaps = [
        abs(real.token_times[a.request_id][0] - sim.token_times[a.request_id][0])
        for a in arrivals
        if real.token_times.get(a.request_id) and sim.token_times.get(a.request_id)
    ]
    return float(np.percentile(gaps, 99)) if gaps else math.nan


def first_divergence(real: Replay, sim: Replay) -> int | None:
    """Index of the first step whose batch differs between the two replays (None: none)."""
    for k, (x, y) in enumerate(zip(real.batches, sim.batches, strict=False)):
        if x != y:
            return k
    if len(real.batches) != len(sim.batches):
        return min(len(real.batches), len(sim.batches))
    return None
