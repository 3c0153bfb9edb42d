"""Tempo — service-gain density with graded decay (JITServe's earlier version, arXiv 2504.20068).

Every request (running or waiting) is ranked by its *expected service gain density*: the goodput
it still promises, decayed by how late its projected finish is, over the generation time it
occupies::

    projected = (now − arrival) + need_s          # estimator-based finish, length bound
    ESG       = value · min(1, (SLO span / projected) ** decay_alpha)
    density   = ESG / cost_s

(``value``, ``need_s``, ``cost_s``: :class:`~priority.policies.lengthaware.GoodputView`; the SLO
span is the request's end-to-end due time minus its arrival.) The batch is then filled like
vLLM's priority scheduler in density order: running requests continue, KV shortage preempts the
lowest density, and waiting requests are admitted only in steps without preemptions, stopping at
the first that does not fit.

**Where it differs from GMAX** (:mod:`priority.policies.gmax`): no eligibility cut — a late
request keeps a decayed value instead of being demoted or dropped, so Tempo still spends capacity
on requests that will miss; no length-grouped window; no frame-based preemption rule (KV shortage
alone preempts, at any step); no aging, fairness or slack-aware term — density alone, so a request
with ample slack is served as soon as its density says, not just in time. The ``tempo-oracle``
variant reads the true output lengths (simulator only).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from priority.estimator import BatchLatencyEstimator
from priority.gain import DEFAULT_BEST_EFFORT_DEADLINE_S, GoodputWeights
from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan
from priority.policies.lengthaware import (
    ARRIVAL,
    PRICING_WEIGHTS,
    FloatArray,
    GoodputView,
    LengthAwarePolicyMixin,
    continue_running,
)
from priority.policies.ordering import all_decode_repeatable, room_for_new


class TempoPolicy(LengthAwarePolicyMixin, SchedulingPolicy):
    """Tempo's service-gain-density order with graded decay."""

    name: ClassVar[str] = "tempo"

    def __init__(
        self,
        estimator: BatchLatencyEstimator,
        *,
        quantile: float = 0.95,
        refine_every: int = 16,
        decay_alpha: float = 1.0,
        goodput_weights: GoodputWeights = PRICING_WEIGHTS,
        best_effort_deadline_s: float = DEFAULT_BEST_EFFORT_DEADLINE_S,
    ) -> None:
        """``decay_alpha``: Tempo's α (1 in the paper; large values approach all-or-nothing);
        ``goodput_weights``: w_in : w_out (Tempo's pricing ratio 1 : 2)."""
        super().__init__(estimator)
        if not (decay_alpha > 0 and math.isfinite(decay_alpha)):
            raise ValueError(f"decay_alpha must be a positive number, got {decay_alpha}")
        self._init_lengths(
            quantile=quantile,
            refine_every=refine_every,
            goodput_weights=goodput_weights,
            best_effort_deadline_s=best_effort_deadline_s,
        )
        self.decay_alpha = decay_alpha

    def density(self, view: GoodputView, now: float) -> FloatArray:
        """Expected service gain density of every request in ``view``."""
        since = now - view.static[:, ARRIVAL]
        projected = np.maximum(since + view.need_s, 1e-9)
        span = np.maximum(since + view.left_s, 0.0)
        span = np.where(np.isfinite(span), span, projected)  # no due time: no decay
        decay = np.minimum(1.0, span / projected) ** self.decay_alpha  # = min(1, (.)^α)
        return view.value * decay / view.cost_s

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        builder = BatchBuilder(inp)
        plan = builder.plan
        if not inp.running and not inp.waiting:
            return plan
        view = self.view(inp)
        nr = view.num_running
        density = self.density(view, inp.now)
        requests = view.requests
        run_idx = np.argsort(-density[:nr], kind="stable")
        running = [requests[i] for i in run_idx.tolist()]
        victims = (r for r in reversed(running) if r.num_kv_blocks > 0)
        continue_running(
            builder, running, view.computed[run_idx], view.uncomputed[run_idx], victims
        )
        if inp.waiting and not plan.preempted:
            order = nr + np.argsort(-density[nr:], kind="stable")
            for i in order.tolist():
                if not room_for_new(builder) or builder.add(requests[i]) <= 0:
                    break
        plan.repeatable = all_decode_repeatable(inp, plan)
        return plan


class TempoOraclePolicy(TempoPolicy):
    """Tempo with the true output lengths (simulation only: an upper bound)."""

    name: ClassVar[str] = "tempo-oracle"
    uses_oracle_length: ClassVar[bool] = True
    oracle = True


__all__ = ["TempoOraclePolicy", "TempoPolicy"]
