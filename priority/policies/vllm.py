"""vLLM's schedulers as baselines: the V1 scheduler users run, and the V0 default it replaced.

* :class:`VllmV1Policy` (``vllm-v1``) and :class:`VllmV1PriorityPolicy` (``vllm-v1-priority``) —
  the decisions of vLLM 0.33's V1 ``Scheduler.schedule()`` (``--scheduling-policy fcfs`` /
  ``priority``; ``version="0.23"`` for the 0.23 differences, which vllm-ascend runs), transcribed
  step for step so that in the simulator they make exactly the stock scheduler's decisions
  (checked request by request against the real classes in ``tests/engines/``):

  1. *Running loop*, in the engine's running order (admission order, not priority): each request
     gets ``min(tokens it needs, budget left)`` (chunked prefill). When its KV blocks cannot be
     allocated, a victim is preempted and the allocation retried: FCFS takes the last running
     request; priority takes the least important, latest arrival of *all* running requests (one
     already scheduled this step gives its tokens back). Preempting the request itself ends the
     loop — except in 0.33's priority mode, which goes on with the next request.
  2. *Waiting loop*, only in a step that preempted nothing: requests in queue order (FCFS: the
     engine's queue, preempted ones put back at the front; priority: ``(priority, arrival,
     request id)``), each taking ``min(tokens it needs, budget left)``, while seats are left;
     the first request the admission rule refuses (its whole current sequence must fit) stops
     the loop.

  Tier weight maps to vLLM's ``priority`` monotonically (the plugin reads ``priority`` as
  weight ``2 ** -priority``): a larger weight is a smaller ``priority``.
* :class:`VllmV0FcfsPolicy` (``vllm-v0-fcfs``) — the V0 default without chunked prefill, as
  PROSERVE's baseline: a step is *either* a prefill-only batch of newly admitted whole prompts
  (FCFS, head-of-line blocking) *or*, when no prompt can be admitted, a decode step of every
  running request in arrival order. On KV shortage the latest-arrived running request is
  preempted (recompute). No vLLM that users run today schedules like this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan, cdiv
from priority.policies.ordering import (
    all_decode_repeatable,
    arrival_order,
    fill,
    is_decoding,
    room_for_new,
)
from priority.request import Request

VllmVersion = Literal["0.33", "0.23"]


def _least_important(running: list[Request]) -> Request:
    """vLLM's priority victim: ``max(running, key=(priority, arrival_time))``, first on ties."""
    return max(running, key=lambda r: (-r.weight, r.arrival_s))


def _priority_queue_key(request: Request) -> tuple[float, float, str]:
    """vLLM's ``Request.__lt__``: priority, then arrival time, then request id."""
    return (-request.weight, request.arrival_s, request.request_id)


@dataclass(frozen=True, slots=True)
class VllmV1Params:
    version: VllmVersion = "0.33"
    """Whose rules to follow where vLLM 0.23 and 0.33 differ."""

    def __post_init__(self) -> None:
        if self.version not in ("0.33", "0.23"):
            raise ValueError(f"version must be '0.33' or '0.23', got {self.version!r}")


class VllmV1Policy(SchedulingPolicy):
    """vLLM V1's scheduler step, FCFS (the default ``--scheduling-policy``)."""

    name: ClassVar[str] = "vllm-v1"
    priority: ClassVar[bool] = False
    default_params: ClassVar[VllmV1Params] = VllmV1Params()
    params: VllmV1Params

    def __init__(
        self, estimator: BatchLatencyEstimator, params: VllmV1Params | None = None
    ) -> None:
        super().__init__(estimator, params)
        self.version = self.params.version

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        limits = inp.limits
        bs = limits.block_size
        free = limits.num_free_blocks
        budget = limits.token_budget
        running = list(inp.running)
        tokens: dict[str, int] = {}  # scheduled this step, in scheduling order
        new_blocks: dict[str, int] = {}
        by_id: dict[str, Request] = {}
        preempted: list[Request] = []
        continue_after_self = self.priority and self.version == "0.33"

        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            want = min(request.num_uncomputed_tokens, budget)
            need = max(0, cdiv(request.num_computed_tokens + want, bs) - request.num_kv_blocks)
            fits = True
            while need > free:
                if self.priority:
                    victim = _least_important(running)
                    index = running.index(victim)
                    del running[index]
                    if index < i:
                        i -= 1
                    restored = tokens.pop(victim.request_id, 0)
                    budget += restored
                    free += new_blocks.pop(victim.request_id, 0)
                else:
                    victim = running.pop()
                free += victim.num_kv_blocks
                preempted.append(victim)
                if victim is request:
                    fits = False
                    break
            if not fits:
                if continue_after_self:
                    continue  # ``i`` already points at the next request
                break
            tokens[request.request_id] = want
            new_blocks[request.request_id] = need
            by_id[request.request_id] = request
            budget -= want
            free -= need
            i += 1

        admitted: list[tuple[Request, int]] = []
        if not preempted:
            queue = sorted(inp.waiting, key=_priority_queue_key) if self.priority else inp.waiting
            rule = limits.admission
            for request in queue:
                if budget <= 0 or len(running) >= limits.max_num_seqs:
                    break
                want = min(request.num_uncomputed_tokens, budget)
                chunk_blocks = cdiv(request.num_computed_tokens + want, bs)
                if (
                    rule.required_blocks(request, chunk_blocks, bs, anything_running=bool(running))
                    > free
                ):
                    break
                running.append(request)
                admitted.append((request, want))
                free -= chunk_blocks
                budget -= want

        return self._plan(inp, [(by_id[r], t) for r, t in tokens.items()] + admitted, preempted)

    @staticmethod
    def _plan(
        inp: SchedulerInput, scheduled: list[tuple[Request, int]], preempted: list[Request]
    ) -> StepPlan:
        """The decisions as a plan, checked by the shared builder (a mismatch is a bug here)."""
        builder = BatchBuilder(inp)
        for victim in preempted:
            if victim.num_kv_blocks > 0:  # a waiting request never is; a new one may be
                builder.preempt(victim)
        for request, want in scheduled:
            if builder.add_exact(request, want) != want:
                raise RuntimeError(
                    f"vLLM V1 transcription disagrees with the limits on {request.request_id}"
                )
        builder.plan.repeatable = all_decode_repeatable(inp, builder.plan)
        return builder.plan


class VllmV1PriorityPolicy(VllmV1Policy):
    """vLLM V1's scheduler step with ``--scheduling-policy priority``."""

    name: ClassVar[str] = "vllm-v1-priority"
    priority: ClassVar[bool] = True


class VllmV0FcfsPolicy(SchedulingPolicy):
    """Prefill-first FCFS (vLLM V0 default, chunked prefill off).

    Prompts are admitted whole. One deviation, for liveness: a prompt longer than the whole
    token budget (V0 would reject it) is admitted alone and prefilled in budget-sized chunks
    over consecutive prefill steps.
    """

    name: ClassVar[str] = "vllm-v0-fcfs"

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
