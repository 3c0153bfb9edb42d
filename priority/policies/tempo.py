"""Tempo — service-gain density with graded decay (JITServe's earlier version, arXiv 2504.20068).

Every request (running or waiting) is ranked by its *expected service gain density*: the goodput
it still promises, decayed by how late its projected finish is, over the generation time it
occupies::

    projected = (now − arrival) + need_s          # estimator-based finish, length bound
    ESG       = value · min(1, (SLO span / projected) ** decay_alpha)
    density   = ESG / cost_s

(``value``, ``need_s``, ``cost_s``: :class:`~priority.policies.lengthaware.GoodputView`; the SLO
span is the request's end-to-end due time minus its arrival.) Tempo "allocates just enough
serving bandwidth to meet each SLO": the bandwidth handed out is a step's time,
:meth:`~priority.policies.lengthaware.LengthAwarePolicyMixin.step_budget` (the tightest running
stream's TPOT, shared with GMAX). In density order within it: running decodes continue, then
running prefills and waiting requests compete by density
(:func:`~priority.policies.lengthaware.interleave_prefills`); KV shortage preempts the lowest
density, and waiting requests are admitted only in steps without such preemptions, stopping at
the first that does not fit. (Filling the batch to the engine's own limits instead — 256 seats,
8,192 tokens — admitted every waiting request within a step or two on the goodput bench, so
density only sequenced what vLLM admits anyway: ``tempo`` was within 0.01 of ``vllm-v1`` at
every load.)

**Cost-aware preemption** (Tempo §4.2, "Cost-aware Preemption in Scheduling": "since the
preemption overhead primarily depends on the size of the KV cache to be freed, the stall time
is predictable. Tempo uses this to estimate the potential loss in service gain during
preemption. A preemption is allowed only if the expected gain from switching to a
higher-density request exceeds the estimated loss … Tempo limits preemptions to fixed time
quanta (e.g., every 20 decoding steps)"). Every ``frame_steps`` (20) executed steps, the
densest waiting requests that find no seat or KV room preempt the lowest-density running ones,
each preemption only if the newcomer's ESG exceeds the victim's stall loss — its recompute time
(estimator prefill of its computed tokens) in steps × its ESG per remaining token — and the
newcomer's density exceeds ``1 + preempt_margin`` times the victim's (0: "a higher-density
request"); at most ``max_preempt_per_frame`` victims per frame. The walk is GMAX's
(:class:`~priority.policies.frames.FramePreemptionMixin`); a step whose only preemptions are
the frame's still admits (they were made for that).

**Where it differs from GMAX** (:mod:`priority.policies.gmax`): no eligibility cut — a late
request keeps a decayed value instead of being demoted or dropped, so Tempo still spends capacity
on requests that will miss (and a late newcomer may still preempt at a frame boundary, where
GMAX lets only eligible ones); no length-grouped window; the frame rule on Tempo's own terms —
frames of 20 steps (JITServe Δ = 50), gain the decayed service gain in tokens and priority the
density (GMAX: one request's goodput and its aged, slack-weighted score), no margin by default
(JITServe's δ = 0.1 comes from its competitive analysis; Tempo asks for a higher density only),
no KV growth reserve at admission; no aging, fairness or slack-aware term, and the length bound
everywhere (GMAX ranks and judges eligibility by the likely length) — density alone, so a
request with ample slack is served as soon as its density says, not just in time.

The ``tempo-oracle`` variant reads the true output lengths (simulator only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from priority.policies.base import SchedulerInput, StepPlan
from priority.policies.frames import FramedLengthAwarePolicy, FramedParams
from priority.policies.lengthaware import (
    ARRIVAL,
    FloatArray,
    GoodputView,
    continue_decodes,
    continue_one,
    interleave_prefills,
)
from priority.policies.ordering import all_decode_repeatable, room_for_new


@dataclass(frozen=True, slots=True)
class TempoParams(FramedParams):
    """Tempo's parameters: GMAX's length and frame knobs with Tempo's frame defaults (every 20
    steps; margin 0: any higher density), plus the decay."""

    decay_alpha: float = 1.0
    """Tempo's α (1 in the paper; large values approach all-or-nothing)."""
    frame_steps: int = 20
    preempt_margin: float = 0.0

    def __post_init__(self) -> None:
        FramedParams.__post_init__(self)
        if not (self.decay_alpha > 0 and math.isfinite(self.decay_alpha)):
            raise ValueError(f"decay_alpha must be a positive number, got {self.decay_alpha}")


class TempoPolicy(FramedLengthAwarePolicy):
    """Tempo's service-gain-density order with graded decay."""

    name: ClassVar[str] = "tempo"
    default_params: ClassVar[TempoParams] = TempoParams()
    params: TempoParams

    def gain(self, view: GoodputView, now: float) -> FloatArray:
        """Expected service gain (ESG, graded decay) of every request in ``view``."""
        since = now - view.static[:, ARRIVAL]
        projected = np.maximum(since + view.need_s, 1e-9)
        span = np.maximum(since + view.left_s, 0.0)
        span = np.where(np.isfinite(span), span, projected)  # no due time: no decay
        decay = np.minimum(1.0, span / projected) ** self.params.decay_alpha  # = min(1, (.)^α)
        return view.value * decay

    def density(self, view: GoodputView, now: float) -> FloatArray:
        """Expected service gain density of every request in ``view``."""
        return self.gain(view, now) / view.cost_s

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        if not inp.running and not inp.waiting:
            return StepPlan()
        view = self.view(inp)
        builder = self.step_builder(inp, view)
        plan = builder.plan
        nr = view.num_running
        gain = self.gain(view, inp.now)
        density = gain / view.cost_s
        requests = view.requests
        run_idx = np.argsort(-density[:nr], kind="stable")
        running = [requests[i] for i in run_idx.tolist()]
        order = (nr + np.argsort(-density[nr:], kind="stable")).tolist()
        at_boundary = self.frame_boundary(plan)
        if at_boundary and nr and order and self.max_preempt_per_frame:
            self.frame_preempt(builder, view, order, run_idx[::-1].tolist(), gain, density)
        before = len(plan.preempted)  # the frame's preemptions make room for admissions
        victims, prefilling = continue_decodes(builder, view, run_idx, running)
        admitting = len(plan.preempted) == before
        for i in interleave_prefills(prefilling, order, density):
            if builder.full:
                break
            if i < nr:
                continue_one(builder, requests[i], victims)
                admitting &= len(plan.preempted) == before
            elif admitting and (not room_for_new(builder) or builder.add(requests[i]) <= 0):
                admitting = False  # vLLM's rule: admission stops at the first that does not fit
        waiting = [requests[i] for i in order]
        if not plan.scheduled:
            self.ensure_progress(builder, running, waiting)
        plan.repeatable = all_decode_repeatable(inp, plan)
        return plan

    def on_step_end(self, plan: StepPlan, now: float) -> None:
        """Count executed steps (the preemption frames)."""
        self.count_frame_step(plan)


class TempoOraclePolicy(TempoPolicy):
    """Tempo with the true output lengths (simulation only: an upper bound)."""

    name: ClassVar[str] = "tempo-oracle"
    uses_oracle_length: ClassVar[bool] = True
    oracle = True


__all__ = ["TempoOraclePolicy", "TempoParams", "TempoPolicy"]
