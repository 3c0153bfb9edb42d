"""Shared machinery of the length-aware goodput policies (GMAX, Tempo; JITServe / Tempo papers).

Both rank requests by the goodput they can still earn per unit of generation time, where the
time comes from a *length bound* (:meth:`priority.request.Request.length_bound`, the conditional
quantile of the output length given the tokens generated so far) and the shared batch latency
estimator. Computing that for a thousand queued requests per step must stay far below a step
time, so:

* static per-request attributes (arrival, SLO, weight, prompt, kind, tenant) are stored once in a
  numpy table (:class:`KindColumns`) and gathered with one fancy index per step;
* the length bound is cached per request and refreshed only every ``refine_every`` generated
  tokens, or when generation overruns it (JITServe: "the analyzer periodically re-invokes the
  model"); between refreshes the cached bound stays valid because it is never below
  ``generated + 1`` at the time it is used (the remaining length is floored at 1);
* batches of decodes enter the plan through :meth:`BatchBuilder.add_decode_run`.

The per-step view (:class:`GoodputView`) holds, for the running then the waiting requests:

* ``remaining`` — output tokens still to come under the bound (≥ 1);
* ``need_s`` — estimated time to finish: the remaining prefill (estimator) plus ``remaining``
  engine steps of the current batch's step time (estimator, not a moving average);
* ``left_s`` — time left until the request's end-to-end due time (the deadline for deadline,
  compound and best-effort kinds; the due time of the bound-th token for a streaming request);
* ``value`` — the goodput still at stake (JITServe's ``R = w_in·L_in + w_out·L_out`` for the
  end-to-end kinds, the remaining on-time tokens for a streaming request), times the tier weight;
* ``cost_s`` — the generation time the request occupies: its prefill plus its share of
  ``remaining`` decode steps;
* ``likely_need_s`` / ``likely_left_s`` / ``likely_cost_s`` — the same three under the *likely*
  length (the conditional median by default, :attr:`LengthAwarePolicyMixin.likely_quantile`)
  instead of the bound. The bound is an upper quantile: right for deciding *when a request must
  start* (start late only if even a long answer still makes it), wrong as a point estimate —
  on the predictor's measured error it is several times the median, so a policy that ranks or
  gives up on requests by it treats most of them as far longer than they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from priority.estimator import BatchLatencyEstimator
from priority.gain import DEFAULT_BEST_EFFORT_DEADLINE_S, GoodputWeights
from priority.policies.base import BatchBuilder, SchedulerInput
from priority.request import REQUEST_KINDS, Request

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

PRICING_WEIGHTS = GoodputWeights(input_token=1.0, output_token=2.0)
"""w_in : w_out = 1 : 2, JITServe/Tempo's pricing ratio (the artifact's 1 : 8 over-weights
output; the simulator's token-goodput metric counts output only, w_in = 0)."""


@dataclass(frozen=True, slots=True)
class LengthAwareParams:
    """The parameters GMAX and Tempo share (the length bound and the step's bandwidth)."""

    quantile: float = 0.95
    """Level of the length bound (JITServe 0.95)."""
    refine_every: int = 16
    """Generated tokens between bound refreshes."""
    goodput_weights: GoodputWeights = PRICING_WEIGHTS
    """What a request's tokens are worth (w_in : w_out)."""
    best_effort_deadline_s: float = DEFAULT_BEST_EFFORT_DEADLINE_S
    tpot_share: float = 0.9
    """A step lasts at most this share of the tightest running stream's TPOT (estimator)."""
    min_chunk_tokens: int = 64
    """Smallest prefill chunk that does not end a prompt."""

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile must be inside (0, 1), got {self.quantile}")
        if self.refine_every < 1:
            raise ValueError(f"refine_every must be >= 1, got {self.refine_every}")
        if not (self.best_effort_deadline_s > 0 and math.isfinite(self.best_effort_deadline_s)):
            raise ValueError("best_effort_deadline_s must be a positive number")
        if not 0.0 < self.tpot_share <= 1.0 or self.min_chunk_tokens < 1:
            raise ValueError("tpot_share must be in (0, 1], min_chunk_tokens >= 1")


ARRIVAL, TTFT, TPOT, DEADLINE, WEIGHT, PROMPT, KIND, TENANT, BOUND, BOUND_AT, LIKELY = range(11)
_NUM_COLUMNS = 11
STREAMING_KIND = REQUEST_KINDS.index("latency")
_computed = attrgetter("num_computed_tokens")
_outputs = attrgetter("num_output_tokens")
_request_id = attrgetter("request_id")


class KindColumns:
    """Per-request columns; unset SLO fields are ``inf`` (TTFT, deadline) or 0 (TPOT).

    The deadline column already holds the kind's effective deadline (a best-effort request
    without one gets ``best_effort_deadline_s``); ``TENANT`` indexes :attr:`tenants`.
    ``BOUND``/``BOUND_AT`` cache the length bound and the output count it was computed at;
    ``LIKELY`` the likely length (see :attr:`LengthAwarePolicyMixin.likely_quantile`) refreshed
    with it.
    """

    def __init__(self, best_effort_deadline_s: float, capacity: int = 1024) -> None:
        self.best_effort_deadline_s = best_effort_deadline_s
        self._rows: dict[str, int] = {}
        self._data = np.empty((capacity, _NUM_COLUMNS), dtype=np.float64)
        self.tenants: list[str] = []
        self._tenant_index: dict[str, int] = {}

    def tenant_index(self, tenant: str) -> int:
        index = self._tenant_index.get(tenant)
        if index is None:
            index = self._tenant_index[tenant] = len(self.tenants)
            self.tenants.append(tenant)
        return index

    def _row_of(self, request: Request) -> int:
        row = len(self._rows)
        if row == self._data.shape[0]:
            self._data = np.concatenate([self._data, np.empty_like(self._data)])
        slo = request.slo
        deadline = slo.deadline_s
        if deadline is None and request.kind == "best-effort":
            deadline = self.best_effort_deadline_s
        streaming = slo.is_streaming and request.kind == "latency"
        self._data[row] = (
            request.arrival_s,
            slo.ttft_s if streaming and slo.ttft_s is not None else math.inf,
            slo.tpot_s if streaming and slo.tpot_s is not None else 0.0,
            deadline if deadline is not None else math.inf,
            request.weight,
            request.prompt_tokens,
            REQUEST_KINDS.index(request.kind),
            self.tenant_index(request.tenant),
            -1.0,
            -1.0,
            -1.0,
        )
        self._rows[request.request_id] = row
        return row

    def _compact(self, live: Sequence[Request]) -> None:
        """Forget finished requests once the table is mostly stale."""
        keep = [
            (r.request_id, self._rows[r.request_id]) for r in live if r.request_id in self._rows
        ]
        rows = [row for _, row in keep]
        self._data = np.concatenate([self._data[rows], np.empty((1024, _NUM_COLUMNS))])
        self._rows = {rid: i for i, (rid, _) in enumerate(keep)}

    def rows(self, requests: Sequence[Request]) -> IntArray:
        """Row of every request (new ones are added)."""
        n = len(requests)
        if len(self._rows) > 4 * n + 65536:
            self._compact(requests)
        rows_map = self._rows
        index = np.fromiter(
            map(rows_map.get, map(_request_id, requests), repeat(-1)), dtype=np.int64, count=n
        )
        for i in np.flatnonzero(index < 0).tolist():
            index[i] = self._row_of(requests[i])
        return index

    @property
    def data(self) -> FloatArray:
        return self._data


@dataclass(slots=True)
class GoodputView:
    """One step's per-request quantities, running requests first (see the module docstring)."""

    requests: list[Request]
    num_running: int
    rows: IntArray
    static: FloatArray
    computed: IntArray
    outputs: IntArray
    remaining: FloatArray
    uncomputed: IntArray
    need_s: FloatArray
    left_s: FloatArray
    next_left_s: FloatArray
    """Time left until the next token's due time (streaming), else ``left_s``."""
    next_need_s: FloatArray
    """Estimated time to the next token: remaining prefill plus one step."""
    value: FloatArray
    cost_s: FloatArray
    likely_need_s: FloatArray
    likely_left_s: FloatArray
    likely_cost_s: FloatArray
    step_s: float
    """Estimated wall time of one engine step with the current running batch."""


class LengthAwarePolicyMixin:
    """The columns, the bound cache, :meth:`view` and the step's bandwidth budget
    (:meth:`step_budget`); used by GMAX and Tempo."""

    estimator: BatchLatencyEstimator
    quantile: float
    refine_every: int
    goodput_weights: GoodputWeights
    tpot_share: float
    min_chunk_tokens: int
    likely_quantile: float | None = None
    """Level of the likely length (None: the bound serves as the likely length too)."""
    oracle: bool = False

    def _init_lengths(self, params: LengthAwareParams) -> None:
        self.quantile = params.quantile
        self.refine_every = params.refine_every
        self.goodput_weights = params.goodput_weights
        self.tpot_share = params.tpot_share
        self.min_chunk_tokens = params.min_chunk_tokens
        self.columns = KindColumns(params.best_effort_deadline_s)

    def step_budget(self, view: GoodputView) -> float | None:
        """The step's latency budget — the bandwidth the policy hands out: ``tpot_share`` of the
        tightest TPOT among the running streaming requests (a step longer than that makes every
        stream late), at least what their decodes alone take plus the batch overhead; None
        without running streams. Without it the engine's own limits (seats, KV, tokens) decide
        who runs and a priority order only sequences what would be admitted anyway."""
        tpot = view.static[: view.num_running, TPOT]
        streams = tpot[tpot > 0]
        if not streams.size:
            return None
        floor = view.step_s * 1.05
        return max(self.tpot_share * float(streams.min()), floor)

    def step_builder(self, inp: SchedulerInput, view: GoodputView) -> BatchBuilder:
        """The step's :class:`BatchBuilder` within :meth:`step_budget` and the minimum chunk."""
        return BatchBuilder(
            inp,
            estimator=self.estimator,
            time_budget_s=self.step_budget(view),
            min_prefill_chunk=self.min_chunk_tokens,
        )

    def ensure_progress(
        self, builder: BatchBuilder, running: Sequence[Request], waiting: Sequence[Request]
    ) -> None:
        """Nothing fit the budget: give the first request that can run one minimal piece."""
        builder.time_budget_s = None
        for request in chain(running, waiting):
            if builder.is_scheduled(request):
                continue
            want = 1 if request.num_uncomputed_tokens == 1 else self.min_chunk_tokens
            if builder.add(request, max(1, min(want, request.num_uncomputed_tokens))):
                return

    def _bound_of(self, request: Request, q: float) -> int:
        if self.oracle:
            return max(request.target_output_tokens, request.num_output_tokens + 1)
        return request.length_bound(q)

    def _bounds(
        self, requests: Sequence[Request], rows: IntArray, outputs: IntArray
    ) -> tuple[FloatArray, FloatArray]:
        """Cached (bound, likely length), refreshed together where stale (every
        ``refine_every`` tokens, or when generation reached the likely length)."""
        data = self.columns.data
        bound = data[rows, BOUND]
        likely = data[rows, LIKELY]
        at = data[rows, BOUND_AT]
        stale = (at < 0) | (outputs >= likely) | (outputs - at >= self.refine_every)
        if stale.any():
            q_likely = self.likely_quantile
            for i in np.flatnonzero(stale).tolist():
                request = requests[i]
                value = float(self._bound_of(request, self.quantile))
                guess = value if q_likely is None else float(self._bound_of(request, q_likely))
                bound[i] = data[rows[i], BOUND] = value
                likely[i] = data[rows[i], LIKELY] = min(guess, value)
                data[rows[i], BOUND_AT] = outputs[i]
        return bound, likely

    def view(self, inp: SchedulerInput) -> GoodputView:
        requests = list(chain(inp.running, inp.waiting))
        n = len(requests)
        nr = len(inp.running)
        rows = self.columns.rows(requests)
        static = self.columns.data[rows]
        computed = np.fromiter(map(_computed, requests), dtype=np.int64, count=n)
        outputs = np.fromiter(map(_outputs, requests), dtype=np.int64, count=n)
        bound, likely = self._bounds(requests, rows, outputs)
        est = self.estimator
        prompt = static[:, PROMPT]
        remaining = np.maximum(bound - outputs, 1.0)
        likely_remaining = np.maximum(likely - outputs, 1.0)
        uncomputed = prompt.astype(np.int64) + outputs - computed
        # one step of the current running batch (the shared estimator's Eq. 7)
        run_kv = computed[:nr]
        step_s = est.t_c + float(est.request_times(np.ones(nr, dtype=np.int64), run_kv).sum())
        step_s = max(step_s, est.t_c + est.decode_time(float(prompt.mean()) if n else 0.0))
        prefill = uncomputed > 1
        prefill_s = np.where(prefill, est.request_times(np.maximum(uncomputed, 1), computed), 0.0)
        need = prefill_s + remaining * step_s
        arrival = static[:, ARRIVAL]
        ttft, tpot = static[:, TTFT], static[:, TPOT]
        end_due = arrival + np.fmin(ttft + (outputs + remaining - 1.0) * tpot, static[:, DEADLINE])
        likely_due = arrival + np.fmin(
            ttft + (outputs + likely_remaining - 1.0) * tpot, static[:, DEADLINE]
        )
        next_due = arrival + np.fmin(ttft + outputs * tpot, static[:, DEADLINE])
        now = inp.now
        w = self.goodput_weights
        streaming = static[:, KIND] == STREAMING_KIND
        streaming &= np.isfinite(ttft)
        total = w.input_token * prompt + w.output_token * (outputs + remaining)
        stream_value = w.output_token * remaining + np.where(
            outputs == 0, w.input_token * prompt, 0
        )
        value = static[:, WEIGHT] * np.where(streaming, stream_value, total)
        # a request's share of each step it decodes in: the batch's time split over its seats
        share = step_s / max(nr, 1)
        cost = prefill_s + remaining * share
        likely_cost = prefill_s + likely_remaining * share
        return GoodputView(
            requests=requests,
            num_running=nr,
            rows=rows,
            static=static,
            computed=computed,
            outputs=outputs,
            remaining=remaining,
            uncomputed=uncomputed,
            need_s=need,
            left_s=end_due - now,
            next_left_s=next_due - now,
            next_need_s=prefill_s + step_s,
            value=value,
            cost_s=np.maximum(cost, 1e-9),
            likely_need_s=prefill_s + likely_remaining * step_s,
            likely_left_s=likely_due - now,
            likely_cost_s=np.maximum(likely_cost, 1e-9),
            step_s=step_s,
        )


def decode_runs(is_decode: BoolArray) -> list[int]:
    """For position k of a decode, the end (exclusive) of the run of decodes from k; else k."""
    n = is_decode.size
    positions = np.arange(n)
    if not is_decode.any():
        return positions.tolist()
    non_decode = np.flatnonzero(~is_decode)
    nxt = np.searchsorted(non_decode, positions, side="right")
    ends = np.append(non_decode, n)[np.minimum(nxt, non_decode.size)]
    return np.where(is_decode, ends, positions).tolist()


def continue_decodes(
    builder: BatchBuilder, view: GoodputView, run_idx: IntArray, running: Sequence[Request]
) -> tuple[Iterator[Request], IntArray]:
    """The step's first act in GMAX and Tempo: the running decodes continue, in ``run_idx``
    order (``running`` is that order as requests), through :func:`continue_running`; KV
    shortage preempts from the tail of ``running``. Returns the victims iterator, which the
    rest of the step goes on drawing from, and the running requests still prefilling (their
    indices into ``view``, in order)."""
    victims = (r for r in reversed(running) if r.num_kv_blocks > 0)
    decoding = view.uncomputed[run_idx] <= 1
    first = run_idx[decoding]
    continue_running(
        builder,
        [view.requests[i] for i in first.tolist()],
        view.computed[first],
        view.uncomputed[first],
        victims,
    )
    return victims, run_idx[~decoding]


def continue_running(
    builder: BatchBuilder,
    ordered: Sequence[Request],
    computed: IntArray,
    uncomputed: IntArray,
    victims: Iterator[Request],
) -> None:
    """Give every running request, in ``ordered`` order, the tokens it needs; KV shortage
    preempts ``victims`` (lowest priority first), and a request that still does not fit frees
    its own KV and ends the walk (vLLM's rule). ``computed``/``uncomputed`` follow ``ordered``.
    Runs of decodes go in through :meth:`BatchBuilder.add_decode_run` (one vectorized call).
    With a latency budget on the builder, work stops where the budget ends."""
    n = len(ordered)
    if n == 0:
        return
    is_decode = uncomputed == 1
    new_block = (computed % builder.block_size == 0) & is_decode
    decode_s = (
        builder.estimator.request_times(np.ones(n, dtype=np.int64), computed)
        if builder.estimator is not None and builder.time_budget_s is not None
        else np.zeros(n)
    )
    run_end = decode_runs(is_decode)
    k = 0
    while k < n and builder.tokens_left > 0:
        end = run_end[k]
        if end > k + 1:
            added = builder.add_decode_run(ordered[k:end], decode_s[k:end], new_block[k:end])
            if added:
                k += added
                continue
        k += 1
        if not continue_one(builder, ordered[k - 1], victims):
            return


def continue_one(builder: BatchBuilder, request: Request, victims: Iterator[Request]) -> bool:
    """Give one running request the tokens it needs (:func:`continue_running`'s rule); False
    when the walk over running requests must stop there."""
    if builder.is_scheduled(request) or request.num_uncomputed_tokens <= 0:
        return True
    # what the step's token and time budgets leave it: KV freed beyond that cannot be used
    usable = builder.step_fit_tokens(request)
    if usable <= 0:
        # out of time (or only a uselessly small chunk fits the time left): the rest waits
        # for the next step and nobody is preempted — freeing KV would not make it fit (sizing
        # the need on the token budget instead preempted prompts for chunks the step had no
        # time for: GMAX's former livelock)
        return False
    if builder.add_preempting(request, usable, victims) > 0:
        return True
    if builder.full or builder.kv_fit_tokens(request) >= usable:
        return False  # not KV that blocks it
    if request.num_kv_blocks > 0 and not builder.is_scheduled(request):
        builder.preempt(request)
    return False


def interleave_prefills(
    prefills: IntArray,
    order: list[int],
    score: FloatArray,
    eligible: BoolArray | None = None,
) -> list[int]:
    """Running requests still prefilling (``prefills``, best first) placed among the waiting
    ones (``order``, best first) by (eligible, score), higher first.

    A chunked prompt must not hold every later step's prefill room against a better newcomer
    (vLLM continues every running request first: a long prompt then delays every short one
    behind it for as many steps as it has chunks). Pausing it keeps its KV — nothing is
    recomputed — so it is not a preemption."""
    if not prefills.size or not order:
        return [*prefills.tolist(), *order]
    key = score
    if eligible is not None:  # every eligible request ranks above every other
        key = np.where(eligible, score, score - (float(score.max() - score.min()) + 1.0))
    waiting = np.asarray(order)
    # a prefill goes before the first waiting request ranked strictly below it; ``order`` may
    # be out of rank order (GMAX's window), so compare with the running minimum
    low = np.minimum.accumulate(key[waiting])
    at = np.searchsorted(-low, -key[prefills], side="right")
    merged: list[int] = np.insert(waiting, at, prefills).tolist()
    return merged
