"""The engine-level policy contract.

A policy sees the engine's running requests (holding KV blocks) and waiting requests (holding
none: new, or preempted for recompute) plus the engine's limits, and returns the step's plan:
which requests run and how many tokens each computes, and which running requests are preempted.
The same objects run in the simulator, in the emulated engines and inside vLLM's scheduler.

Semantics the executors implement:

* a scheduled request computes ``tokens`` more tokens this step; when that completes its
  ``num_tokens`` it samples one output token at the end of the step;
* a running request that is neither scheduled nor preempted keeps its KV and waits;
* a preempted request frees all its KV and recomputes from scratch later (vLLM's recompute);
* a scheduled waiting request is admitted (becomes running).

:class:`BatchBuilder` enforces the limits (token budget, max sequences, free KV blocks, the
engine's admission rule and, optionally, a latency budget through the shared estimator) so every
policy respects them the same way and none can exceed them.

**The admission rule.** vLLM (0.23 and 0.33, ``scheduler_reserve_full_isl``, on by default)
admits a waiting request only if blocks for its *whole current sequence* (prompt plus the output
it already has: a preempted request resumes only when all of it fits again), plus 0.33's
watermark, are free at the moment its admission is checked — after the running requests took
their blocks for the step and after the earlier admissions of the step took theirs. A plan that
ignores the rule is refused by the real engine, so the rule is part of the limits
(:class:`AdmissionRule`) and the builder plans within it: an admission is checked against the
free blocks at that point, and a running request added *after* an admission may take only what
leaves every earlier admission's check true (the builder keeps the smallest such slack).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from priority.estimator import BatchLatencyEstimator
from priority.policies.params import NO_PARAMS
from priority.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class AdmissionRule:
    """When the engine admits a waiting request (new, or preempted and resuming)."""

    full_sequence: bool = False
    """vLLM's ``scheduler_reserve_full_isl``: the whole current sequence must fit, not just the
    first chunk. False: per-chunk admission (an idealised engine; the simulator's old rule)."""
    watermark_blocks: int = 0
    """Blocks an admission must leave free while any request holds KV (vLLM 0.33's
    ``--watermark`` x the pool's blocks; 0 by default and in 0.23)."""

    def required_blocks(
        self, request: Request, chunk_blocks: int, block_size: int, *, anything_running: bool
    ) -> int:
        """Free blocks the engine requires, at its admission check, to admit the waiting
        ``request`` with a first chunk needing ``chunk_blocks`` (the one definition of the rule:
        the builder, the simulated engine, the vLLM transcription and the adapter's safety net
        all ask here)."""
        needed = chunk_blocks
        if self.full_sequence:
            needed = max(needed, cdiv(request.num_tokens, block_size))
        return needed + (self.watermark_blocks if anything_running else 0)


PER_CHUNK_ADMISSION = AdmissionRule(full_sequence=False)
"""Admit on the first chunk's blocks alone (no real engine does this; kept for comparisons)."""
VLLM_ADMISSION = AdmissionRule(full_sequence=True)
"""vLLM 0.23 / 0.33 defaults: whole current sequence must fit, no watermark."""


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Per-step limits of one engine instance (vLLM's names)."""

    token_budget: int
    """``max_num_batched_tokens``: tokens computed in one step, all requests together."""
    max_num_seqs: int
    """Requests holding KV (running) after the step."""
    block_size: int
    """Tokens per KV block."""
    num_free_blocks: int
    """Free KV blocks before this step's allocations."""
    admission: AdmissionRule = PER_CHUNK_ADMISSION
    """The engine's admission rule (executors pass theirs; see the module docstring)."""


@dataclass(slots=True)
class SchedulerInput:
    now: float
    running: list[Request]
    waiting: list[Request]
    limits: EngineLimits


@dataclass(slots=True)
class StepPlan:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    """``(request, tokens)`` in batch order; each request at most once, tokens >= 1."""
    preempted: list[Request] = field(default_factory=list)
    """Running requests whose KV is freed this step (they recompute later)."""
    time_budget_s: float | None = None
    """The policy's latency budget for this step, if it uses one (exported as a metric)."""
    num_urgent: int = 0
    """SlideBatching's URGENT count (0 for other policies); exported as a metric."""
    repeatable: bool = False
    """The policy asserts that, if no request arrives, finishes or changes phase, it would plan
    the same all-decode batch again on the next steps. Executors may then fast-forward several
    decode steps without calling the policy (the simulator does, to run hour-long traces)."""
    hopeless: list[tuple[str, str]] = field(default_factory=list)
    """``(request_id, reason)`` of waiting requests the policy judges unable to meet their SLO
    (GMAX's drop rule). Advisory: the policy demotes them (served only with spare capacity); an
    executor may instead abort them and return the reason to the client."""

    @property
    def num_tokens(self) -> int:
        return sum(tokens for _, tokens in self.scheduled)


class SchedulingPolicy(ABC):
    """Base class of every engine-level policy."""

    name: ClassVar[str]
    uses_oracle_length: ClassVar[bool] = False
    """True when the policy reads ``Request.true_output_tokens`` (simulation-only baselines)."""
    default_params: ClassVar[Any] = NO_PARAMS
    """The parameters of a policy built without any: a frozen dataclass, every field defaulted
    (:mod:`priority.policies.params`). The registry validates operator JSON against its type, and
    a variant is its family's class with other defaults here."""

    def __init__(self, estimator: BatchLatencyEstimator, params: Any = None) -> None:
        self.estimator = estimator
        if params is None:
            params = self.default_params
        elif type(params) is not type(self.default_params):
            raise TypeError(
                f"{self.name} takes {type(self.default_params).__name__}, "
                f"not {type(params).__name__}"
            )
        self.params = params

    @abstractmethod
    def schedule(self, inp: SchedulerInput) -> StepPlan:
        """Plan one engine step."""

    def on_step_end(self, plan: StepPlan, now: float) -> None:  # noqa: B027 - optional hook
        """Called after the planned step executed and tokens were emitted (stateful policies)."""


class BatchBuilder:
    """Accumulates one step's batch while enforcing the engine's limits.

    Every policy fills its batch through :meth:`add`, so token budget, max sequences, KV blocks
    and (when given) the latency budget are enforced in one place.
    """

    __slots__ = (
        "_scheduled_ids",
        "admission",
        "admission_slack",
        "block_size",
        "estimator",
        "free_blocks",
        "max_num_seqs",
        "min_prefill_chunk",
        "num_seqs",
        "plan",
        "time_budget_s",
        "time_used_s",
        "tokens_left",
    )

    def __init__(
        self,
        inp: SchedulerInput,
        *,
        estimator: BatchLatencyEstimator | None = None,
        time_budget_s: float | None = None,
        min_prefill_chunk: int = 1,
    ) -> None:
        limits = inp.limits
        self.tokens_left = limits.token_budget
        self.max_num_seqs = limits.max_num_seqs
        self.num_seqs = len(inp.running)
        self.block_size = limits.block_size
        self.free_blocks = limits.num_free_blocks
        self.admission = limits.admission
        self.admission_slack: int | None = None
        """Blocks running requests may still take without failing an earlier admission's check
        (None: nothing admitted yet)."""
        self.estimator = estimator
        self.time_budget_s = time_budget_s
        self.time_used_s = estimator.t_c if (estimator is not None and time_budget_s) else 0.0
        # a minimum chunk above the token budget could never be met: the engine would stall
        self.min_prefill_chunk = min(min_prefill_chunk, limits.token_budget)
        self.plan = StepPlan(time_budget_s=time_budget_s)
        self._scheduled_ids: set[str] = set()

    # ---- queries --------------------------------------------------------------------------

    def is_scheduled(self, request: Request) -> bool:
        return request.request_id in self._scheduled_ids

    @property
    def full(self) -> bool:
        """No more tokens (or time) can be added to this step."""
        if self.tokens_left <= 0:
            return True
        return self.time_budget_s is not None and self.time_used_s >= self.time_budget_s

    def blocks_needed(self, request: Request, tokens: int) -> int:
        total = cdiv(request.num_computed_tokens + tokens, self.block_size)
        return max(0, total - request.num_kv_blocks)

    @property
    def usable_blocks(self) -> int:
        """Free blocks a *running* request may take now (see :attr:`admission_slack`)."""
        if self.admission_slack is None:
            return self.free_blocks
        return min(self.free_blocks, self.admission_slack)

    def admission_blocks(self, request: Request, chunk_blocks: int = 0) -> int:
        """Free blocks the engine requires to admit the waiting ``request`` now."""
        return self.admission.required_blocks(
            request, chunk_blocks, self.block_size, anything_running=self.num_seqs > 0
        )

    def kv_fit_tokens(self, request: Request) -> int:
        """How many more tokens' KV fit in the request's blocks plus the blocks it may take
        (a waiting request: 0 unless the admission rule lets it in)."""
        if request.num_kv_blocks == 0:
            if self.admission_blocks(request) > self.free_blocks:
                return 0
            # its chunk may take what the watermark leaves free
            free = self.free_blocks - (self.admission.watermark_blocks if self.num_seqs else 0)
        else:
            free = self.usable_blocks
        capacity = (request.num_kv_blocks + free) * self.block_size
        return capacity - request.num_computed_tokens

    def grantable(self, request: Request, want: int) -> int:
        """Tokens :meth:`add` would grant now (0 if the request cannot join the batch)."""
        if request.request_id in self._scheduled_ids or want <= 0:
            return 0
        if request.num_kv_blocks == 0 and self.num_seqs >= self.max_num_seqs:
            return 0
        return self._step_fit(request, min(want, self.kv_fit_tokens(request)))

    def step_fit_tokens(self, request: Request, want: int | None = None) -> int:
        """Tokens of ``request`` (up to ``want``, default all it needs) the step could still
        take were KV no limit: the token and latency budgets and the smallest chunk. Freeing KV
        for it (a preemption) can win no more than this."""
        return self._step_fit(request, request.num_uncomputed_tokens if want is None else want)

    def _step_fit(self, request: Request, want: int) -> int:
        tokens = min(want, self.tokens_left, request.num_uncomputed_tokens)
        if tokens <= 0:
            return 0
        if self.time_budget_s is not None and self.estimator is not None:
            left = self.time_budget_s - self.time_used_s
            if tokens == 1 and request.num_uncomputed_tokens == 1:
                if self.estimator.decode_time(request.num_computed_tokens) > left:
                    return 0
            else:
                tokens = self.estimator.max_chunk(request.num_computed_tokens, left, tokens)
        if tokens < request.num_uncomputed_tokens and tokens < self.smallest_chunk:
            return 0  # a uselessly small chunk that does not finish the prefill
        return tokens

    @property
    def smallest_chunk(self) -> int:
        """The smallest prefill chunk that may not finish a prompt: ``min_prefill_chunk``, but
        never more than the step has left (a prompt may start beside the decodes already placed
        in a small budget, as vLLM's own scheduler lets it)."""
        return min(self.min_prefill_chunk, self.tokens_left)

    # ---- mutations ------------------------------------------------------------------------

    def add(self, request: Request, want: int | None = None) -> int:
        """Schedule up to ``want`` tokens (default: all it needs); returns tokens granted."""
        if want is None:
            want = request.num_uncomputed_tokens
        tokens = self.grantable(request, want)
        if tokens <= 0:
            return 0
        self._commit(request, tokens)
        return tokens

    def add_exact(self, request: Request, tokens: int) -> int:
        """Schedule exactly ``tokens`` ignoring the latency budget (still checks hard limits).

        Used when a policy insists on a minimum step (e.g. one decode token) regardless of time.
        """
        saved = self.time_budget_s
        self.time_budget_s = None
        try:
            granted = self.grantable(request, tokens)
        finally:
            self.time_budget_s = saved
        if granted <= 0:
            return 0
        self._commit(request, granted)
        return granted

    def add_decode_run(
        self,
        requests: Sequence[Request],
        decode_s: npt.NDArray[np.float64],
        new_block: npt.NDArray[np.bool_],
    ) -> int:
        """Admit the longest prefix of ``requests`` (running, decoding, not yet scheduled) that
        fits the token, KV and time limits, in one vectorized step; returns how many.

        ``decode_s`` is each request's decode-step time and ``new_block`` whether its next token
        opens a new KV block. A long batch of decodes is the common case, and checking each one
        through :meth:`add` dominated the decision time.
        """
        n = min(len(requests), self.tokens_left)
        if self._scheduled_ids:  # stop before anything already scheduled or preempted
            taken = self._scheduled_ids
            n = next((i for i, r in enumerate(requests[:n]) if r.request_id in taken), n)
        # stop before a waiting request (a one-token prompt looks like a decode): admitting it
        # needs a seat and the admission rule, which only add() checks
        n = next((i for i, r in enumerate(requests[:n]) if r.num_kv_blocks == 0), n)
        if n <= 0:
            return 0
        blocks = np.cumsum(new_block[:n])
        fits = blocks <= self.usable_blocks
        if self.time_budget_s is not None:
            fits &= self.time_used_s + np.cumsum(decode_s[:n]) <= self.time_budget_s
        count = n if fits.all() else int(np.argmin(fits))
        if count == 0:
            return 0
        self._take_blocks(int(blocks[count - 1]), running=True)
        self.tokens_left -= count
        if self.time_budget_s is not None:
            self.time_used_s += float(decode_s[:count].sum())
        scheduled = self.plan.scheduled
        for request in requests[:count]:
            scheduled.append((request, 1))
        self._scheduled_ids.update(r.request_id for r in requests[:count])
        return count

    def _take_blocks(self, blocks: int, *, running: bool) -> None:
        self.free_blocks -= blocks
        if running and self.admission_slack is not None:
            self.admission_slack -= blocks

    def _commit(self, request: Request, tokens: int) -> None:
        blocks = self.blocks_needed(request, tokens)
        if request.num_kv_blocks == 0:
            # the engine checks this admission after every running allocation of the step
            slack = self.free_blocks - self.admission_blocks(request, blocks)
            if self.admission_slack is None or slack < self.admission_slack:
                self.admission_slack = slack
            self._take_blocks(blocks, running=False)
            self.num_seqs += 1
        else:
            self._take_blocks(blocks, running=True)
        self.tokens_left -= tokens
        if self.estimator is not None and self.time_budget_s is not None:
            self.time_used_s += self.estimator.request_time(tokens, request.num_computed_tokens)
        self._scheduled_ids.add(request.request_id)
        self.plan.scheduled.append((request, tokens))

    def preempt(self, request: Request) -> None:
        """Free a running, not-yet-scheduled request's KV (recompute preemption)."""
        if request.num_kv_blocks == 0:
            raise ValueError(f"{request.request_id} holds no KV and cannot be preempted")
        if request.request_id in self._scheduled_ids:
            raise ValueError(f"{request.request_id} is already scheduled this step")
        # preemptions happen before any allocation of the step: every admission sees them
        self.free_blocks += request.num_kv_blocks
        if self.admission_slack is not None:
            self.admission_slack += request.num_kv_blocks
        self.num_seqs -= 1
        self._scheduled_ids.add(request.request_id)  # never schedule it again this step
        self.plan.preempted.append(request)

    def add_preempting(self, request: Request, want: int | None, victims: Iterable[Request]) -> int:
        """:meth:`add`, preempting ``victims`` (lowest priority first) while KV is what blocks it.

        Victims already scheduled (or the request itself) are skipped; preemption stops as soon
        as the request fits, so no more KV is freed than needed. ``victims`` is consumed lazily,
        one victim at a time, so a policy may share one iterator across calls.
        """
        if want is None:
            want = request.num_uncomputed_tokens
        granted = self.add(request, want)
        if granted > 0:
            return granted
        needed_tokens = min(want, request.num_uncomputed_tokens, self.tokens_left)
        if needed_tokens <= 0:
            return 0
        pending = iter(victims)
        while self.kv_fit_tokens(request) < needed_tokens:
            victim = next(pending, None)
            if victim is None:
                break
            if victim is request or victim.num_kv_blocks == 0 or self.is_scheduled(victim):
                continue
            self.preempt(victim)
        return self.add(request, want)
