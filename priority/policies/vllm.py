"""vLLM's two stock schedulers, as PROSERVE's baselines.

* :class:`VllmFcfsPolicy` — the V0 default without chunked prefill: a step is *either* a
  prefill-only batch of newly admitted whole prompts (FCFS, head-of-line blocking) *or*, when no
  prompt can be admitted, a decode step of every running request in arrival order. On KV
  shortage the latest-arrived running request is preempted (recompute).
* :class:`VllmPriorityPolicy` — the V1 scheduler with ``--scheduling-policy priority``: running
  requests first in (priority, arrival) order, then waiting ones in the same order, chunked
  prefill filling the token budget. KV shortage preempts the lowest-priority, latest-arrived
  running request; a step that preempted admits nothing (vLLM's rule).

Tier weight is "larger = more important", so vLLM's ascending ``priority`` maps to descending
weight.
"""

from __future__ import annotations

from typing import ClassVar

from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan
from priority.policies.ordering import (
    all_decode_repeatable,
    arrival_order,
    fill,
    is_decoding,
    priority_continuous_batch,
    priority_order,
    room_for_new,
)


class VllmFcfsPolicy(SchedulingPolicy):
    """Prefill-first FCFS (vLLM V0 default, chunked prefill off).

    Prompts are admitted whole. One deviation, for liveness: a prompt longer than the whole
    token budget (V0 would reject it) is admitted alone and prefilled in budget-sized chunks
    over consecutive prefill steps.
    """

    name: ClassVar[str] = "vllm-fcfs"

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        builder = BatchBuilder(inp)
        running = arrival_order(inp.running)
        victims = running[::-1]  # latest arrival first
        # Prefill phase: unfinished chunked prompts first, then whole new prompts.
        fill(
            builder,
            (r for r in running if not is_decoding(r)),
            victims=victims,
            preempt_self=True,
        )
        if not builder.plan.preempted:
            self._admit_whole_prompts(builder, inp)
        if builder.plan.scheduled:
            return builder.plan
        # Decode phase: every running request, oldest first.
        fill(builder, running, victims=victims, preempt_self=True)
        builder.plan.repeatable = all_decode_repeatable(inp, builder.plan)
        return builder.plan

    @staticmethod
    def _admit_whole_prompts(builder: BatchBuilder, inp: SchedulerInput) -> None:
        if not inp.waiting or not room_for_new(builder):
            return
        budget = inp.limits.token_budget
        for request in arrival_order(inp.waiting):
            need = request.num_uncomputed_tokens
            if need > budget:
                # Too long for any step: only alone in a prefill step, chunked at the budget.
                if builder.plan.scheduled:
                    break
                need = budget
            if builder.grantable(request, need) < need:
                break  # FCFS: nothing overtakes a prompt that does not fit
            builder.add(request, need)


class VllmPriorityPolicy(SchedulingPolicy):
    """vLLM V1 priority scheduling with chunked prefill."""

    name: ClassVar[str] = "vllm-priority"

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        return priority_continuous_batch(inp, priority_order)
