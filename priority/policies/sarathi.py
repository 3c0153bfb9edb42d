"""Sarathi-Serve's stall-free batching (Agrawal et al., OSDI'24), as PROSERVE's baselines.

Every step first continues all running decodes, then spends a prefill token budget on chunked
prefills: in-progress ones (they already hold KV) before new ones. The budget is Sarathi's
"TBT-profiled token budget": the most tokens a step may carry and still finish within the
tightest TPOT SLO among running requests, computed through the shared estimator from the decodes
actually in the batch. On KV shortage the running request last in the order is preempted
(recompute), and — as in vLLM V0's chunked-prefill scheduler Sarathi is built on — a step that
preempted admits nothing new.

* :class:`SarathiFcfsPolicy` — decodes and prefills in arrival order.
* :class:`SarathiPriorityPolicy` — decodes first, then by tier weight (descending), then arrival.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan
from priority.policies.ordering import (
    Order,
    all_decode_repeatable,
    arrival_order,
    fill,
    is_decoding,
    priority_order,
    room_for_new,
)

DEFAULT_MIN_PREFILL_TOKENS = 64
"""Prefill tokens a step always may take, even when the decodes alone exceed the TPOT: without
this floor an overloaded engine would never admit anything again."""


@dataclass(frozen=True, slots=True)
class SarathiParams:
    min_prefill_tokens: int = DEFAULT_MIN_PREFILL_TOKENS
    """Floor of the per-step prefill budget (>= 1)."""

    def __post_init__(self) -> None:
        if self.min_prefill_tokens < 1:
            raise ValueError(f"min_prefill_tokens must be >= 1, got {self.min_prefill_tokens}")


class SarathiFcfsPolicy(SchedulingPolicy):
    """Decode-first chunked prefill, FCFS within decodes and within prefills."""

    name: ClassVar[str] = "sarathi-fcfs"
    order: ClassVar[Order] = staticmethod(arrival_order)
    default_params: ClassVar[SarathiParams] = SarathiParams()
    params: SarathiParams

    def __init__(
        self, estimator: BatchLatencyEstimator, params: SarathiParams | None = None
    ) -> None:
        super().__init__(estimator, params)
        self.min_prefill_tokens = self.params.min_prefill_tokens

    def prefill_budget(self, inp: SchedulerInput) -> int:
        """Prefill tokens this step may carry next to the running decodes.

        The largest chunk whose time, added to the decode batch (``t_c`` plus every running
        decode), stays within the tightest running TPOT SLO; the engine budget when no running
        request has a TPOT SLO. Never below ``min_prefill_tokens`` (unless the engine budget is).
        """
        engine_budget = inp.limits.token_budget
        tpots = [r.slo.tpot_s for r in inp.running if r.slo.tpot_s is not None]
        if not tpots:
            return engine_budget
        num_decodes, decode_kv = 0, 0
        for r in inp.running:
            if is_decoding(r):
                num_decodes += 1
                decode_kv += r.num_computed_tokens
        est = self.estimator
        c = est.coefficients
        decode_s = est.beta * (c.t_c + c.a_d * decode_kv + c.b_d * num_decodes)
        chunk = est.max_chunk(0, min(tpots) - decode_s, engine_budget)
        return min(engine_budget, max(self.min_prefill_tokens, chunk))

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        builder = BatchBuilder(inp)
        order = type(self).order
        running = order(inp.running)
        victims = running[::-1]
        decodes = [r for r in running if is_decoding(r)]
        fill(builder, decodes, victims=victims, preempt_self=True)
        prefill_left = self.prefill_budget(inp)
        if not builder.plan.preempted:
            prefilling = (r for r in running if not is_decoding(r))
            prefill_left -= fill(
                builder, prefilling, victims=victims, preempt_self=True, token_cap=prefill_left
            )
        if inp.waiting and not builder.plan.preempted and room_for_new(builder, prefill_left):
            fill(
                builder,
                order(inp.waiting),
                token_cap=prefill_left,
                stop_when_blocked=True,
            )
        builder.plan.repeatable = all_decode_repeatable(inp, builder.plan)
        return builder.plan


class SarathiPriorityPolicy(SarathiFcfsPolicy):
    """Sarathi with priority order: decodes first, then tier weight (descending), then arrival."""

    name: ClassVar[str] = "sarathi-priority"
    order: ClassVar[Order] = staticmethod(priority_order)
