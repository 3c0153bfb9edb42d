"""Length-aware baselines that read the oracle output length (simulation only).

* :class:`SjfPolicy` — shortest-job-first: vLLM's priority scheduler with the remaining output
  length as the priority. Non-preemptive: running requests are only preempted when KV runs out.
* :class:`RoundRobinSjfPolicy` — RR-SJF (Algorithm 1 of "Round-Robin Shortest Job First
  Inference Scheduling for LLMs"): the waiting queue is served longest-waiting first with the
  predicted total length as tie-break; a running request that generated ``quantum`` tokens since
  it last resumed may be preempted (recompute), longest predicted first, but only while memory
  (or a sequence slot) is what keeps the next waiting request out.

Both can use the oracle length with Gaussian noise (the RR-SJF paper's predictor stand-in:
``N(0, sigma^2)`` added per request, floored at 1, capped at the request's output cap).

RR-SJF's :meth:`~RoundRobinSjfPolicy.schedule` only proposes: when a request went back to the
queue is recorded when its plan is reported executed (:meth:`~RoundRobinSjfPolicy.on_step_end`),
so planning a step twice changes nothing.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan
from priority.policies.ordering import (
    all_decode_repeatable,
    fill,
    is_decoding,
    order_by_keys,
    priority_continuous_batch,
    room_for_new,
)
from priority.policies.params import require_finite_non_negative
from priority.request import Request

DEFAULT_QUANTUM = 5
"""Tokens before a running request becomes preemptible (the paper's best setting)."""


class OracleLengths:
    """The output length an oracle policy believes a request has.

    The true length (capped) — or, without an oracle, the prediction or the cap — plus, when
    ``sigma > 0``, one Gaussian draw per request. Draws are seeded by ``(seed, request_id)`` so
    they do not depend on the order requests are seen, and cached while the request is alive.
    """

    _PRUNE_AT = 4096

    def __init__(self, *, sigma: float = 0.0, seed: int = 0) -> None:
        if not (sigma >= 0 and math.isfinite(sigma)):
            raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
        self.sigma = sigma
        self.seed = seed
        self._cache: dict[str, int] = {}

    def __call__(self, request: Request) -> int:
        if self.sigma == 0.0:
            return _oracle(request)
        cached = self._cache.get(request.request_id)
        if cached is None:
            rng = random.Random(f"{self.seed}:{request.request_id}")
            noisy = round(_oracle(request) + rng.gauss(0.0, self.sigma))
            cached = min(max(1, noisy), request.max_output_tokens)
            self._cache[request.request_id] = cached
        return cached

    def many(self, requests: Sequence[Request]) -> npt.NDArray[np.float64]:
        """:meth:`__call__` over many requests, without a Python call per request."""
        if self.sigma == 0.0:
            true = np.array([r.true_output_tokens for r in requests], dtype=np.float64)
            cap = np.array([r.max_output_tokens for r in requests], dtype=np.float64)
            lengths = np.fmin(true, cap)  # no oracle (nan) -> the cap, replaced just below
            for i in np.flatnonzero(np.isnan(true)).tolist():
                lengths[i] = _oracle(requests[i])
            return lengths
        known = [self._cache.get(r.request_id) for r in requests]
        if None in known:
            known = [self(r) if k is None else k for r, k in zip(requests, known, strict=True)]
        return np.array(known, dtype=np.float64)

    def prune(self, alive: SchedulerInput) -> None:
        """Forget finished requests once the cache grows well past the live set."""
        live = len(alive.running) + len(alive.waiting)
        if len(self._cache) > max(self._PRUNE_AT, 2 * live):
            ids = {r.request_id for r in alive.running} | {r.request_id for r in alive.waiting}
            self._cache = {k: v for k, v in self._cache.items() if k in ids}


def _oracle(request: Request) -> int:
    if request.true_output_tokens is not None:
        return request.target_output_tokens
    return request.expected_output_tokens


@dataclass(frozen=True, slots=True)
class SjfParams:
    noise_sigma: float = 0.0
    """Std-dev (tokens) of the Gaussian noise added to oracle lengths."""
    seed: int = 0
    """Seed of that noise."""

    def __post_init__(self) -> None:
        require_finite_non_negative(noise_sigma=self.noise_sigma)


@dataclass(frozen=True, slots=True)
class RrSjfParams(SjfParams):
    quantum: int = DEFAULT_QUANTUM
    """Tokens since resume before a request may be preempted."""
    wait_resolution_s: float = 0.0
    """Waiting times are compared after flooring to this resolution, so requests that queued
    within the same window count as tied and go shortest first (0 = exact, as the paper's
    Algorithm 1; its requests arrived in bursts, where ties are common)."""

    def __post_init__(self) -> None:
        SjfParams.__post_init__(self)
        if self.quantum < 1:
            raise ValueError(f"quantum must be >= 1, got {self.quantum}")
        if self.wait_resolution_s < 0:
            raise ValueError(f"wait_resolution_s must be >= 0, got {self.wait_resolution_s}")


class SjfPolicy(SchedulingPolicy):
    """Shortest remaining (oracle) output first; running requests are never preempted for it."""

    name: ClassVar[str] = "sjf"
    uses_oracle_length: ClassVar[bool] = True
    default_params: ClassVar[SjfParams] = SjfParams()
    params: SjfParams

    def __init__(self, estimator: BatchLatencyEstimator, params: SjfParams | None = None) -> None:
        super().__init__(estimator, params)
        self.lengths = OracleLengths(sigma=self.params.noise_sigma, seed=self.params.seed)

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        self.lengths.prune(inp)
        return priority_continuous_batch(inp, self.order)

    def order(self, requests: Sequence[Request]) -> list[Request]:
        """Shortest remaining output first, then arrival."""
        done = np.array([r.num_output_tokens for r in requests], dtype=np.float64)
        remaining = np.maximum(1.0, self.lengths.many(requests) - done)
        return order_by_keys(requests, remaining, [r.arrival_s for r in requests])


class RoundRobinSjfPolicy(SchedulingPolicy):
    """RR-SJF: longest-waiting first, shortest predicted job on ties, quantum preemption."""

    name: ClassVar[str] = "rr-sjf"
    uses_oracle_length: ClassVar[bool] = True
    default_params: ClassVar[RrSjfParams] = RrSjfParams()
    params: RrSjfParams

    def __init__(self, estimator: BatchLatencyEstimator, params: RrSjfParams | None = None) -> None:
        super().__init__(estimator, params)
        p = self.params
        self.quantum = p.quantum
        self.wait_resolution_s = p.wait_resolution_s
        self.lengths = OracleLengths(sigma=p.noise_sigma, seed=p.seed)
        self._requeued_s: dict[str, float] = {}
        """When each request we preempted went back to the waiting queue."""
        self._planned_at: deque[tuple[StepPlan, float]] = deque(maxlen=64)
        """Plans not yet reported executed and when they were made, oldest first."""
        self._last_executed: StepPlan | None = None

    def queued_since(self, request: Request) -> float:
        """When the request was (last) placed on the waiting queue."""
        since = self._requeued_s.get(request.request_id)
        if since is not None:
            return since
        if request.num_output_tokens and request.token_times:
            return request.token_times[-1]  # preempted elsewhere: right after its last token
        return request.arrival_s

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        self.lengths.prune(inp)
        if len(self._requeued_s) > 2 * len(inp.waiting) + 1024:
            waiting_ids = {r.request_id for r in inp.waiting}
            self._requeued_s = {k: v for k, v in self._requeued_s.items() if k in waiting_ids}
        builder = BatchBuilder(inp)
        running = order_by_keys(
            inp.running, self.lengths.many(inp.running), [r.arrival_s for r in inp.running]
        )
        eligible = [r for r in running if is_decoding(r) and r.tokens_since_resume >= self.quantum]
        eligible_ids = {r.request_id for r in eligible}
        protected = [r for r in running if r.request_id not in eligible_ids]
        fill(builder, protected, victims=running[::-1], preempt_self=True)
        if inp.waiting and not builder.plan.preempted:
            self._admit(builder, inp.waiting, eligible)
        fill(builder, eligible)  # the ones the admissions left in place
        plan = builder.plan
        plan.repeatable = all_decode_repeatable(inp, plan)
        self._planned_at.append((plan, inp.now))
        return plan

    def on_step_end(self, plan: StepPlan, now: float) -> None:
        """The plan ran: its victims went back to the queue when it was made; its admissions
        left the queue."""
        if plan is self._last_executed:
            return  # a fast-forward reports one plan once per step: committed already
        self._last_executed = plan
        planned = self._planned_at
        at = now  # a plan we did not make
        if any(p is plan for p, _ in planned):
            while planned[0][0] is not plan:  # older plans never ran
                planned.popleft()
            at = planned.popleft()[1]
        for r in plan.preempted:
            self._requeued_s[r.request_id] = at
        for r, _ in plan.scheduled:
            self._requeued_s.pop(r.request_id, None)

    def waiting_order(self, waiting: Sequence[Request]) -> list[Request]:
        """Longest waiting first, then shortest predicted length, then arrival."""
        arrival = [r.arrival_s for r in waiting]
        requeued = self._requeued_s.get
        since = np.array(
            [
                self.queued_since(r) if r.num_output_tokens else requeued(r.request_id, a)
                for r, a in zip(waiting, arrival, strict=True)
            ],
            dtype=np.float64,
        )
        if self.wait_resolution_s > 0:
            since = np.floor(since / self.wait_resolution_s)
        return order_by_keys(waiting, since, self.lengths.many(waiting), arrival)

    def _admit(
        self, builder: BatchBuilder, waiting: list[Request], eligible: list[Request]
    ) -> None:
        """Admit waiting requests in order, preempting eligible ones while memory is short.

        One decode token stays reserved for each eligible request not preempted, so admissions
        take the token budget from nobody; "memory" is KV blocks or a free sequence slot.
        """
        victims = eligible[::-1]  # longest predicted first
        next_victim = 0
        reserve = sum(1 for r in eligible if not builder.is_scheduled(r))
        if not victims and not room_for_new(builder):
            return  # nothing could be admitted and nothing may be preempted
        for request in self.waiting_order(waiting):
            need = min(request.num_uncomputed_tokens, builder.tokens_left - reserve)
            if need <= 0:
                return
            while builder.grantable(request, need) < need and next_victim < len(victims):
                victim = victims[next_victim]
                next_victim += 1
                if not builder.is_scheduled(victim):
                    builder.preempt(victim)
                    reserve -= 1
            if builder.add(request, need) < need:
                return
