"""Frame-based, cost-aware preemption: the rule GMAX and Tempo share (JITServe / Tempo §4.2).

Both papers let a better newcomer take a running request's place, but not at every step: a
preemption stalls the victim while its KV is recomputed, and preempting on every arrival churns.
So, in both,

* preemption happens only at *frame* boundaries — every ``frame_steps`` executed steps (JITServe:
  "scheduling updates are restricted to discrete time frames (e.g., Δ = 50 decoding steps)";
  Tempo: "Tempo limits preemptions to fixed time quanta (e.g., every 20 decoding steps)");
* a victim is taken only if the newcomer's gain exceeds what the victim loses while it stalls —
  the recompute time (estimator prefill of its computed tokens) in steps × its gain per token
  (JITServe: "goodput_loss = stall_duration × token_generation_speed"; Tempo: "a preemption is
  allowed only if the expected gain from switching to a higher-density request exceeds the
  estimated loss") — and the newcomer's priority beats the victim's by ``1 + preempt_margin``
  (JITServe's δ = 0.1, from its competitive analysis; Tempo asks only for a higher density).

The policy says what "gain" and "priority" are (GMAX: a request's goodput and its score; Tempo:
the decayed service gain and its density); the frame clock and the victim walk live here.
The frame restarts when the boundary step's plan is reported executed (an engine may plan a
step several times and run only one of the plans).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import BatchBuilder, SchedulingPolicy, StepPlan, cdiv
from priority.policies.lengthaware import (
    FloatArray,
    GoodputView,
    LengthAwareParams,
    LengthAwarePolicyMixin,
)
from priority.policies.params import require_finite_non_negative
from priority.request import Request


@dataclass(frozen=True, slots=True)
class FramedParams(LengthAwareParams):
    """A length-aware policy's parameters plus the frame rule's (JITServe's defaults)."""

    frame_steps: int = 50
    """Executed steps per frame (JITServe Δ = 50)."""
    preempt_margin: float = 0.1
    """A newcomer's priority must beat its victim's by ``1 + preempt_margin`` (JITServe δ)."""
    max_preempt_per_frame: int = 4

    def __post_init__(self) -> None:
        LengthAwareParams.__post_init__(self)
        if self.frame_steps < 1 or self.max_preempt_per_frame < 0:
            raise ValueError("frame_steps >= 1, max_preempt_per_frame >= 0")
        require_finite_non_negative(preempt_margin=self.preempt_margin)


def growth_reserve_blocks(view: GoodputView, block_size: int, reserve_tokens: int) -> int:
    """KV blocks the running requests need to finish their prompts and then grow
    ``reserve_tokens`` more. Admitting into a full cache thrashes (SlideBatching's lesson), and
    admitting into the blocks a started chunked prefill still needs preempts started work for
    new (a bug once: GMAX started one long prompt's first chunk each step and preempted the one
    it had started the step before, so none finished)."""
    if not reserve_tokens or not view.num_running:
        return 0
    nr = view.num_running
    computed = view.computed[:nr]
    held = -(-computed // block_size)
    prompt_end = computed + (view.uncomputed[:nr] - 1).clip(min=0)  # = computed when decoding
    need = -(-(prompt_end + reserve_tokens) // block_size) - held
    return int(need.clip(min=0).sum())


def reserve_of(request: Request, block_size: int, reserve_tokens: int) -> int:
    """The share of :func:`growth_reserve_blocks` that ``request`` held (freed when it goes)."""
    prompt_end = max(request.num_computed_tokens, request.num_tokens - 1)
    need = cdiv(prompt_end + reserve_tokens, block_size)
    return max(0, need - request.num_kv_blocks)


def _room(builder: BatchBuilder, need_blocks: int, reserve: int) -> bool:
    return builder.num_seqs < builder.max_num_seqs and builder.free_blocks - need_blocks >= reserve


class FramePreemptionMixin:
    """The frame clock and the cost-aware victim walk (see the module docstring)."""

    estimator: BatchLatencyEstimator
    frame_steps: int
    preempt_margin: float
    max_preempt_per_frame: int
    _steps_in_frame: int
    _boundary_plan: StepPlan | None

    def _init_frames(self, params: FramedParams) -> None:
        self.frame_steps = params.frame_steps
        self.preempt_margin = params.preempt_margin
        self.max_preempt_per_frame = params.max_preempt_per_frame
        self._steps_in_frame = params.frame_steps  # the first step is a frame boundary
        self._boundary_plan = None

    def frame_boundary(self, plan: StepPlan) -> bool:
        """Whether the step ``plan`` is built for starts a frame (the plan is remembered: the
        frame restarts only if it runs, :meth:`count_frame_step`)."""
        at_boundary = self._steps_in_frame >= self.frame_steps
        if at_boundary:
            self._boundary_plan = plan
        return at_boundary

    def count_frame_step(self, plan: StepPlan) -> None:
        """One executed step; the executed boundary step is the new frame's first."""
        self._steps_in_frame += 1
        if plan is self._boundary_plan:
            self._steps_in_frame = 1
            self._boundary_plan = None

    def frame_preempt(
        self,
        builder: BatchBuilder,
        view: GoodputView,
        candidates: Iterable[int],
        victims: Sequence[int],
        gain: FloatArray,
        priority: FloatArray,
        kv_reserve_tokens: int = 0,
    ) -> None:
        """Make room for the first ``max_preempt_per_frame`` of ``candidates`` (waiting, best
        first; indices into ``view``) by preempting ``victims`` (running, weakest first) while
        each preemption pays: ``gain[c]`` above the victim's stall loss and ``priority[c]``
        above ``(1 + preempt_margin) · priority[victim]``. The first victim that does not pay
        ends the walk (the victims only get stronger). Room means a seat and the candidate's
        prompt in KV with ``kv_reserve_tokens`` of growth left for every running request."""
        block_size = builder.block_size
        reserve = growth_reserve_blocks(view, block_size, kv_reserve_tokens)
        est = self.estimator
        taken = 0
        v = 0
        for c in islice(candidates, self.max_preempt_per_frame):
            request = view.requests[c]
            need_blocks = cdiv(request.num_tokens, block_size)
            while not _room(builder, need_blocks, reserve):
                if taken >= self.max_preempt_per_frame or v >= len(victims):
                    return
                victim_i = victims[v]
                victim = view.requests[victim_i]
                if victim.num_kv_blocks == 0 or builder.is_scheduled(victim):
                    v += 1
                    continue
                stall_s = est.prefill_time(float(view.computed[victim_i]), 0.0)
                per_token = gain[victim_i] / view.remaining[victim_i]
                stall_loss = stall_s / view.step_s * per_token
                if not (
                    gain[c] > stall_loss
                    and priority[c] > (1.0 + self.preempt_margin) * priority[victim_i]
                ):
                    return  # victims only get stronger from here
                builder.preempt(victim)
                reserve = max(0, reserve - reserve_of(victim, block_size, kv_reserve_tokens))
                taken += 1
                v += 1
            # room for c now; it is admitted in order after the running requests continue
            reserve += cdiv(kv_reserve_tokens, block_size) if kv_reserve_tokens else 0


class FramedLengthAwarePolicy(FramePreemptionMixin, LengthAwarePolicyMixin, SchedulingPolicy):
    """What GMAX and Tempo are built on: the length-aware columns and bounds and the frame clock,
    set up from the policy's :class:`FramedParams`."""

    params: FramedParams

    def __init__(
        self, estimator: BatchLatencyEstimator, params: FramedParams | None = None
    ) -> None:
        super().__init__(estimator, params)
        self._init_lengths(self.params)
        self._init_frames(self.params)
