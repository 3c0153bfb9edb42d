"""FairBatching's EDF variant (Lyu et al., 2025) as PROSERVE evaluates it.

Batch order: decodes whose next token is about to miss its deadline first, then prefills
(in-progress and new) earliest-deadline-first by the deadline of their next token (the TTFT
deadline for a fresh prompt), then the remaining decodes earliest-deadline-first. The token
budget is the engine's.

"About to miss" is our choice (the source gives no number): a decode is *near-deadline* when
its slack is below ``urgent_steps`` estimated step times, a step being the decode batch of every
running decode plus the fixed overhead ``t_c``. With the default of 2, a decode that would miss
if it sat out this step and the next is never pushed behind prefills.

On KV shortage the running request with the latest deadline is preempted (recompute).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan
from priority.policies.ordering import (
    all_decode_repeatable,
    fill,
    is_decoding,
    next_token_deadlines,
    room_for_new,
)
from priority.request import Request

DEFAULT_URGENT_STEPS = 2.0


@dataclass(frozen=True, slots=True)
class FairBatchingParams:
    urgent_steps: float = DEFAULT_URGENT_STEPS
    """Slack, in estimated decode steps, under which a decode is urgent."""

    def __post_init__(self) -> None:
        if self.urgent_steps < 0:
            raise ValueError(f"urgent_steps must be >= 0, got {self.urgent_steps}")


class FairBatchingPolicy(SchedulingPolicy):
    """Near-deadline decodes, then EDF prefills, then the other decodes by deadline."""

    name: ClassVar[str] = "fairbatching"
    default_params: ClassVar[FairBatchingParams] = FairBatchingParams()
    params: FairBatchingParams

    def __init__(
        self, estimator: BatchLatencyEstimator, params: FairBatchingParams | None = None
    ) -> None:
        super().__init__(estimator, params)
        self.urgent_steps = self.params.urgent_steps

    def decode_step_s(self, decodes: list[Request]) -> float:
        """Estimated time of a step carrying just these decodes."""
        c = self.estimator.coefficients
        kv = sum(r.num_computed_tokens for r in decodes)
        return self.estimator.beta * (c.t_c + c.a_d * kv + c.b_d * len(decodes))

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        builder = BatchBuilder(inp)
        deadlines = next_token_deadlines(inp.running)
        by_deadline = np.argsort(deadlines, kind="stable").tolist()
        running = [inp.running[i] for i in by_deadline]
        victims = running[::-1]  # latest deadline first
        decodes: list[Request] = []
        decode_due: list[float] = []
        running_prefills: list[tuple[float, Request]] = []
        for due_s, r in zip(deadlines[by_deadline].tolist(), running, strict=True):
            if is_decoding(r):
                decodes.append(r)
                decode_due.append(due_s)
            else:
                running_prefills.append((due_s, r))
        horizon = inp.now + self.urgent_steps * self.decode_step_s(decodes)
        fill(builder, decodes[: bisect_left(decode_due, horizon)], victims=victims)

        # Prefills, EDF over running ones (hold KV, may preempt) and waiting ones (admitted
        # until the first that does not fit: no later deadline overtakes it).
        waiting: Iterable[tuple[float, Request]] = ()
        if inp.waiting and room_for_new(builder):
            due = next_token_deadlines(inp.waiting)
            edf = np.argsort(due, kind="stable")
            ordered = map(inp.waiting.__getitem__, edf.tolist())
            waiting = zip(due[edf].tolist(), ordered, strict=True)
        for _, r in heapq.merge(running_prefills, waiting, key=_first):
            if builder.tokens_left <= 0:
                break
            if r.num_kv_blocks > 0:
                fill(builder, (r,), victims=victims)
            elif builder.add(r) == 0:
                break
        # In-progress prefills behind a blocked admission still continue, by deadline.
        fill(builder, (r for _, r in running_prefills), victims=victims)

        fill(builder, decodes, victims=victims)  # the rest, by deadline (scheduled ones skip)
        builder.plan.repeatable = all_decode_repeatable(inp, builder.plan)
        return builder.plan


def _first(item: tuple[float, Request]) -> float:
    return item[0]
