"""GoRouting (PROSERVE §4.3, Algorithm 2): route to the instance that adds the most gain.

For each healthy prefill-capable instance p the router estimates, in seconds of p's own
estimator (so A100 and 910B instances compare in the same units):

* ``w(r)``: prefill work of request r on p, without per-batch overhead: the estimator's prefill
  time of r's prompt cut into chunks of ``profile.engine.max_num_batched_tokens`` (each chunk
  over the tokens before it as ``l_kv``); ``k(r)`` chunks. The router cannot see partial
  progress, so queued requests count their whole prompt; lag compensation covers the rest.
* ``phi(S)``, the conservative drain time of a set S of queued prefills:

  - PD prefill instance (phi_p): ``sum w(r) + t_c * sum k(r)`` — one request per batch, each
    chunk one batch, so a lone request costs exactly :meth:`Profile.zero_load_ttft_s`;
  - co-located instance (phi_a, Eq. 8): ``t_b / (t_b - t_c) * sum w(r)`` with
    ``t_b = min(smallest remaining time to a first-token deadline in S that is not yet past,
    smallest TPOT SLO in S)``, floored at ``max(eta * smallest TPOT SLO, 2 * t_c)`` (xLLM's
    eta floor; the ``2 t_c`` floor keeps the factor finite, at most 2, when requests are
    overdue or have no TPOT SLO).

* ``Exec(p)    = max(0, phi(Q_p) - lag_p) + n_d * b_d``  with ``lag_p = max(0, now - ts_p)``
* ``Exec(p, r) = Exec(p) + phi(Q_p + r) - phi(Q_p)``

  Lag compensation subtracts the time since the queue was last updated from the queued work
  only: prefills that ran meanwhile have progressed, the new request has not. ``n_d * b_d``
  (``b_d`` = the estimator's decode-step constant, beta included) is the decode interference of
  the instance's decoding requests, added once as in the paper (0 on PD prefill instances,
  which decode nothing).

* ``Gain(S, t) = sum over r in S of w_r(1) * [t < arrival_r + due_r(1)]`` — every request in S
  is assumed to get its first token only when the whole set drains (the conservative,
  request-agnostic view of phi_a/phi_p), earning its first-token value
  ``GainWeights.token_value(weight, 1)`` if that is before its TTFT deadline.
* ``Delta_p = Gain(Q_p + r, now + Exec(p, r)) - Gain(Q_p, now + Exec(p))``: the request's own
  first-token value if it makes its deadline, minus the value of queued requests it pushes past
  theirs — so it can be negative.

Algorithm 2 then picks among ``C = {p : Delta_p >= alpha * Delta_max}`` when ``Delta_max > 0``:
the least-loaded instance of ``L = {Exec(p) < mu * TTFT}`` if any (don't leave an idle instance
idle), else the *busiest* of ``C - H`` with ``H = {Exec(p, r) > lambda * TTFT}`` (pack a safe
instance, keep light ones free for future long or high-priority requests), else the least
loaded of C. ``TTFT`` is the request's first-token due time (its deadline for end-to-end SLOs).
When ``Delta_max <= 0`` no instance meets the SLO (and ``alpha * Delta_max`` would be meaningless:
with a negative maximum it exceeds every Delta). Algorithm 2 then picks at random
(``fallback="random"``, kept for comparison: among the instances where the request harms the
queued requests least). Past capacity that is most decisions, and a random pick sends a late
request to a slow instance as often as to a fast one. With ``fallback="engine-order"``
(*beyond the paper*; opt-in, not the default) the router picks the instance of the largest
expected gain **in the order the engine serves its queue**:

* The paper's view (every queued request, and the newcomer, first-token only when the whole
  queue drains) is the view of a FIFO engine. A deadline- and density-aware engine (``slide``)
  past capacity serves the highest value per second of prefill first. Measured behind
  ``slide`` (azure_conv, 2 A100 + 2 910B, first 300 s): in this branch the realised TTFT was
  0.05x (A100 prefill, PD 4.5x) and 0.11-0.36x (three of four instances, co-located 7x) of the
  behind-everyone prediction, median: the view prices instances by a wait that mostly does not
  happen. What it did (co-located 7x): it put the long-output requests on one A100 (59% of the
  fleet's ideal gain on one of four instances; its TTFT did come out FIFO, 0.98x predicted) and
  the short ones on the other; the first realised 0.47 of its ideal, the other 0.55. In the
  engine's order the A100s hold 41% and 43% of the ideal and realise 0.55; under PD (4.5x)
  the A100 prefill realises 0.82 instead of 0.80 and the 910B 0.72 instead of 0.65, with the
  same split.
* So the newcomer waits for the work of the queued requests that rank above it as ``slide``
  ranks them: tier weight over the estimator's time of the rest of the prompt as one piece
  (:func:`~priority.routing.prefill_queue.slide_rank_work`, the queue's kept
  :meth:`~priority.routing.prefill_queue.PrefillQueue.density_order`; ties by deadline), then
  its own prefill. Work becomes wall time at the instance's prefill pace
  (:meth:`GoRouter._prefill_pace`): co-located, each step of the batch budget first holds the
  batch overhead and the running decodes, prefill gets the rest (measured on mooncake_conv
  co-located 7x: pricing the wait by ``Exec(p)``'s share instead, which adds the decodes once,
  predicted 2.3-3.3x less wait than realised, and TDG 0.591; with the pace 0.655). Its own
  value there is its first token if on time and its decode tokens on time (the closed form
  below, :func:`on_time_decode_tokens`).
* The router sees no prefill progress, only first tokens, so it models it
  (:meth:`GoRouter._advance`): the time since the order was last read buys prefill work at the
  pace, spent on the head of the order, finishing prompts and then part of the next, which
  ``slide`` then ranks by what is left (a long prompt climbs as it progresses). Measured there:
  0.656 without the model, 0.673 with it, 0.684 with the engine's true progress (simulator).
* The pace is learnt per instance from the first tokens it promised (``calibrate``, on by
  default; the router's beta): each request routed by this fallback is promised a wait; when
  its first token comes, the instance's pace moves a tenth of the way (geometrically) towards
  realised / promised (each ratio clamped to [0.25, 4], the correction to [0.5, 4]). What the
  model leaves out lands there: denser requests that arrive while it waits, ``slide``'s
  starvation guard, KV-bound admission. Measured on mooncake_conv co-located: 7x 0.673 ->
  0.686, 4.5x 0.784 -> 0.824.
* It delays every queued request ranked below it by its own prefill. Each of
  those that streams and is not yet hopeless (late by less than its expected decode tokens
  times ``TPOT - s``) loses ``w_d * weight / (TPOT - s)`` per second of delay (``TPOT - s``
  floored at :data:`GAP_FLOOR` of TPOT, ``s`` the decode step); those still on time whose slack
  is shorter than the delay lose their first token's value. G_p = own value - delay x the summed
  rate - the first tokens pushed late - (co-located) what its decode does to the running decodes
  (the expected-gain fallback's last term, below). A queue whose requests are already lost
  costs nothing to join; one whose requests can still catch up does.
* Per instance a snapshot of that order (:class:`_EngineOrder`: running work, loss rates) is
  read from the queue's kept density order (no sort) with the time, pace and decode step of
  the decision that finds it stale, and read again once more than :data:`ORDER_STALENESS` of
  its length entered or left since; per decision the lookups are O(log W) per instance.

By default (``fallback="expected-gain"``) the router picks the instance of the largest expected
gain ``G_p`` in the paper's behind-everyone view, also beyond the paper:

* the request's own gain there, including its decode tokens: it gets its first token at
  ``T1_p = now + Exec(p, r)`` and then one token per decode step ``s`` of the instance where it
  decodes (p itself co-located; under PD the decode instance :func:`pick_decode_instance`
  chooses), with ``s`` predicted from that instance's running decodes and KV in use
  (:mod:`priority.routing.decode`), so the A100 that decodes at 30 ms and the 910B that decodes
  at 90 ms differ. A late token i is on time again once ``(i - 1) * (TPOT - s)`` exceeds the
  lateness (the fixed deadlines of Eq. 3 let a fast decoder catch up), so the decode tokens on
  time are a closed form of the lateness, ``TPOT - s`` and the expected output length
  (:func:`on_time_decode_tokens`; the end-to-end deadline caps them too);
* minus the first-token value of the queued requests the request pushes past their deadline
  (the ``Delta_p`` terms, as in the main branch);
* minus the decode tokens the queued requests lose by waiting ``Exec(p, r) - Exec(p)`` longer:
  for each queued streaming request ``delay / |TPOT - s|`` tokens (floored at a tenth of its
  TPOT), counted for those late after the push when ``s < TPOT`` (they catch up later) and those
  not yet late when ``s >= TPOT`` (they fall behind sooner), capped by their expected tokens;
* minus, co-located, what the request's own decode does to the instance's running decodes when
  it pushes the step past the TPOT SLO: each running decode produces ``1/TPOT - 1/s`` late
  tokens per second over the request's decode lifetime (their weights are not tracked: the
  queued requests' mean weight stands in).

Ties (a 1e-9 relative tolerance) go to the least ``Exec(p, r)``, then the lower index. The
paper's main branch is unchanged; ``expected_gain`` in the decision stays ``Delta_p``.

**Decode instance** (PD-disaggregation). The paper sends every request to the decode instance
with the most free KV (``decode_choice="free-kv"``, :func:`pick_decode_instance`): on a
heterogeneous fleet that ignores that a 910B decodes a step 3x slower than an A100 and that a
decode instance past ``max_num_seqs`` queues its arrivals. By default
(``decode_choice="capacity"``, *beyond the paper*) GoRouting picks by decode capacity
(:func:`~priority.routing.decode.pick_decode_by_capacity`): a free slot and KV room, then a
predicted step within the TPOT SLO, then the fastest step — picked again when the first token
is out (:meth:`GoRouter.decode_at_handoff`), since at dispatch, seconds earlier under load, every
request of a burst sees the same free slots.

**Other routers' prefills** (gateway workers in front of the same engines): an instance's
``external_prefills`` summary (:class:`~priority.routing.base.ExternalPrefills`) joins Q_p as
work only: its raw work and chunks add to phi, its smallest TPOT SLO and earliest deadline
join the batch budget t_b (the deadline enters the sorted deadlines with value 0, so that it
bounds t_b without counting as gain), and its update time joins the lag: lag_p = now - the
latest of the two updates. The Gain terms stay over this router's own requests: pushing
another router's request past its deadline is not seen (the summary has no per-request values).

``route`` changes no routing state; it only draws from the random generator (fallback branch)
and memoizes each queue's summary (sorted deadlines, value suffix sums, total work), which the
``on_*`` callbacks drop when that queue changes; with the engine-order fallback it also moves
its model of the engines' progress to the time of the decision (a route that is not dispatched
only lets time pass in it) and notes the wait it promised, for :meth:`GoRouter.on_dispatch`.
Per decision the cost is then O(log |Q|) per instance; prompt work is cached per (profile
coefficients, chunk size, prompt length), and the queue's total work, chunks and smallest TPOT
SLO come from its running totals (:class:`~priority.routing.prefill_queue.PrefillQueue`), so a
rebuilt summary is a copy of the queue's deadline order and numpy running sums over its weights,
with no Python work per queued request. The estimates, Algorithm 2's choice and the
expected-gain fallback are one implementation: numpy operations across the candidate instances
(the formulas above, element by element; the same decisions, bit for bit, as the per-instance
loop this replaced, which ``tests/test_routing_decisions.json`` recorded), on per-instance
inputs kept between decisions and read again only for the instances that changed (queue,
decodes), with what depends on neither the request nor the time (phi_p, the batch budget's
floor, the decode interference) derived once per change; the deadline searches that depend on
the time only (the first deadline after now, the deadlines met before the request joins) are
kept too, searched again only where the time left the deadlines around the last answer.
A queue's summary holds the queue's own sorted deadline list, not a copy: a copied list of W
floats per changed queue is what made the garbage collector's passes, and so the decisions'
tail, slow.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import attrgetter, getitem, is_, ne
from typing import Any, cast

import numpy as np

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.gain import GainWeights
from priority.request import Request
from priority.routing.base import (
    ExternalPrefills,
    InstanceRole,
    InstanceView,
    RouteDecision,
    Router,
)
from priority.routing.decode import decode_step_s, pick_decode_by_capacity
from priority.routing.prefill_queue import (
    DeadlineOrder,
    DensityOrder,
    PrefillQueue,
    slide_rank_work,
)
from priority.routing.prefill_queue import raw_prefill_work as raw_prefill_work
from priority.routing.simple import pick_decode_instance, prefill_candidates

DEFAULT_ALPHA = 0.9
"""Candidates are instances within 10% of the best gain: same-gain instances (the common case,
every instance meets the SLO) all qualify, while an instance where the request would push a
queued request past its deadline drops out."""
DEFAULT_MU = 0.2
"""An instance whose queue drains within a fifth of the TTFT SLO is effectively idle."""
DEFAULT_LAMBDA = 0.8
"""Packing stops once the request would wait 80% of its TTFT SLO: the last 20% absorbs
estimator error and arrivals the router has not seen yet. Needs ``mu < lambda``."""
DEFAULT_ETA = 0.65
"""Floor of the co-located batch budget as a fraction of the smallest TPOT SLO (xLLM's eta)."""
DECODE_CHOICES = ("capacity", "free-kv")
"""How GoRouting picks a PD decode instance (module docstring)."""
FALLBACKS = ("expected-gain", "engine-order", "random")
"""What GoRouting does when no instance meets the request's SLO (module docstring)."""
GAP_FLOOR = 0.1
"""Floor of ``|TPOT - s|`` as a fraction of TPOT in the queued requests' decode loss: near
``s = TPOT`` a delay moves a late request's catch-up point by an unbounded number of tokens in
the closed form; the floor bounds that at ten tokens per TPOT of delay (the cap by their
expected tokens bounds the total)."""

PREFILL_SHARE_FLOOR = 0.1
"""Past capacity a co-located step's running decodes may take nearly the whole batch budget;
the engine-order fallback still credits prefill with this share of it (the engine's decodes
finish and its minimum chunks go through)."""

_FEW_ON_TIME = 32
"""An engine-order snapshot with at most this many requests on time sums the first tokens a
newcomer pushes late in Python (numpy's per-call cost is more than such a loop)."""

CALIBRATION_THETA = 0.9
"""The engine-order fallback's pace correction keeps this share of itself per first token (the
estimator's momentum, in log space)."""
CALIBRATION_MIN_WAIT_S = 0.05
"""Promised waits shorter than this teach the pace nothing (a step's noise would dominate)."""
ORDER_STALENESS = 1 / 16
"""The engine-order model of a queue is rebuilt once more than this share of its length
entered or left since it was built (every change while it holds fewer than 16)."""

_RELATIVE_TIE = 1e-9


@dataclass(slots=True)
class InstanceEstimate:
    """GoRouting's view of one instance for one request (seconds; gains in TDG units). Not
    frozen: one is made per instance per decision, and a frozen dataclass's ``__init__`` costs
    several times a plain one's."""

    index: int
    exec_s: float
    """Exec(p): time to drain the queued prefills, lag-compensated, plus decode interference."""
    exec_with_s: float
    """Exec(p, req): the same with the request added."""
    gain_before: float
    gain_after: float

    @property
    def delta(self) -> float:
        return self.gain_after - self.gain_before


class _QueueSummary:
    """Everything GoRouting needs from one instance's queue; rebuilt only when the queue changes,
    from the queue's deadline order (numpy's running sums: no walk, no float per request)."""

    __slots__ = (
        "_external_at",
        "_order",
        "_stream_suffix",
        "chunks",
        "decode_tokens_weighted",
        "min_tpot_s",
        "n",
        "padded",
        "raw_work",
        "value_suffix",
    )

    def __init__(
        self,
        padded: list[float],
        weights: np.ndarray,
        raw_work: float,
        chunks: int,
        min_tpot_s: float,
        order: DeadlineOrder,
        external_at: int | None,
        decode_tokens_weighted: float,
    ) -> None:
        self.padded = padded
        """First-token deadlines, ascending, then an infinite one: searches stop at :attr:`n`
        (``bisect(padded, t, 0, n)``), and ``padded[i]`` is the first deadline after ``t``
        (inf if none). Usually the queue's own list (:attr:`DeadlineOrder.padded`), valid
        until the queue changes, when the summary is dropped (a change behind the router's
        back too: the queue counts its mutations; a plain dict's only by its length)."""
        self.n = len(padded) - 1
        """How many deadlines."""
        self.value_suffix = _suffix_sums(weights)
        """``value_suffix[i]`` = total tier weight of the requests with deadlines[i:] (times the
        first-token weight: their first-token value)."""
        self.raw_work = raw_work
        self.chunks = chunks
        self.min_tpot_s = min_tpot_s
        self._order: DeadlineOrder | None = order
        """The queue's deadline order, whose streaming weights are summed if the fallback asks
        (valid as long as :attr:`padded` is)."""
        self._external_at = external_at
        """Where other routers' earliest deadline joined :attr:`padded` (None: it did not)."""
        self._stream_suffix: np.ndarray | None = None
        self.decode_tokens_weighted = decode_tokens_weighted
        """Sum over queued streaming requests of tier weight times expected decode tokens."""

    @property
    def stream_weight_suffix(self) -> np.ndarray:
        """``stream_weight_suffix[i]``: total tier weight of the streaming requests with
        deadlines[i:] (the expected-gain fallback's decode loss; summed when first asked)."""
        if self._stream_suffix is None:
            assert self._order is not None
            # read in place and summed at once (the queue's buffer must stay resizable)
            stream = np.frombuffer(self._order.stream_weights, dtype=np.float64)
            if self._external_at is not None:
                stream = np.insert(stream, self._external_at, 0.0)
            self._stream_suffix = _suffix_sums(stream)
            del stream
            self._order = None
        return self._stream_suffix

    @property
    def deadlines(self) -> list[float]:
        """The first-token deadlines, ascending (a copy)."""
        return self.padded[: self.n]

    def after(self, t: float) -> int:
        """How many deadlines are at or before ``t``."""
        return bisect.bisect_right(self.padded, t, 0, self.n)

    def min_remaining_s(self, now: float) -> float:
        """Time to the earliest first-token deadline not yet past (inf if none)."""
        return self.padded[self.after(now)] - now


@dataclass(slots=True)
class _Estimates:
    """One decision's estimates across the candidates, by their position in :class:`_Columns`."""

    exec_s: np.ndarray
    exec_with_s: np.ndarray
    gain_before: np.ndarray
    gain_after: np.ndarray
    delta: np.ndarray
    """``gain_after - gain_before``."""
    end_s: np.ndarray
    """``now + exec_with_s``: when the request's first token comes, instance by instance."""
    cut_after: list[int] | None
    """Per position: how many queued deadlines fall at or before :attr:`end_s` (None: only
    the :attr:`moved` positions differ from the kept cut before the request)."""
    moved: list[int]
    """The positions whose cut after differs from the cut before (where :attr:`cut_after` is
    None: their cuts are :attr:`moved_cuts`)."""
    moved_cuts: list[int]

    def one(self, indices: list[int], k: int) -> InstanceEstimate:
        return InstanceEstimate(
            indices[k],
            float(self.exec_s[k]),
            float(self.exec_with_s[k]),
            float(self.gain_before[k]),
            float(self.gain_after[k]),
        )

    def objects(self, indices: list[int]) -> list[InstanceEstimate]:
        return [
            InstanceEstimate(*fields)
            for fields in zip(
                indices,
                self.exec_s.tolist(),
                self.exec_with_s.tolist(),
                self.gain_before.tolist(),
                self.gain_after.tolist(),
                strict=True,
            )
        ]


_READS = attrgetter(
    "estimator",
    "estimator.beta",
    "estimator.coefficients",
    "profile",
    "role",
    "prefill_queue",
    "prefill_queue.mutations",
    "queue_updated_s",
    "external_prefills",
    "num_decoding",
    "num_free_kv_blocks",
)
"""What a decision reads of each view, in one tuple: the first :data:`_PRICED` price its
estimates (a change re-prices every position), up to :data:`_QUEUED` fingerprint its queue (the
object, its count of mutations, update time, other routers' summary), the rest are its decodes.
Compared by value where they differ in identity (an equal profile, coefficients or other
routers' summary estimates alike)."""
_PRICED = 5
_QUEUED = 9
_READS_PLAIN = attrgetter(
    "estimator",
    "estimator.beta",
    "estimator.coefficients",
    "profile",
    "role",
    "prefill_queue",
    "prefill_queue",
    "queue_updated_s",
    "external_prefills",
    "num_decoding",
    "num_free_kv_blocks",
)
""":data:`_READS` of a view whose queue is a plain dict (assigned after construction): its length
stands for its count of mutations (changes that keep it are not seen)."""
_QUEUE = attrgetter("prefill_queue")
_ROLE = attrgetter("role")
_UNSEEN = object()
_WORK_MEMO = 1 << 14
"""Prompt lengths whose work a candidate list keeps (then it starts over)."""


class _Columns:
    """One candidate list's inputs to a decision, by position, kept between decisions: what was
    last read of each view (so that only what changed is read again) and what the decision
    derives from it that does not depend on the request or the time, as arrays across the
    instances (:meth:`GoRouter._columns` refreshes them)."""

    def __init__(self, views: list[InstanceView], eta: float) -> None:
        n = len(views)
        self.views = views
        self.eta = eta
        self.indices = [v.index for v in views]
        self.position = {index: k for k, index in enumerate(self.indices)}
        self.reads: list[tuple[Any, ...]] = [(_UNSEEN,) * _QUEUED] * n
        """What was last read of each view (:data:`_READS`; never read: unlike any read)."""
        self.lengths: list[int] = [0] * n
        """The queues' lengths, as their summaries were set."""
        self.betas: list[float] = []
        # the estimators' terms (price)
        self.t_c_list: list[float] = []
        self.beta = self.t_c = self.two_t_c = self.b_d = self.a_d = np.zeros(n)
        self.prefill = np.zeros(n, dtype=bool)
        self.any_prefill = self.any_colocated = False
        self.groups: list[tuple[LatencyCoefficients, int]] = []
        self.group_of = np.zeros(n, dtype=np.intp)
        self.works: dict[int, list[tuple[float, float]]] = {}
        """:meth:`request_work`'s memo."""
        self.engines: list[tuple[float, float, float]] = []
        """Per position: max_num_seqs, num_kv_blocks and block_size, as floats."""
        # the queues (set_queue)
        self.summaries: list[_QueueSummary | None] = [None] * n
        self.raw = np.zeros(n)
        self.min_tpot = np.zeros(n)
        self.updated = np.zeros(n)
        self.padded: list[list[float]] = [[math.inf] for _ in range(n)]
        self.sizes: list[int] = [0] * n
        self.suffixes: list[Any] = [np.zeros(1) for _ in range(n)]
        self.pd_before = np.zeros(n)
        """phi_p of the queue (PD prefill positions): ``beta * raw + t_c * chunks``."""
        self.scaled = np.zeros(n)
        """``eta`` times the queue's smallest TPOT SLO (inf where it has none)."""
        self.floors = np.zeros((2, n))
        """The batch budget's floor (:func:`_batch_factors`) of the queue (row 0, kept) and of
        the queue with the request (row 1, per decision)."""
        self.budgets = np.zeros((2, n))
        """Scratch: the batch budgets before and with the request."""
        self.decode_weighted = np.zeros(n)
        """Per position: its queue's weighted expected decode tokens."""
        self.busy_queue = np.zeros(n, dtype=bool)
        """Whether the queue's weighted expected decode tokens are positive."""
        self.gap_floor = np.zeros(n)
        """``GAP_FLOOR`` times the queue's smallest TPOT SLO."""
        # searches kept between decisions: position k's last answer stands while the time
        # searched for stays within [lo[k], hi[k]) (the deadlines around it); lo = inf: search
        # again
        self.live_lo = np.full(n, math.inf)
        self.live_hi = np.zeros(n)
        """The first deadline after the last ``now`` (inf if none), and the one before it."""
        self.cut_lo = np.full(n, math.inf)
        self.cut_hi = np.zeros(n)
        self.cut: list[int] = [0] * n
        """How many deadlines fall at or before ``now + Exec(p)`` (gain_before's search)."""
        self.cut_value = np.zeros(n)
        """``value_suffix[cut]`` per position."""
        self.streams: list[np.ndarray | None] = [None] * n
        """Each position's streaming-weight suffix sums, once the fallback asked (None: not yet
        read since its queue changed)."""
        self.stream_total = np.zeros(n)
        """``streams[k][0]``: the queue's total streaming weight."""
        self.stream_cut = np.zeros(n)
        """``streams[k][cut[k]]``."""
        self.streams_stale: set[int] = set(range(n))
        """Positions whose :attr:`streams` must be read again."""
        self.stream_cut_stale: set[int] = set(range(n))
        """Positions whose :attr:`stream_cut` must be read again."""
        self.mean_weight = np.zeros(n)
        self.mean_known = np.zeros(n, dtype=bool)
        """The queued requests' mean weight (streaming weight over the queue's length), where
        the queue has requests and streaming weight (read with :attr:`streams`)."""
        # the decodes (set_decode)
        self.decoding = np.zeros(n)
        """Per position: its decoding requests."""
        self.interference = np.zeros(n)
        """``n_d * beta * b_d``: the decode interference added to Exec(p)."""
        self.n_d = np.zeros(n)
        """Decoding requests, at most ``max_num_seqs``."""
        self.before = np.zeros(n)
        """``t_c + running_decodes_s``: a decode step before the request's own decode joins."""

    def price(self, estimators: list[BatchLatencyEstimator]) -> None:
        """Read the estimators, profiles and roles again (all positions; their queues and
        decodes must then be set again, :meth:`set_queue` and :meth:`set_decode`)."""
        views = self.views
        self.betas = [e.beta for e in estimators]
        coefficients = [e.coefficients for e in estimators]
        roles = [v.role for v in views]
        self.beta = np.array(self.betas)
        self.t_c = self.beta * np.array([c.t_c for c in coefficients])
        self.t_c_list = self.t_c.tolist()
        self.two_t_c = 2.0 * self.t_c
        self.b_d = np.array([c.b_d for c in coefficients])
        self.a_d = np.array([c.a_d for c in coefficients])
        self.engines = [
            (float(e.max_num_seqs), float(e.num_kv_blocks), float(e.block_size))
            for e in (v.profile.engine for v in views)
        ]
        self.prefill = np.array([r is InstanceRole.PREFILL for r in roles])
        self.any_prefill = bool(self.prefill.any())
        self.any_colocated = not bool(self.prefill.all())
        groups: dict[tuple[int, int], int] = {}
        self.groups = []
        of = []
        for c, view in zip(coefficients, views, strict=True):
            chunk = view.profile.engine.max_num_batched_tokens
            key = (id(c), chunk)
            if key not in groups:
                groups[key] = len(self.groups)
                self.groups.append((c, chunk))
            of.append(groups[key])
        self.group_of = np.array(of, dtype=np.intp)
        self.works = {}

    def request_work(self, prompt_tokens: int) -> list[tuple[float, float]]:
        """The raw prefill work and chunks of a prompt under each group's profile
        (:func:`raw_prefill_work`), memoized per group by prompt length (its own cache keys on
        the coefficients, whose hash is several float hashes per call)."""
        memo = self.works
        work = memo.get(prompt_tokens)
        if work is None:
            if len(memo) >= _WORK_MEMO:
                memo.clear()
            work = memo[prompt_tokens] = [
                (w, float(k))
                for w, k in (raw_prefill_work(c, chunk, prompt_tokens) for c, chunk in self.groups)
            ]
        return work

    def searched(
        self, t: np.ndarray | float, lo: np.ndarray, hi: np.ndarray, cut: list[int] | None
    ) -> list[int]:
        """Refresh the kept searches ``bisect_right(padded[k], t[k], 0, sizes[k])`` where
        ``t[k]`` left ``[lo[k], hi[k])``; returns the positions refreshed. ``cut`` (if given)
        receives the new answers; ``lo``/``hi`` the deadlines around them."""
        stale: list[int] = ((t < lo) | (t >= hi)).nonzero()[0].tolist()
        if not stale:
            return stale
        padded, sizes = self.padded, self.sizes
        for k in stale:
            deadlines = padded[k]
            at = bisect.bisect_right(
                deadlines, t if isinstance(t, float) else float(t[k]), 0, sizes[k]
            )
            hi[k] = deadlines[at]
            lo[k] = deadlines[at - 1] if at else -math.inf
            if cut is not None:
                cut[k] = at
        return stale

    def set_decode(self, k: int, decoding: int, free: object) -> None:
        """Position ``k``'s decodes: the interference term, and running_decodes_s and
        decode_step_s (:mod:`priority.routing.decode`) before the request, the same float
        operations as those functions."""
        beta, b_d, a_d = self.betas[k], float(self.b_d[k]), float(self.a_d[k])
        max_seqs, kv_blocks, block_size = self.engines[k]
        d = float(decoding)
        self.decoding[k] = d
        self.interference[k] = d * beta * b_d
        n_d = min(d, max_seqs)
        kv = 0.0
        if free is not None:
            kv = max(kv_blocks - float(cast(int, free)), 0.0) * block_size
        running = 0.0
        if n_d > 0:
            running = beta * (a_d * kv + b_d) + (n_d - 1.0) * (beta * (a_d * 0.0 + b_d))
        self.n_d[k] = n_d
        self.before[k] = self.t_c_list[k] + running

    def stream_suffixes(self) -> list[np.ndarray]:
        """Each position's streaming-weight suffix sums, with :attr:`stream_total` and
        :attr:`stream_cut` (read again where the queue or the cut changed)."""
        streams = self.streams
        if self.streams_stale:
            lengths = self.lengths
            for k in self.streams_stale:
                summary = self.summaries[k]
                assert summary is not None
                suffix = streams[k] = summary.stream_weight_suffix
                total = self.stream_total[k] = suffix[0]
                known = self.mean_known[k] = bool(lengths[k] and total)
                if known:
                    self.mean_weight[k] = total / lengths[k]
            self.stream_cut_stale |= self.streams_stale
            self.streams_stale.clear()
        if self.stream_cut_stale:
            cut = self.cut
            for k in self.stream_cut_stale:
                self.stream_cut[k] = cast(np.ndarray, streams[k])[cut[k]]
            self.stream_cut_stale.clear()
        return cast(list[np.ndarray], streams)

    def set_queue(self, k: int, summary: _QueueSummary, updated_s: float) -> None:
        """Position ``k``'s queue summary, and what the estimates derive from it alone: phi_p
        (:meth:`GoRouter._phi`) and the batch budget's floor (:func:`_batch_factors`), the same
        float operations."""
        beta, t_c = self.betas[k], self.t_c_list[k]
        raw, min_tpot = summary.raw_work, summary.min_tpot_s
        self.raw[k] = raw
        self.min_tpot[k] = min_tpot
        self.updated[k] = updated_s
        self.padded[k] = summary.padded
        self.sizes[k] = summary.n
        self.suffixes[k] = summary.value_suffix
        self.summaries[k] = summary
        self.pd_before[k] = beta * raw + t_c * float(summary.chunks)
        scaled = 0.0
        self.scaled[k] = math.inf
        if min_tpot < math.inf:
            scaled = self.scaled[k] = self.eta * min_tpot
        two_t_c = 2.0 * t_c
        self.floors[0, k] = scaled if scaled > two_t_c else two_t_c
        self.decode_weighted[k] = summary.decode_tokens_weighted
        self.live_lo[k] = self.cut_lo[k] = math.inf
        self.streams[k] = None
        self.streams_stale.add(k)
        self.busy_queue[k] = summary.decode_tokens_weighted > 0.0
        self.gap_floor[k] = GAP_FLOOR * min_tpot


class _EngineOrder:
    """One instance's queued prefills in the order ``slide`` serves them past capacity (its
    URGENT order: value of the first token per second of the whole prompt as one piece,
    highest first; ties by deadline), read from the queue's kept density order
    (:meth:`PrefillQueue.density_order`), for the ``engine-order`` fallback.

    Holds the order's running prefill work (a newcomer waits for the work of the requests
    that rank above it) and, per position, the rate at which the requests from there on lose
    value per second of delay: ``w_d * weight / (TPOT - s)`` for each streaming request that
    is not yet hopeless (late by less than its expected decode tokens times ``TPOT - s``,
    so a delay moves its catch-up point; ``TPOT - s`` floored at :data:`GAP_FLOOR` of TPOT).
    The rates use the time, pace and decode step of the decision that built it (a snapshot:
    :meth:`GoRouter._engine_order` says when it is built again)."""

    __slots__ = (
        "built_s",
        "cum",
        "few",
        "least_slack",
        "neg_density",
        "on_time_at",
        "on_time_slack",
        "on_time_value",
        "rate_suffix",
        "size",
        "slack_list",
        "value_list",
    )

    def __init__(
        self,
        order: DensityOrder,
        decode_value: float,
        first_value: float,
        now: float,
        pace: float,
        step_s: float,
    ) -> None:
        self.built_s = now
        self.size = len(order)
        self.neg_density: list[float] = order.keys.copy()
        """Minus value per second of prefill, ascending (the engine's order)."""
        # numpy reads the queue's buffers in place; every view is let go before returning
        weights = np.frombuffer(order.weights, dtype=np.float64)
        tpots = np.frombuffer(order.tpots, dtype=np.float64)
        cum = np.zeros(self.size + 1)
        np.cumsum(np.frombuffer(order.works, dtype=np.float64), out=cum[1:])
        self.cum: list[float] = cum.tolist()
        """``cum[i]``: raw work of the first ``i`` requests in that order."""
        late = cum[1:] * pace
        late += now
        late -= np.frombuffer(order.dues, dtype=np.float64)
        streams = tpots < math.inf
        tpot = np.where(streams, tpots, 0.0)
        gap = np.maximum(tpot - step_s, GAP_FLOOR * tpot)
        live = streams & (gap > 0.0)
        rate = np.zeros(self.size)
        outputs = np.frombuffer(order.outputs, dtype=np.float64)
        hopeful = live & (late < outputs * np.where(live, gap, 0.0))
        np.divide(decode_value * weights, gap, out=rate, where=hopeful)
        self.rate_suffix: list[float] = _suffix_sums(rate).tolist()
        """``rate_suffix[i]``: loss rate (value per second of delay) of the requests from
        position ``i`` on."""
        on_time = (late < 0.0).nonzero()[0]
        self.on_time_at: list[int] = on_time.tolist()
        """Positions of the requests still on time for their first token (ascending)."""
        self.on_time_slack = -late[on_time]
        """Their slack to the first-token deadline, at the build."""
        self.on_time_value = first_value * weights[on_time]
        """Their first token's value."""
        slack = self.on_time_slack
        self.least_slack: list[float] = (
            np.minimum.accumulate(slack[::-1])[::-1].tolist() if len(slack) else []
        )
        """``min(on_time_slack[j:])``: a newcomer whose prefill is shorter pushes no one from
        there on past their deadline (most decisions: no scan)."""
        self.few = len(on_time) <= _FEW_ON_TIME
        self.slack_list: list[float] = self.on_time_slack.tolist() if self.few else []
        self.value_list: list[float] = self.on_time_value.tolist() if self.few else []
        del weights, tpots, outputs

    def pushed_value(self, start: int, delay_s: float) -> float:
        """First-token value of the on-time requests from ``on_time_at[start]`` on whose slack
        is shorter than ``delay_s`` (a few: a Python loop, cheaper than numpy's calls)."""
        if self.least_slack[start] >= delay_s:
            return 0.0
        if self.few:
            values = self.value_list
            return sum(
                [values[i] for i in range(start, len(values)) if self.slack_list[i] < delay_s]
            )
        pushed = self.on_time_slack[start:] < delay_s
        return float(self.on_time_value[start:][pushed].sum())


class GoRouter(Router):
    """PROSERVE's gain-oriented router for co-located and PD-disaggregated fleets."""

    name = "goroute"

    def __init__(
        self,
        instances: Sequence[InstanceView],
        *,
        weights: GainWeights | None = None,
        alpha: float = DEFAULT_ALPHA,
        mu: float = DEFAULT_MU,
        lambda_: float = DEFAULT_LAMBDA,
        eta: float = DEFAULT_ETA,
        rng: np.random.Generator | None = None,
        seed: int | None = None,
        avoid_harm_on_fallback: bool = True,
        fallback: str = "expected-gain",
        decode_choice: str = "capacity",
        calibrate: bool | str = True,
    ) -> None:
        super().__init__(instances)
        if isinstance(calibrate, str):
            calibrate = calibrate.lower() not in ("0", "false", "no")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not 0.0 <= mu < lambda_:
            raise ValueError(f"need 0 <= mu < lambda, got mu={mu}, lambda={lambda_}")
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"eta must be in [0, 1], got {eta}")
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
        if decode_choice not in DECODE_CHOICES:
            raise ValueError(
                f"decode_choice must be one of {', '.join(DECODE_CHOICES)}, got {decode_choice!r}"
            )
        if rng is not None and seed is not None:
            raise ValueError("pass rng or seed, not both")
        self.weights = weights if weights is not None else GainWeights()
        self.alpha = alpha
        self.mu = mu
        self.lambda_ = lambda_
        self.eta = eta
        self.rng = rng if rng is not None else np.random.default_rng(seed)
        self.avoid_harm_on_fallback = avoid_harm_on_fallback
        self.fallback = fallback
        self.decode_choice = decode_choice
        # Memo of each queue's summary, keyed by a fingerprint of the queue; the callbacks also
        # drop it, which catches changes that leave length and timestamp alike.
        self._summaries: dict[
            int, tuple[tuple[int, int, int | None, float, ExternalPrefills | None], _QueueSummary]
        ] = {}
        self.calibrate = calibrate
        self._promise: tuple[str, int, float] | None = None
        """The last engine-order decision's (request id, instance, promised wait), until the
        caller dispatches it (or routes another)."""
        self._promised: dict[str, tuple[int, float, float]] = {}
        """Dispatched requests' (instance, dispatch time, promised wait), until first token."""
        self._pace_correction: dict[int, float] = {}
        """Per instance: realised over promised waits, smoothed (1 until a first token)."""
        self._advanced: dict[int, tuple[PrefillQueue, float]] = {}
        """Per instance: the queue whose progress the router models, and the time it was
        last moved to (:meth:`_advance`)."""
        self._orders: dict[int, tuple[tuple[Any, int | None], _EngineOrder]] = {}
        """Each instance's queue in the engine's order (the ``engine-order`` fallback), with the
        queue it was built from and that queue's mutation count then."""
        self._cols: _Columns | None = None
        """The last candidate list's inputs to the estimates (:meth:`_columns`)."""
        self._dirty: set[int] = set()
        """Instances whose queue a callback changed since :meth:`_columns` last read them."""
        self._roles: list[InstanceRole] = []
        self._any_decode = False
        """Whether any of :attr:`_roles` (every instance's, as last read) is DECODE."""

    # ---- Algorithm 2 ----------------------------------------------------------------------

    def route(
        self, request: Request, now: float, *, exclude: frozenset[int] = frozenset()
    ) -> RouteDecision:
        """Algorithm 2. Pure apart from the random draw of the fallback branch. ``exclude``:
        instances passed over as if unhealthy (:meth:`Router.route`)."""
        candidates = prefill_candidates(self.instances, exclude)
        decode = None
        if len(candidates) < len(self.instances) and self._decode_roles():
            decode = (
                pick_decode_by_capacity(self.instances, request, exclude)
                if self.decode_choice == "capacity"
                else pick_decode_instance(self.instances, exclude)
            )
        arrays = self._estimate_arrays(candidates, request, now)
        delta = arrays.delta
        delta_max = float(delta.max())
        if delta_max > 0.0:
            k = self._select(arrays, delta_max, request)
        elif self.fallback != "random":
            first_s = None
            if self.fallback == "engine-order":
                gains, first_s = self.engine_order_terms(arrays, request, now, decode)
            else:
                gains = self._fallback_gains_arrays(arrays, request, now, decode)
            best_gain = float(gains.max())
            tie = _RELATIVE_TIE * max(1.0, abs(best_gain))
            k = _first_min(arrays.exec_with_s, gains >= best_gain - tie)
            if first_s is not None and self.calibrate:
                assert self._cols is not None
                wait = float(first_s[k]) - now
                self._promise = (request.request_id, self._cols.indices[k], wait)
        else:  # Algorithm 2's random pick (among the least harmful, by default)
            pool = np.arange(len(delta))
            if self.avoid_harm_on_fallback:
                tie = _RELATIVE_TIE * max(1.0, abs(delta_max))
                pool = np.flatnonzero(delta >= delta_max - tie)
            k = int(pool[int(self.rng.integers(len(pool)))])
        assert self._cols is not None
        return RouteDecision(
            instance=self._cols.indices[k],
            decode_instance=decode,
            expected_gain=float(arrays.gain_after[k]) - float(arrays.gain_before[k]),
            predicted_ttft_s=float(arrays.exec_with_s[k]),
        )

    def _decode_roles(self) -> bool:
        """Whether any instance is a DECODE instance (a co-located fleet has none to pick)."""
        roles = list(map(_ROLE, self.instances))
        if roles != self._roles:
            self._roles = roles
            self._any_decode = InstanceRole.DECODE in roles
        return self._any_decode

    def _select(self, arrays: _Estimates, delta_max: float, request: Request) -> int:
        """Algorithm 2's choice when some instance gains (``delta_max > 0``): the position of
        the instance (ties to the first, which is the lowest instance index)."""
        candidates = arrays.delta >= self.alpha * delta_max
        ttft = request.slo.token_due_s(1)
        exec_s = arrays.exec_s
        light = candidates & (exec_s < self.mu * ttft)
        if light.any():
            return _first_min(exec_s, light)
        safe = candidates & ~(arrays.exec_with_s > self.lambda_ * ttft)
        if safe.any():
            return _first_min(-exec_s, safe)
        return _first_min(exec_s, candidates)

    # ---- EstimateGain / EstimateExec ------------------------------------------------------

    def estimate(self, instance: InstanceView, request: Request, now: float) -> InstanceEstimate:
        """Exec and gain of ``instance`` without and with ``request`` (see the module docstring)."""
        return self.estimates([instance], request, now)[0]

    def estimates(
        self, instances: Sequence[InstanceView], request: Request, now: float
    ) -> list[InstanceEstimate]:
        """:meth:`estimate` of each of ``instances`` (what a decision among them computes)."""
        arrays = self._estimate_arrays(instances, request, now)
        assert self._cols is not None
        return arrays.objects(self._cols.indices)

    def _estimate_arrays(
        self, instances: Sequence[InstanceView], request: Request, now: float
    ) -> _Estimates:
        """:meth:`estimate` of each of ``instances`` at once: the phi, batch-factor and lag terms
        (module docstring) as numpy operations across instances; what does not depend on the
        request or the time is kept between decisions in :class:`_Columns` (only what changed
        is read again); the deadline searches and value lookups stay per instance, and are kept
        too while the time searched for stays between the same two deadlines."""
        slo = request.slo
        req_deadline = request.arrival_s + slo.token_due_s(1)
        req_remain = req_deadline - now if req_deadline > now else math.inf
        req_tpot = slo.tpot_s if slo.tpot_s is not None else math.inf
        req_value = self.weights.token_value(request.weight, 1)
        first, prompt = self.weights.first_token, request.prompt_tokens
        cols = self._columns(instances)
        beta, t_c, raw = cols.beta, cols.t_c, cols.raw
        req_raw: np.ndarray | float
        req_chunks: np.ndarray | float
        works = cols.request_work(prompt)
        if len(works) == 1:  # one profile: the request's work is one number
            req_raw, req_chunks = works[0]
        else:  # per position, its profile's (rows of raw work and chunks)
            req_raw, req_chunks = np.array(works)[cols.group_of].T
        cols.searched(float(now), cols.live_lo, cols.live_hi, None)
        if cols.any_colocated:  # Eq. 8's t_b / (t_b - t_c), before (row 0) and with the request
            budget = cols.budgets
            np.minimum(cols.live_hi - now, cols.min_tpot, out=budget[0])
            np.minimum(budget[0], min(req_tpot, req_remain), out=budget[1])
            floor = cols.floors
            if req_tpot < math.inf:  # eta * min(TPOTs) is min(eta * TPOTs): eta >= 0
                np.minimum(cols.scaled, self.eta * req_tpot, out=floor[1])
                np.maximum(floor[1], cols.two_t_c, out=floor[1])
            else:
                floor[1] = floor[0]
            factor = _batch_factors(budget, floor, t_c)
            factor *= beta
            co_before = factor[0] * raw
            co_after = factor[1] * (raw + req_raw)
        if cols.any_prefill:  # PD prefill instances: one request per batch, a chunk each
            pd_before = cols.pd_before
            pd_after = pd_before + beta * req_raw + t_c * req_chunks
        if not cols.any_prefill:
            phi_before, phi_after = co_before, co_after
        elif not cols.any_colocated:
            phi_before, phi_after = pd_before, pd_after
        else:
            phi_before = np.where(cols.prefill, pd_before, co_before)
            phi_after = np.where(cols.prefill, pd_after, co_after)
        # max(x, 0) may keep a -0.0 where a scalar max gives 0.0: x - (-0.0) and -0.0 + y are
        # then what x - 0.0 and 0.0 + y are, for the non-negative x and y here
        lag = np.subtract(now, cols.updated)
        np.maximum(lag, 0.0, out=lag)
        exec_s = np.subtract(phi_before, lag, out=lag)
        np.maximum(exec_s, 0.0, out=exec_s)
        exec_s += cols.interference
        exec_with_s = exec_s + (phi_after - phi_before)
        cut = cols.cut
        researched = cols.searched(now + exec_s, cols.cut_lo, cols.cut_hi, cut)
        if researched:
            suffixes, cut_value = cols.suffixes, cols.cut_value
            for k in researched:
                cut_value[k] = suffixes[k][cut[k]]
            cols.stream_cut_stale.update(researched)
        gain_before = first * cols.cut_value
        end_s = now + exec_with_s
        # where no queued deadline falls between now + Exec(p) and now + Exec(p, r), the
        # request's own work pushes no one past theirs: cut_after is cut_before, no search
        moved: list[int] = ((end_s < cols.cut_lo) | (end_s >= cols.cut_hi)).nonzero()[0].tolist()
        moved_cuts: list[int] = []
        cut_after: list[int] | None = None
        padded, suffixes = cols.padded, cols.suffixes
        if 4 * len(moved) > len(padded):  # many: one C-level pass over all of them
            cut_after = list(
                map(bisect.bisect_right, padded, end_s.tolist(), repeat(0), cols.sizes)
            )
            gain_after = first * np.array(list(map(getitem, suffixes, cut_after)))
        else:
            values = cols.cut_value.copy()
            sizes = cols.sizes
            for k in moved:
                at = bisect.bisect_right(padded[k], float(end_s[k]), 0, sizes[k])
                moved_cuts.append(at)
                values[k] = suffixes[k][at]
            gain_after = np.multiply(first, values, out=values)
        np.add(gain_after, req_value, out=gain_after, where=end_s < req_deadline)
        return _Estimates(
            exec_s,
            exec_with_s,
            gain_before,
            gain_after,
            gain_after - gain_before,
            end_s,
            cut_after,
            moved,
            moved_cuts,
        )

    def _columns(self, instances: Sequence[InstanceView]) -> _Columns:
        """The per-instance inputs of :meth:`_estimate_arrays`, kept between decisions: rebuilt
        whole when the instances, their estimators (object or ``beta``), coefficients, profiles
        or roles change; per instance when its queue changed (a callback, or its fingerprint:
        queue object, its count of mutations, update time, other routers' summary) or its
        decodes did (count, free KV)."""
        cols = self._cols
        if (
            cols is None
            or len(cols.views) != len(instances)
            or not all(map(is_, cols.views, instances))
        ):
            cols = self._cols = _Columns(list(instances), self.eta)
        # one pass reads what every position's columns come from (a tuple per view); only the
        # positions whose reads differ are looked at again
        try:
            reads = list(map(_READS, instances))
        except AttributeError:  # some queue is a plain dict
            reads = [_read_plain(view) for view in instances]
        seen = cols.reads
        queue_changed: set[int] = set()
        decode_changed: Sequence[int] = ()
        moved = list(compress(count(), map(ne, reads, seen)))
        if moved:
            if any(reads[k][:_PRICED] != seen[k][:_PRICED] for k in moved):
                cols.price([read[0] for read in reads])
                queue_changed.update(range(len(reads)))
                decode_changed = range(len(reads))
            else:
                queue_changed.update(
                    k for k in moved if reads[k][_PRICED:_QUEUED] != seen[k][_PRICED:_QUEUED]
                )
                decode_changed = [k for k in moved if reads[k][_QUEUED:] != seen[k][_QUEUED:]]
        dirty = self._dirty
        if dirty:
            position = cols.position
            queue_changed.update(position[i] for i in dirty if i in position)
            dirty.clear()
        for k in queue_changed:
            instance = instances[k]
            cols.set_queue(k, self._summary(instance), _updated_s(instance))
            cols.lengths[k] = len(instance.prefill_queue)
        for k in decode_changed:
            read = reads[k]
            cols.set_decode(k, read[_QUEUED], read[_QUEUED + 1])
        cols.reads = reads
        return cols

    def fallback_gains(
        self, instances: Sequence[InstanceView], request: Request, now: float, decode: int | None
    ) -> list[float]:
        """G_p of the expected-gain fallback (module docstring) of each of ``instances``;
        ``decode`` is the PD decode instance (None: co-located, the request decodes in place)."""
        arrays = self._estimate_arrays(instances, request, now)
        gains: list[float] = self._fallback_gains_arrays(arrays, request, now, decode).tolist()
        return gains

    def _fallback_gains_arrays(
        self, arrays: _Estimates, request: Request, now: float, decode: int | None
    ) -> np.ndarray:
        """:meth:`fallback_gains` across the positions of ``arrays`` (the candidates the kept
        columns describe), each branch a mask (where a value is computed only where the
        branch applies)."""
        cols = self._cols
        assert cols is not None
        weights, slo = self.weights, request.slo
        due_first = request.arrival_s + slo.token_due_s(1)
        deadline_at = None if slo.deadline_s is None else request.arrival_s + slo.deadline_s
        tokens = max(0, request.expected_output_tokens - 1)
        extra_kv = request.prompt_tokens + tokens / 2
        decode_value = weights.token_value(request.weight, 2)
        unit_value = weights.token_value(1.0, 2)
        tpot = slo.tpot_s
        n = len(cols.indices)
        before = cols.before
        # decode_step_s (priority.routing.decode), per instance
        if decode is None:
            step = before + cols.beta * (cols.a_d * extra_kv + cols.b_d)
        else:
            step = np.full(n, decode_step_s(self.instances[decode], extra_kv))
        exec_s, exec_with_s, first_s = arrays.exec_s, arrays.exec_with_s, arrays.end_s
        own_decode = _on_time_decode_tokens(
            due_first - first_s,
            tpot,
            step,
            tokens,
            None if deadline_at is None else deadline_at - first_s,
        )
        gains = arrays.delta + decode_value * own_decode
        # decode tokens the queued requests lose by the delay (|TPOT - s| floored, capped)
        delay = exec_with_s - exec_s
        loss = np.zeros(n)
        queued = (delay > 0.0) & cols.busy_queue
        if queued.any():
            streams: list[Any] = cols.stream_suffixes()
            gap = cols.min_tpot - step
            if arrays.cut_after is not None:
                at_after = np.array(list(map(getitem, streams, arrays.cut_after)))
            else:  # the stream suffix at the cut before, kept, except where the cut moved
                at_after = cols.stream_cut.copy()
                for k, at in zip(arrays.moved, arrays.moved_cuts, strict=True):
                    at_after[k] = streams[k][at]
            late = cols.stream_total - at_after
            exposed = np.where(gap > 0.0, late, cols.stream_cut)  # stream suffix at cut before
            rate = 1.0 / np.maximum(np.abs(gap), cols.gap_floor)
            np.copyto(loss, np.minimum(exposed * delay * rate, cols.decode_weighted), where=queued)
        # co-located: the request's decode slowing the running decodes past their TPOT
        if decode is None and tpot is not None:
            hurt = (cols.decoding > 0.0) & (step > tpot)
            if hurt.any():  # computed across all (no fancy indexing), added where hurt
                inverse_step = np.divide(1.0, step, out=np.zeros(n), where=hurt)  # step > 0
                late_rate = 1.0 / np.maximum(before, tpot) - inverse_step
                # the queued requests' mean weight, else the request's
                cols.stream_suffixes()
                mean_weight = np.where(cols.mean_known, cols.mean_weight, request.weight)
                hurt_loss = mean_weight * cols.n_d * late_rate * tokens * step
                np.add(loss, hurt_loss, out=loss, where=hurt)
        result: np.ndarray = gains - unit_value * loss
        return result

    def _decode_steps(self, request: Request, decode: int | None) -> np.ndarray:
        """The request's predicted decode step per candidate position: in place co-located
        (:func:`~priority.routing.decode.decode_step_s`, the same float operations), on the
        decode instance under PD."""
        cols = self._cols
        assert cols is not None
        extra_kv = request.prompt_tokens + max(0, request.expected_output_tokens - 1) / 2
        if decode is None:
            step: np.ndarray = cols.before + cols.beta * (cols.a_d * extra_kv + cols.b_d)
            return step
        return np.full(len(cols.indices), decode_step_s(self.instances[decode], extra_kv))

    def _engine_order_gains(
        self, arrays: _Estimates, request: Request, now: float, decode: int | None
    ) -> np.ndarray:
        """G_p of the ``engine-order`` fallback (module docstring) across the candidates: the
        request's own value where the engine's density order puts it, less the delay its
        prefill imposes on the queued requests behind it, priced at their marginal rate."""
        return self.engine_order_terms(arrays, request, now, decode)[0]

    def engine_order_terms(
        self, arrays: _Estimates, request: Request, now: float, decode: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_engine_order_gains` and, per candidate position, the predicted time of the
        request's first token (what ``bench/fleet_why.py`` compares with the realised one)."""
        cols = self._cols
        assert cols is not None
        weights, slo = self.weights, request.slo
        due_first = request.arrival_s + slo.token_due_s(1)
        tokens = max(0, request.expected_output_tokens - 1)
        step = self._decode_steps(request, decode)
        works = cols.request_work(request.prompt_tokens)
        n = len(cols.indices)
        group_of = cols.group_of.tolist()
        own_raw = np.array([works[g][0] for g in group_of])
        pace = self._prefill_pace()
        own_s = pace * own_raw
        if cols.any_prefill:  # one request per batch: a batch overhead per chunk
            own_s += np.where(
                cols.prefill, cols.t_c * np.array([works[g][1] for g in group_of]), 0.0
            )
        ahead = [0.0] * n
        harm_rate = [0.0] * n
        harm_first = [0.0] * n
        pace_list = pace.tolist()
        own_list = own_s.tolist()
        keys = [-request.weight / slide_rank_work(c, request.prompt_tokens) for c, _ in cols.groups]
        orders, instances = self._orders, self.instances
        bisect_right, bisect_left = bisect.bisect_right, bisect.bisect_left
        for k, (index, group) in enumerate(zip(cols.indices, group_of, strict=True)):
            # the kept snapshot while fresh enough (_engine_order's test, inlined: per decision
            # this loop is the fallback's cost)
            cached = orders.get(index)
            queue = instances[index].prefill_queue
            if cached is not None and cached[0][0] is queue:
                order = cached[1]
                mutations = getattr(queue, "mutations", None)
                if mutations is None or mutations - cached[0][1] > ORDER_STALENESS * order.size:
                    order = self._engine_order(instances[index], now, pace_list[k], step, k)
            else:
                order = self._engine_order(instances[index], now, pace_list[k], step, k)
            if not order.size:
                continue
            at = bisect_right(order.neg_density, keys[group])
            if at:  # the prefill done since the order was read went to its head
                wait = order.cum[at] * pace_list[k] - (now - order.built_s)
                if wait > 0.0:
                    ahead[k] = wait
            harm_rate[k] = order.rate_suffix[at]
            on_time = order.on_time_at
            if on_time:  # first tokens it pushes past their deadline
                start = bisect_left(on_time, at)
                if start < len(on_time):
                    harm_first[k] = order.pushed_value(start, own_list[k])
        first_s = now + np.array(ahead) + own_s
        deadline_slack = None
        if slo.deadline_s is not None:
            deadline_slack = request.arrival_s + slo.deadline_s - first_s
        own_decode = _on_time_decode_tokens(
            due_first - first_s, slo.tpot_s, step, tokens, deadline_slack
        )
        own = weights.token_value(request.weight, 1) * (first_s < due_first)
        own = own + weights.token_value(request.weight, 2) * own_decode
        result: np.ndarray = own - own_s * np.array(harm_rate) - np.array(harm_first)
        tpot = slo.tpot_s
        if decode is None and tpot is not None:  # the running decodes it slows past TPOT
            result -= weights.token_value(1.0, 2) * self._decode_hurt(step, tpot, tokens, request)
        return result, first_s

    def _prefill_pace(self) -> np.ndarray:
        """Wall seconds per second of raw prefill work, per candidate position, as the engine
        spends its steps past capacity: co-located, each step of the batch budget ``t_b`` first
        holds the batch overhead and the running decodes (``before``), prefill gets the rest
        (at least :data:`PREFILL_SHARE_FLOOR` of it); a PD prefill instance runs prefill alone
        (its batch overheads per chunk are counted apart)."""
        cols = self._cols
        assert cols is not None
        budget = cols.budgets[1]
        usable = np.isfinite(budget) & (budget > 0.0)
        room = np.maximum(budget - cols.before, PREFILL_SHARE_FLOOR * budget)
        stretch = np.divide(budget, room, out=np.ones_like(budget), where=usable)
        if cols.any_prefill:
            stretch = np.where(cols.prefill, 1.0, stretch)
        pace: np.ndarray = cols.beta * stretch
        if self._pace_correction:
            get = self._pace_correction.get
            pace = pace * np.array([get(i, 1.0) for i in cols.indices])
        return pace

    def _decode_hurt(
        self, step: np.ndarray, tpot: float, tokens: float, request: Request
    ) -> np.ndarray:
        """Co-located: late tokens of the running decodes while the request's own decode
        keeps the step past the TPOT SLO, per candidate position (the expected-gain
        fallback's last term, module docstring)."""
        cols = self._cols
        assert cols is not None
        n = len(cols.indices)
        loss = np.zeros(n)
        hurt = (cols.decoding > 0.0) & (step > tpot)
        if hurt.any():
            inverse_step = np.divide(1.0, step, out=np.zeros(n), where=hurt)  # step > 0
            late_rate = 1.0 / np.maximum(cols.before, tpot) - inverse_step
            cols.stream_suffixes()
            mean_weight = np.where(cols.mean_known, cols.mean_weight, request.weight)
            np.copyto(loss, mean_weight * cols.n_d * late_rate * tokens * step, where=hurt)
        return loss

    def _engine_order(
        self, instance: InstanceView, now: float, pace: float, step: np.ndarray, k: int
    ) -> _EngineOrder:
        """The instance's queue in the engine's order, built with the time, drain and decode
        step of the decision that found it stale: when the queue object changed, or once the
        requests that entered or left it since exceed :data:`ORDER_STALENESS` of its length
        (a few requests among many move the order's sums by that share at most; rebuilding on
        every change would cost O(W) per decision)."""
        queue = instance.prefill_queue
        mutations = getattr(queue, "mutations", None)
        cached = self._orders.get(instance.index)
        if cached is not None:
            key, order = cached
            if (
                key[0] is queue
                and mutations is not None
                and mutations - key[1] <= ORDER_STALENESS * order.size
            ):
                return order
        plain = queue if isinstance(queue, PrefillQueue) else PrefillQueue(queue)
        density = plain.density_order(
            instance.estimator.coefficients, instance.profile.engine.max_num_batched_tokens
        )
        self._advance(instance.index, plain, density, now, pace)
        built = _EngineOrder(
            density,
            self.weights.token_value(1.0, 2),
            self.weights.token_value(1.0, 1),
            now,
            pace,
            float(step[k]),
        )
        self._orders[instance.index] = ((queue, mutations), built)
        return built

    def _advance(
        self, index: int, queue: PrefillQueue, order: DensityOrder, now: float, pace: float
    ) -> None:
        """Move the router's model of the engine's prefill progress on ``queue`` to ``now``:
        the prefill work the time since the last move buys at ``pace`` goes to the head of the
        engine's order, finishing prompts and then part of the next (which then ranks by what
        is left, as ``slide`` ranks it). The router sees no progress, only first tokens; this
        is what it believes."""
        last = self._advanced.get(index)
        self._advanced[index] = (queue, now)
        if last is None or last[0] is not queue or not pace > 0.0:
            return
        budget = (now - last[1]) / pace
        works, entries = order.works, order.entries
        start = 0
        while budget > 0.0:
            head = next((i for i in range(start, len(works)) if works[i] > 0.0), None)
            if head is None:
                return
            entry, rest = entries[head], works[head]
            request_id = entry.request.request_id
            if budget >= rest:
                queue.progress(request_id, entry.prompt_tokens)
                budget -= rest
                # it moved forward among the finished (everything before it): the next with
                # work left is past its old place
                start = head + 1
                continue
            left = entry.prompt_tokens - entry.computed
            queue.progress(request_id, entry.computed + int(left * budget / rest))
            return

    def decode_at_handoff(
        self, request: Request, decision: RouteDecision, now: float
    ) -> RouteDecision:
        """With ``decode_choice="capacity"``, the decode instance is re-picked when the first
        token is out: the dispatch-time pick is made seconds earlier under load, when the
        instance's slots look free, and every request dispatched in a burst then lands on it
        at once (measured: the first-to-second-token gap's p99 was 2 s at 7x on azure_conv PD).
        """
        if self.decode_choice != "capacity" or decision.decode_instance is None:
            return decision
        target = pick_decode_by_capacity(self.instances, request)
        if target == decision.decode_instance:
            return decision
        return dataclasses.replace(decision, decode_instance=target)

    def drain_s(self, instance: InstanceView, now: float) -> float:
        """Exec(p): the wait a newcomer would see on ``instance`` before its own prefill (its
        queued prefills' drain time, lag-compensated, plus decode interference)."""
        return self._exec(instance, self._phi(instance, self._summary(instance), now), now)

    def _phi(self, instance: InstanceView, summary: _QueueSummary, now: float) -> float:
        """phi(Q_p): the drain time of the instance's queued prefills (module docstring)."""
        est = instance.estimator
        if instance.role is InstanceRole.PREFILL:
            return est.beta * summary.raw_work + est.t_c * summary.chunks
        factor = self._batch_factor(summary.min_remaining_s(now), summary.min_tpot_s, est.t_c)
        return factor * est.beta * summary.raw_work

    @staticmethod
    def _exec(instance: InstanceView, phi: float, now: float) -> float:
        updated = instance.queue_updated_s
        if instance.external_prefills is not None:
            updated = max(updated, instance.external_prefills.updated_s)
        lag = max(0.0, now - updated)
        return max(0.0, phi - lag) + instance.num_decoding * instance.estimator.decode_time(0)

    def _batch_factor(self, remain_s: float, min_tpot_s: float, t_c: float) -> float:
        """Eq. 8's ``t_b / (t_b - t_c)``: wall time per second of prefill work at budget t_b."""
        floor = 2.0 * t_c
        if math.isfinite(min_tpot_s):
            floor = max(floor, self.eta * min_tpot_s)
        budget = max(min(remain_s, min_tpot_s), floor)
        if not math.isfinite(budget) or budget <= t_c:  # no deadline in sight, or t_c == 0
            return 1.0
        return budget / (budget - t_c)

    def _summary(self, instance: InstanceView) -> _QueueSummary:
        queue, external = instance.prefill_queue, instance.external_prefills
        key = (
            id(queue),
            len(queue),
            getattr(queue, "mutations", None),
            instance.queue_updated_s,
            external,
        )
        cached = self._summaries.get(instance.index)
        if cached is not None and cached[0] == key:
            return cached[1]
        totals = instance.prefill_totals  # O(1)
        raw_work, chunks, min_tpot = totals.raw_work, totals.chunks, totals.min_tpot_s
        if not isinstance(queue, PrefillQueue):  # a plain dict assigned after construction
            queue = PrefillQueue(queue)
        order = queue.deadline_order()  # kept sorted by the queue: no walk, no sort here
        # the queue's own list, not a copy: a copy per changed queue is a young list of W floats
        # that the garbage collector's next pass walks (most of a decision's tail); the queue
        # changes it in place, and every change is seen (length, update time, callbacks) before
        # this summary is read again
        padded = order.padded
        # the weights read in place (summed at once: the queue's buffers must stay resizable);
        # the streaming ones only if the fallback asks
        weights = np.frombuffer(order.weights, dtype=np.float64)
        external_at = None
        if external is not None:  # work and deadline pressure only: no gain of ours (docstring)
            raw_work += external.raw_work
            chunks += external.chunks
            min_tpot = min(min_tpot, external.min_tpot_s)
            if math.isfinite(external.earliest_deadline_s):
                at = bisect.bisect_right(padded, external.earliest_deadline_s, 0, len(padded) - 1)
                padded = padded.copy()  # the queue's own list stays the queue's
                padded.insert(at, external.earliest_deadline_s)
                weights = np.insert(weights, at, 0.0)
                external_at = at
        summary = _QueueSummary(
            padded,
            weights,
            raw_work,
            chunks,
            min_tpot,
            order,
            external_at,
            order.decode_tokens_weighted,
        )
        del weights  # release the queue's buffer
        self._summaries[instance.index] = (key, summary)
        return summary

    # ---- state updates: drop the memo of the queue that changed ----------------------------

    def on_dispatch(self, request: Request, decision: RouteDecision, now: float) -> None:
        super().on_dispatch(request, decision, now)
        self._summaries.pop(decision.instance, None)
        self._dirty.add(decision.instance)
        promise = self._promise
        if promise is not None:
            self._promise = None
            rid, instance, wait = promise
            if rid == request.request_id and instance == decision.instance:
                self._promised[rid] = (instance, now, wait)

    def on_first_token(self, request: Request, decision: RouteDecision, now: float) -> None:
        super().on_first_token(request, decision, now)
        self._summaries.pop(decision.instance, None)
        self._dirty.add(decision.instance)
        promised = self._promised.pop(request.request_id, None)
        if promised is not None:
            instance, sent_s, wait = promised
            if wait > CALIBRATION_MIN_WAIT_S:
                ratio = min(max((now - sent_s) / wait, 0.25), 4.0)
                c = self._pace_correction.get(instance, 1.0) * ratio ** (1.0 - CALIBRATION_THETA)
                self._pace_correction[instance] = min(max(c, 0.5), 4.0)

    def on_finish(
        self, request: Request, decision: RouteDecision, now: float, *, saw_first_token: bool
    ) -> None:
        super().on_finish(request, decision, now, saw_first_token=saw_first_token)
        self._summaries.pop(decision.instance, None)
        self._dirty.add(decision.instance)
        self._promised.pop(request.request_id, None)


def own_prefills(instance: InstanceView) -> ExternalPrefills:
    """This router's queued prefills on ``instance`` as the summary another router in front of
    the same instance adds to its own view (:attr:`InstanceView.external_prefills`): O(1), from
    the queue's running totals (:attr:`InstanceView.prefill_totals`)."""
    totals = instance.prefill_totals
    return ExternalPrefills(
        totals.num_requests,
        totals.prompt_tokens,
        totals.raw_work,
        totals.chunks,
        totals.min_tpot_s,
        totals.earliest_deadline_s,
        instance.queue_updated_s,
    )


def _suffix_sums(values: np.ndarray) -> np.ndarray:
    """``out[i] = sum(values[i:])``, ``out[len(values)] = 0``, summed from the end one value at a
    time (numpy's accumulate: the order, and so the rounding, of a left fold over the reversed
    values starting at 0)."""
    n = len(values)
    out = np.empty(n + 1)
    out[n] = 0.0
    if n:  # accumulated straight into out[:n], back to front
        np.add.accumulate(values[::-1], out=out[n - 1 :: -1])
    return out


def _batch_factors(budget: np.ndarray, floor: np.ndarray, t_c: np.ndarray) -> np.ndarray:
    """:meth:`GoRouter._batch_factor` across instances (``t_c`` broadcast against the rows of
    ``budget``), ``budget`` being ``min(remaining, min TPOT)`` before the floor ``max(2 t_c, eta *
    min TPOT)`` (TPOT finite): the budget at least the floor (in place), then ``budget / (budget -
    t_c)`` where it is finite and above ``t_c``, else 1. The same values element by element as
    the scalar form (max of two floats is one of them)."""
    np.maximum(budget, floor, out=budget)
    usable = (budget < math.inf) & (budget > t_c)
    return np.divide(budget, budget - t_c, out=np.ones_like(budget), where=usable)


def _on_time_decode_tokens(
    slack_s: np.ndarray,
    tpot_s: float | None,
    step_s: np.ndarray,
    tokens: float,
    deadline_slack_s: np.ndarray | None,
) -> np.ndarray:
    """:func:`on_time_decode_tokens` across instances (``deadline_slack_s`` None: no end-to-end
    deadline); each branch a mask, where the divisions are computed only where they are defined."""
    n = len(slack_s)
    if tokens <= 0:
        return np.zeros(n)
    live = step_s > 0.0
    upper: np.ndarray | float
    if deadline_slack_s is None:
        upper = float(tokens)  # broadcast: the same value at every instance
    else:
        ratio = np.divide(deadline_slack_s, step_s, out=np.zeros(n), where=live)
        upper = np.minimum(float(tokens), np.maximum(0.0, ratio))
    if tpot_s is None:
        return np.where(live, upper, 0.0)
    gap = tpot_s - step_s
    # -slack / gap (= slack / -gap: IEEE division is odd in each operand), inf where gap == 0:
    # ahead (gap > 0), a late request catches up after it (lower bound, 0 if on time); behind,
    # an early one falls behind after it (upper bound; no bound at gap == 0, none on time if late)
    crossing = np.divide(-slack_s, gap, out=np.full(n, math.inf), where=gap != 0.0)
    caught_up = np.maximum(0.0, upper - np.maximum(crossing, 0.0))
    fallen_behind = np.where(slack_s > 0.0, np.minimum(upper, crossing), 0.0)
    out: np.ndarray = np.where(gap > 0.0, caught_up, fallen_behind)
    if not live.all():
        np.copyto(out, 0.0, where=~live)
    return out


def _first_min(values: np.ndarray, mask: np.ndarray) -> int:
    """Position of the smallest of ``values`` where ``mask``, the first one on a tie."""
    positions = mask.nonzero()[0]
    return int(positions[values[positions].argmin()])


def _read_plain(view: InstanceView) -> tuple[Any, ...]:
    """:data:`_READS` of ``view`` whatever its queue (:data:`_READS_PLAIN` for a plain dict)."""
    if isinstance(view.prefill_queue, PrefillQueue):
        read: tuple[Any, ...] = _READS(view)
        return read
    read = _READS_PLAIN(view)
    return (*read[:6], len(view.prefill_queue), *read[7:])


def _updated_s(instance: InstanceView) -> float:
    """When the instance's queue (its own, or other routers' summary) last changed."""
    updated = instance.queue_updated_s
    external = instance.external_prefills
    if external is not None and external.updated_s > updated:
        return external.updated_s
    return updated


def on_time_decode_tokens(
    *,
    slack_s: float,
    tpot_s: float | None,
    step_s: float,
    tokens: float,
    deadline_slack_s: float = math.inf,
) -> float:
    """Decode tokens (2nd onwards, ``tokens`` of them) on time when the first token comes
    ``slack_s`` before its due time (negative: late) and one more comes every ``step_s``.

    Token ``1 + j`` is due ``j * tpot_s`` after the first's due time, so it is on time when
    ``slack_s + j * (tpot_s - step_s) > 0``: from some ``j`` on when the decoder is faster than
    TPOT (a late request catches up), up to some ``j`` when it is slower; an end-to-end
    deadline ``deadline_slack_s`` after the first token allows ``deadline_slack_s / step_s`` more.
    Continuous (no rounding): a router compares instances with it, it never counts tokens.
    """
    deadline = None if math.isinf(deadline_slack_s) else np.array([deadline_slack_s])
    on_time = _on_time_decode_tokens(
        np.array([slack_s]), tpot_s, np.array([step_s]), tokens, deadline
    )
    return float(on_time[0])
