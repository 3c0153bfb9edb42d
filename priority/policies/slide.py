"""SlideBatching — PROSERVE Algorithm 1 (PD co-located, and the PD-disaggregated prefill variant).

Per step, for every request that needs compute (running or waiting):

* ``exec``    = T~_pd(r): estimated time of its next piece of work (one decode step, or its whole
  remaining prefill), without the per-batch overhead t_c;
* ``remain``  = due time of its next output token − now (TDG deadlines, Eq. 3);
* ``density`` = w_r(next token) / exec.

The latency budget is ``t_budget = max(t_min, η)`` where ``t_min`` is the smallest ``remain``
among requests that can still make their deadline in this batch (xLLM's refinement: hopeless
requests must not shrink everybody's batch). A request is URGENT when ``remain < γ·φ``; URGENT
requests go first by density (descending), NORMAL ones by remain (ascending). The batch is then
filled in that order until the latency budget is spent, chunking the last prefill to fit
(GETMAXCHUNK, in closed form through the estimator). Load-judgment functions:

* ``φ_a`` (Eq. 8, PROSERVE's reported setting): ``t_budget/(t_budget−t_c) · Σ_Q exec``;
* ``φ_c`` (Eq. 9): the same sum, but only up to r's position in the remain-sorted queue;
* ``φ_p`` (PD-disaggregated prefill instances): ``Σ_Q exec + |Q|·t_c``.

Choices the paper leaves open (values from JD's xLLM where it has them):

* ``γ = 1.0``; ``η = 0.65 × the smallest TPOT SLO`` in the queue;
* when no request can make its deadline, ``t_budget = max(η, largest TPOT SLO)``, the upper end
  of the range the paper says the budget moves in; and the budget always leaves room for the
  cheapest piece of work after the batch overhead ``t_c`` (else no batch could form);
* prefill chunks shorter than ``min_chunk_tokens`` (50) are not scheduled unless they finish
  the prompt;
* starvation prevention: of the requests overdue by more than ``starve_threshold`` × their
  SLO unit (TTFT before the first token, TPOT after), the ``max_starved_per_step`` (1) most
  overdue go right after the URGENT decodes, and a starved prefill takes at most
  ``starve_share`` (10%) of the step's latency budget. xLLM promotes *every* such request
  first; under overload that is nearly all of them, which turns the order into
  most-overdue-first (EDF) — the collapse PROSERVE §3.2 describes (measured on one A100 at 2x
  load: TDG ratio 0.27 instead of 0.97). The bounded trickle still guarantees that every
  request is eventually served, at a bounded cost to the gain;
* KV, as the real engine pays for it. vLLM admits a waiting request only when its whole
  current sequence fits, and a preempted request loses all its KV and resumes only when prompt
  *and* output fit again (whole-sequence recompute). Algorithm 1 as published preempts the tail
  of the order for anyone short of blocks, new prompts included; in vLLM's rules that
  thrashes (measured in the simulator with vLLM's rules, azure_conv, one A100, 1.5x load,
  8,192 blocks: 620 preemptions and TDG 0.803, below sarathi-priority's 0.834). So here:
  only a *running* request short of blocks preempts (from the tail of the order); a waiting
  request is admitted only if its whole sequence fits and leaves ``kv_reserve_tokens`` (32) of
  growth for every running request (0 preemptions, TDG 0.948 in the same cell).
  ``preempt_for_admission=True`` and ``kv_reserve_tokens=0`` restore the published behaviour.
  In a real engine with asynchronous scheduling a running request may have all its remaining
  tokens in flight (nothing to compute this step): it is never a victim, since it finishes or
  decodes on its own and preempting it would throw that work away;
* if nothing fits the budget, the head of the order still gets one minimal piece of work, so the
  engine never idles with work queued.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar, Literal, overload

import numpy as np
import numpy.typing as npt

from priority.estimator import BatchLatencyEstimator
from priority.gain import GainWeights
from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan, cdiv
from priority.policies.columns import ARRIVAL, DEADLINE, PROMPT, TPOT, TTFT, WEIGHT, RequestColumns
from priority.request import Request

LoadJudgment = Literal["a", "c", "p"]
_kv_blocks = attrgetter("num_kv_blocks")


def _floats() -> npt.NDArray[np.float64]:
    return np.empty(0)


def _ints() -> npt.NDArray[np.int64]:
    return np.empty(0, dtype=np.int64)


class _Permuted(Sequence[Request]):
    """``requests`` in the order ``index``, without building the list: a step usually reads only
    the head of the order (what fits) and, on KV shortage, a few victims from the tail."""

    __slots__ = ("_index", "_requests")

    def __init__(self, requests: list[Request], index: npt.NDArray[np.int64]) -> None:
        self._requests = requests
        self._index = index

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, i: int) -> Request: ...
    @overload
    def __getitem__(self, i: slice) -> list[Request]: ...
    def __getitem__(self, i: int | slice) -> Request | list[Request]:
        if isinstance(i, slice):
            return [self._requests[j] for j in self._index[i].tolist()]
        return self._requests[self._index[i]]

    def __iter__(self) -> Iterator[Request]:
        return map(self._requests.__getitem__, self._index.tolist())


class _Heads:
    """The fill loop's per-position arrays as Python lists, converted only as far as the loop
    reaches: a step usually reads a few positions of thousands (converting every array whole
    cost a fifth of a 4,096-waiting decision), while a loop walking far (KV-blocked admissions)
    still reads plain lists."""

    __slots__ = ("_arrays", "covered", "lists")

    def __init__(self, arrays: Sequence[npt.NDArray[np.generic]], first: int = 256) -> None:
        self._arrays = arrays
        self.covered = min(first, len(arrays[0]))
        self.lists: list[list[Any]] = [a[: self.covered].tolist() for a in arrays]

    def cover(self, k: int) -> int:
        """Extend every list (in place) past position ``k``; returns how far they now reach."""
        start = self.covered
        self.covered = min(len(self._arrays[0]), max(2 * start, k + 1))
        for values, array in zip(self.lists, self._arrays, strict=True):
            values.extend(array[start : self.covered].tolist())
        return self.covered


def _lexsort(key: npt.NDArray[np.float64], group: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``np.lexsort((key, group))`` (``group`` small and >= 0), through two unstable sorts.

    A stable float sort of a fresh queue took ~0.19 ms at 4,352 requests (in the decision: the
    same sort repeated on one array looks 4x faster, trained branch predictors), numpy's default
    (vectorized) sort ~0.03 ms. Ties (equal keys are common: equal prompts and weights) must still
    break by position, as lexsort breaks them: rank the keys (equal keys, equal rank), then sort
    the unique integers ``(group, rank, position)``. A NaN (not expected) takes lexsort's path.
    """
    n = len(key)
    if n < 2 or np.isnan(key).any():
        return np.lexsort((key, group))
    order = np.argsort(key)
    ordered = key[order]
    dense = np.empty(n, dtype=np.int64)
    dense[0] = 0
    np.cumsum(ordered[1:] != ordered[:-1], out=dense[1:])
    rank = np.empty(n, dtype=np.int64)
    rank[order] = dense
    return np.argsort((group * n + rank) * n + np.arange(n))


def _first_at_or_after(
    mask: npt.NDArray[np.bool_], position: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """For each position k, the first position >= k where ``mask`` holds (``len`` if none):
    one running minimum from the tail, cheaper than a binary search per position."""
    marked = np.where(mask, position, len(position))
    return np.minimum.accumulate(marked[::-1])[::-1]


@dataclass(frozen=True, slots=True)
class Ranking:
    """One step's view of the queue: Algorithm 1's order and what the fill loop needs (arrays in
    ``ordered`` order; the loop converts what it reads through :class:`_Heads`)."""

    ordered: Sequence[Request]
    budget_s: float
    num_urgent: int
    starved: frozenset[str]
    piece_s: npt.NDArray[np.float64] = field(default_factory=_floats)
    """Cost of the smallest piece of work of each request."""
    tail_min_piece_s: npt.NDArray[np.float64] = field(default_factory=_floats)
    """``min(piece_s[k:])``: when less time is left, nothing further can fit."""
    decode_run_end: npt.NDArray[np.int64] = field(default_factory=_ints)
    """For a decode at position k, the end (exclusive) of the run of decodes starting there."""
    new_block: npt.NDArray[np.bool_] = field(default_factory=lambda: np.empty(0, dtype=bool))
    next_running: npt.NDArray[np.int64] = field(default_factory=_ints)
    """For position k, the first position >= k holding a running request (len if none): once
    the seats are full, the fill loop jumps over the waiting requests in between."""
    running_computed: npt.NDArray[np.int64] = field(default_factory=_ints)
    """``num_computed_tokens`` of ``inp.running`` in input order, as read for the ranking."""


@dataclass(frozen=True, slots=True)
class SlideParams:
    """SlideBatching's knobs (the module docstring says where each default comes from)."""

    gain_weights: GainWeights = field(default_factory=GainWeights)
    """w_p : w_d, the worth of a first token against a decode token."""
    gamma: float = 1.0
    """γ: a request is URGENT when its remaining time is below γ·φ."""
    eta_factor: float = 0.65
    """η as a share of the smallest TPOT SLO in the queue."""
    eta_s: float | None = None
    """η in seconds (None: ``eta_factor`` × the smallest TPOT)."""
    phi: LoadJudgment = "a"
    """The load-judgment function: φ_a (Eq. 8), φ_c (Eq. 9) or φ_p (PD prefill instances)."""
    min_chunk_tokens: int = 50
    starvation_prevention: bool = True
    starve_threshold: float = 1.0
    max_starved_per_step: int = 1
    starve_share: float = 0.1
    kv_reserve_tokens: int = 32
    preempt_for_admission: bool = False

    def __post_init__(self) -> None:
        if self.gamma <= 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}")
        if self.phi not in ("a", "c", "p"):
            raise ValueError(f"phi must be 'a', 'c' or 'p', got {self.phi!r}")
        if self.max_starved_per_step < 0:
            raise ValueError(f"max_starved_per_step must be >= 0, got {self.max_starved_per_step}")
        if not 0.0 < self.starve_share <= 1.0:
            raise ValueError(f"starve_share must be in (0, 1], got {self.starve_share}")
        if self.kv_reserve_tokens < 0:
            raise ValueError(f"kv_reserve_tokens must be >= 0, got {self.kv_reserve_tokens}")


class SlideBatchingPolicy(SchedulingPolicy):
    name: ClassVar[str] = "slide"
    default_params: ClassVar[SlideParams] = SlideParams()
    params: SlideParams

    def __init__(self, estimator: BatchLatencyEstimator, params: SlideParams | None = None) -> None:
        super().__init__(estimator, params)
        self._columns = RequestColumns()

    # ---- Algorithm 1, lines 1-13 -----------------------------------------------------------

    def order(self, inp: SchedulerInput) -> tuple[list[Request], float, int]:
        """The step's admission order, its latency budget and the number of URGENT requests."""
        ranking = self.rank(inp)
        return list(ranking.ordered), ranking.budget_s, ranking.num_urgent

    def rank(self, inp: SchedulerInput) -> Ranking:
        requests = inp.running + inp.waiting  # a running request always needs compute
        if not requests:
            return Ranking([], self.params.eta_s or 0.0, 0, frozenset())
        static, computed, outputs = self._columns.gather(requests)
        arrival, ttft, tpot = static[ARRIVAL], static[TTFT], static[TPOT]
        deadline, weight = static[DEADLINE], static[WEIGHT]
        num_tokens = static[PROMPT].astype(np.int64) + outputs
        est = self.estimator
        t_c = est.t_c

        exec_s = est.request_times(num_tokens - computed, computed)
        due = np.minimum(ttft + outputs * tpot, deadline)
        remain = arrival + due - inp.now
        first = outputs == 0
        gw = self.params.gain_weights
        value = weight * np.where(first, gw.first_token, gw.decode_token)
        density = value / np.maximum(exec_s, 1e-12)

        tpot_set = tpot[tpot > 0]
        if self.params.eta_s is not None:
            eta = self.params.eta_s
        elif tpot_set.size:
            eta = self.params.eta_factor * float(tpot_set.min())
        else:
            eta = t_c * 2.0
        feasible = remain >= exec_s + t_c
        if feasible.any():
            budget = max(float(remain[feasible].min()), eta)
        else:
            budget = max(eta, float(tpot_set.max()) if tpot_set.size else eta)
        # A batch always costs t_c: a budget at or below it could hold no work at all.
        budget = max(budget, t_c + max(float(exec_s.min()), 1e-9))

        phi = self._load_judgment(exec_s, remain, budget, t_c)
        urgent = remain < self.params.gamma * phi
        starved = np.zeros(len(requests), dtype=bool)
        if self.params.starvation_prevention and self.params.max_starved_per_step:
            unit = np.where(first | (tpot <= 0), np.minimum(ttft, deadline), tpot)
            overdue = np.flatnonzero(-remain > self.params.starve_threshold * unit)
            if overdue.size > self.params.max_starved_per_step:
                most = np.argpartition(remain[overdue], self.params.max_starved_per_step - 1)
                overdue = overdue[most[: self.params.max_starved_per_step]]
            starved[overdue] = True
        starved_ids = frozenset(requests[int(i)].request_id for i in np.flatnonzero(starved))
        urgent |= starved

        # Algorithm 1: URGENT (density desc), then NORMAL (remain asc). With a starved request,
        # xLLM's order: URGENT decodes, the starved (most overdue first), the other URGENT, so
        # promoting a starved prefill never stalls the streams already running.
        if starved.any():
            decode = ~first & (computed == num_tokens - 1)
            group = np.where(
                urgent & decode & ~starved, 0, np.where(starved, 1, np.where(urgent, 2, 3))
            )
        else:
            group = np.where(urgent, 0, 3)
        key = np.where(starved, remain, np.where(urgent, -density, remain))
        idx = _lexsort(key, group)
        # The cheapest piece of work each request could get (one decode step, or a minimum
        # chunk), and its running minimum from the tail: the fill loop skips what cannot fit and
        # stops once nothing left in the order can, instead of probing every queued request.
        uncomputed = num_tokens - computed
        smallest = np.minimum(
            uncomputed, min(self.params.min_chunk_tokens, inp.limits.token_budget)
        )
        piece = est.request_times(np.maximum(smallest, 1), computed)[idx]
        is_decode = (uncomputed == 1)[idx]
        n = len(idx)
        position = np.arange(n)
        run_end = position
        if is_decode.any():
            # end of each run of consecutive decodes: the first non-decode position after k
            run_end = np.where(is_decode, _first_at_or_after(~is_decode, position), position)
        block_size = inp.limits.block_size
        return Ranking(
            ordered=_Permuted(requests, idx),
            budget_s=budget,
            num_urgent=int(np.count_nonzero(urgent)),
            starved=starved_ids,
            piece_s=piece,
            tail_min_piece_s=np.minimum.accumulate(piece[::-1])[::-1],
            decode_run_end=run_end,
            new_block=(computed[idx] % block_size == 0) & is_decode,
            next_running=_first_at_or_after(idx < len(inp.running), position),
            running_computed=computed[: len(inp.running)],
        )

    def _load_judgment(
        self,
        exec_s: npt.NDArray[np.float64],
        remain: npt.NDArray[np.float64],
        budget: float,
        t_c: float,
    ) -> npt.NDArray[np.float64] | float:
        if self.params.phi == "p":
            return float(exec_s.sum()) + exec_s.size * t_c
        if budget <= t_c:
            return math.inf  # no room for work in a batch: everything is at risk
        scale = budget / (budget - t_c)
        if self.params.phi == "a":
            return scale * float(exec_s.sum())
        by_remain = np.argsort(remain, kind="stable")
        cumulative = np.empty_like(exec_s)
        cumulative[by_remain] = np.cumsum(exec_s[by_remain])
        return scale * cumulative

    # ---- Algorithm 1, lines 14-19 ----------------------------------------------------------

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        ranking = self.rank(inp)
        ordered, budget = ranking.ordered, ranking.budget_s
        builder = BatchBuilder(
            inp,
            estimator=self.estimator,
            time_budget_s=budget,
            min_prefill_chunk=self.params.min_chunk_tokens,
        )
        builder.plan.num_urgent = ranking.num_urgent
        if not ordered:
            return builder.plan
        # a request with nothing to compute this step (its remaining tokens are in flight, only
        # in a real engine) finishes or decodes on its own: preempting it would throw that away
        victims = (
            r for r in reversed(ordered) if r.num_kv_blocks > 0 and r.num_uncomputed_tokens > 0
        )
        reserve = self._kv_reserve(inp, ranking.running_computed)
        block_size = inp.limits.block_size
        starved_cap = self.params.starve_share * budget
        heads = _Heads(
            (
                ranking.piece_s,
                ranking.tail_min_piece_s,
                ranking.decode_run_end,
                ranking.next_running,
            )
        )
        piece, tail_min, run_end, next_running = heads.lists
        covered = heads.covered
        skip_waiting = not self.params.preempt_for_admission
        ranked_chunk = min(self.params.min_chunk_tokens, inp.limits.token_budget)
        k = 0
        while k < len(ordered):
            if k >= covered:
                covered = heads.cover(k)
            left = budget - builder.time_used_s
            # the ranking's pieces assume a whole minimum chunk fits the step's tokens; once
            # fewer are left, the smallest piece is smaller and only the builder can tell
            exact = builder.smallest_chunk >= ranked_chunk
            if builder.full or (exact and left < tail_min[k]):
                break
            if skip_waiting and builder.num_seqs >= builder.max_num_seqs and next_running[k] > k:
                k = next_running[k]  # no seat for a waiting request: on to the next running one
                continue
            request = ordered[k]
            if run_end[k] > k + 1 and request.request_id not in ranking.starved:
                # a run of decodes: admit the longest prefix that fits in one go
                end = run_end[k]
                added = builder.add_decode_run(
                    ordered[k:end], ranking.piece_s[k:end], ranking.new_block[k:end]
                )
                if added:
                    k += added
                    continue
            k += 1
            if exact and piece[k - 1] > left:
                continue
            want = None
            if request.request_id in ranking.starved and request.num_uncomputed_tokens > 1:
                # the starvation guard may take only a bounded share of the step
                want = max(
                    self.params.min_chunk_tokens,
                    self.estimator.max_chunk(
                        request.num_computed_tokens, starved_cap, request.num_uncomputed_tokens
                    ),
                )
            if request.num_kv_blocks > 0 or self.params.preempt_for_admission:
                builder.add_preempting(request, want, victims)
            elif builder.free_blocks - cdiv(request.num_tokens, block_size) >= reserve:
                # admitted only if its whole sequence fits beside the running requests' growth
                builder.add(request, want)
        if not builder.plan.scheduled:
            self._ensure_progress(builder, ordered, victims)
        plan = builder.plan
        plan.repeatable = (
            not inp.waiting
            and not plan.preempted
            and len(plan.scheduled) == len(inp.running)
            and all(tokens == 1 and r.num_uncomputed_tokens == 1 for r, tokens in plan.scheduled)
            and builder.time_used_s <= 0.9 * budget
        )
        return plan

    def _kv_reserve(self, inp: SchedulerInput, computed: npt.NDArray[np.int64]) -> int:
        """KV blocks the running requests (``computed``: their ``num_computed_tokens``) need for
        their next ``kv_reserve_tokens`` tokens."""
        if not self.params.kv_reserve_tokens or not inp.running:
            return 0
        held = np.fromiter(map(_kv_blocks, inp.running), np.int64, len(inp.running))
        bs = inp.limits.block_size
        need = -(-(computed + self.params.kv_reserve_tokens) // bs) - held
        return int(need.clip(min=0).sum())

    def _ensure_progress(
        self, builder: BatchBuilder, ordered: Sequence[Request], victims: Iterator[Request]
    ) -> None:
        """Give the first request that can run one minimal piece of work, ignoring the budget."""
        for request in ordered:
            want = (
                1
                if request.num_uncomputed_tokens == 1
                else max(1, min(self.params.min_chunk_tokens, request.num_uncomputed_tokens))
            )
            builder.time_budget_s = None
            granted = builder.add_preempting(request, want, victims)
            if granted:
                return
