"""An instance's queued prefills with a running summary, kept as requests enter and leave.

Routing asks the same questions of a prefill queue on every event — how many requests, how many
prompt tokens, how much chunked prefill work, the smallest TPOT SLO, the earliest first-token
deadline — and answering them by walking the queue costs O(W) per event with W queued. A
:class:`PrefillQueue` is the ``dict`` the router already keeps (request id -> request), whose
mutators also update those totals, so :meth:`PrefillQueue.totals` answers in O(1) (amortized
O(log W) for the two minima); code that mutates it as a plain dict stays correct.

Choices, and why:

* **Work is exact.** Each request's raw prefill work is added as an integer count of 2**-1074 s
  (every finite float is one exactly), so removals leave no drift and the float read back is the
  correctly rounded sum of the queued requests' work — what :func:`math.fsum` of them gives,
  whatever order they came and went in (a running float sum would carry the rounding of
  requests long gone; recomputing when the queue empties would bound that, not remove it).
  A walk's left-to-right float sum can differ from it in the last bits only.
* **Work follows the estimator lazily.** Raw work depends on the instance's latency coefficients
  and chunk size (``max_num_batched_tokens``), not on the momentum correction ``beta`` (which
  multiplies it later). The totals remember the pair they were computed for; asked with another
  (a view given a new profile or estimator), they are recomputed once, O(W), and kept up to date
  for the new pair from then on. Until first asked, adds and removals skip the work entirely.
* **Minima by lazily pruned heaps.** Removing a request may remove the minimum; a rescan then
  costs O(W), and FIFO-ish queues remove their earliest deadline first, i.e. nearly always.
  Each minimum is a heap of (value, token, id) triples checked, when they reach the top, to
  still name the entry queued under that id with that token (no reference to the request: a
  removed request is freed at once, not when its pair is dropped; fewer objects outlive a
  change, so the garbage collector's young passes come less often); stale triples are dropped
  there, and the heap is
  rebuilt from the live entries once stale ones outnumber them (checked on every push, so also
  when no one asks), so it stays O(W) in size and every operation costs amortized O(log W).
  Equal values put the newest on top: TPOT SLOs take a few values, and a queue that loses its
  oldest request then keeps its top (no pop on the router's next question).
* **The earliest deadline from the deadline order**, once a router asked for that order
  (:meth:`PrefillQueue.deadline_order`, kept sorted from then on): its first deadline, O(1),
  and no heap of deadlines is kept beside it.
* **The density order, kept sorted too** (:meth:`PrefillQueue.density_order`), once a router
  asked for it: the order in which ``slide`` serves waiting prefills past capacity (first-token
  value per second of the whole prompt as one piece, :func:`slide_rank_work`), so that a router
  modelling that engine reads it instead of sorting the queue on every change.
"""

from __future__ import annotations

import bisect
import heapq
import math
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import count
from typing import Any, NamedTuple

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.request import Request

_SCALE_BITS = 1074
"""Every finite float is an integer multiple of 2**-1074 (the smallest subnormal)."""

_SCALE = 1 << _SCALE_BITS

_MISSING: Any = object()


@lru_cache(maxsize=1 << 16)
def raw_prefill_work(
    coefficients: LatencyCoefficients, chunk_tokens: int, prompt_tokens: int
) -> tuple[float, int]:
    """Uncorrected (beta = 1) prefill time of a prompt in chunks, and the number of chunks.

    Cached: it depends only on the profile and the prompt length, never on the queue. Each
    chunk's time is :meth:`BatchLatencyEstimator.prefill_time` at ``beta = 1`` written out (the
    same float operations: a product by 1.0 is exact).
    """
    a_p, b_p, c_p, d_p = coefficients.a_p, coefficients.b_p, coefficients.c_p, coefficients.d_p
    total, done, chunks = 0.0, 0, 0
    while done < prompt_tokens:
        l_q = min(chunk_tokens, prompt_tokens - done)
        total += l_q * (a_p * l_q + b_p * done + c_p) + d_p * done
        done += l_q
        chunks += 1
    return total, chunks


@lru_cache(maxsize=1 << 16)
def slide_rank_work(
    coefficients: LatencyCoefficients, remaining_tokens: int, computed_tokens: int = 0
) -> float:
    """What ``slide`` divides a prefill's first-token value by to rank it (its ``exec``, at
    ``beta = 1``): the estimator's time of the rest of the prompt as one piece over what is
    already computed (:meth:`BatchLatencyEstimator.request_time`), not the chunked work it
    really takes — past one chunk the two differ, and so does the order; a prompt partly
    prefilled ranks by what is left, so it climbs as it progresses. Floored as ``slide``
    floors it."""
    estimator = BatchLatencyEstimator(coefficients)
    return max(estimator.request_time(remaining_tokens, computed_tokens), 1e-12)


def _exact(value: float) -> int:
    """``value`` as an exact integer count of 2**-1074 (``value`` finite)."""
    numerator, denominator = value.as_integer_ratio()  # denominator: a power of two
    return numerator << (_SCALE_BITS + 1 - denominator.bit_length())


@lru_cache(maxsize=1 << 16)
def _exact_work(
    coefficients: LatencyCoefficients, chunk_tokens: int, prompt_tokens: int
) -> tuple[int, int]:
    """:func:`raw_prefill_work` with its time as an exact integer (see :func:`_exact`)."""
    work, chunks = raw_prefill_work(coefficients, chunk_tokens, prompt_tokens)
    return _exact(work), chunks


class PrefillTotals(NamedTuple):
    """What routing needs of a prefill queue, in one instance's estimator units."""

    num_requests: int
    prompt_tokens: int
    raw_work: float
    """Sum of the uncorrected (beta = 1) chunked prefill time of the prompts (seconds)."""
    chunks: int
    min_tpot_s: float
    """Smallest TPOT SLO among them (inf: none)."""
    earliest_deadline_s: float
    """Earliest first-token deadline among them (inf: none)."""


@dataclass(eq=False, slots=True)
class _Entry:
    """One queued request's share of the totals, as it was when it entered (so that leaving
    takes away exactly what entering added, even if the request object changed meanwhile)."""

    request: Request
    prompt_tokens: int
    tpot_s: float
    deadline_s: float
    work: int = 0
    chunks: int = 0
    neg_density: float = 0.0
    """Minus its weight per second of :func:`slide_rank_work` (set while a density order is
    kept, for the coefficients it is kept for)."""
    computed: int = 0
    """Prompt tokens a router believes prefilled (:meth:`PrefillQueue.progress`)."""
    token: int = 0
    """When it entered (the queue's count of entries so far): a heap's pair names its entry by
    key and token, not by reference, so that a stale pair keeps no request alive."""

    @property
    def stream_weight(self) -> float:
        """Tier weight if the request streams (has a TPOT SLO), else 0."""
        return self.request.weight if self.tpot_s < math.inf else 0.0


class DeadlineOrder:
    """The queued requests sorted by first-token deadline, as parallel sequences, kept in order as
    requests enter and leave (``insert``/``del``: a C memmove, O(W) bytes but no Python work per
    queued request), so a router's per-deadline sums are C-speed accumulations instead of a sort
    of the queue on every change. The weights are ``array('d')`` buffers, which numpy reads
    without a copy (:func:`numpy.frombuffer`)."""

    __slots__ = (
        "decode_tokens_weighted",
        "entries",
        "outputs",
        "padded",
        "prompts",
        "stream_weights",
        "tpots",
        "weights",
    )

    def __init__(self, entries: Iterable[_Entry]) -> None:
        ordered = sorted(entries, key=lambda e: e.deadline_s)
        self.padded = [e.deadline_s for e in ordered]
        self.padded.append(math.inf)
        """The deadlines, ascending, then an infinite one that stays last: a router searches
        ``bisect(padded, t, 0, len(entries))`` and reads ``padded[i]`` as the first deadline
        after ``t``. Changed in place by every mutation, so a router may hold on to it (and
        to no copy of it) between the queue's changes."""
        self.entries = ordered
        self.weights = array("d", [e.request.weight for e in ordered])
        """Tier weights, in deadline order."""
        self.stream_weights = array("d", [e.stream_weight for e in ordered])
        """Tier weights of streaming requests (0 for end-to-end ones), in deadline order."""
        self.prompts = array("d", [e.prompt_tokens for e in ordered])
        """Prompt lengths, in deadline order (a router's model of the engine's own order)."""
        self.tpots = array("d", [e.tpot_s for e in ordered])
        """TPOT SLOs (inf: none), in deadline order."""
        self.outputs = array("d", [_expected_decodes(e) for e in ordered])
        """Expected decode tokens after the first, in deadline order."""
        self.decode_tokens_weighted = math.fsum(_decode_tokens(e) for e in ordered)
        """Sum over streaming requests of tier weight x expected decode tokens (after the
        first), as they were when they entered."""

    @property
    def deadlines(self) -> list[float]:
        """The deadlines, ascending (a copy)."""
        return self.padded[:-1]

    def add(self, entry: _Entry) -> None:
        at = bisect.bisect_right(self.padded, entry.deadline_s, 0, len(self.entries))
        self.padded.insert(at, entry.deadline_s)
        self.entries.insert(at, entry)
        self.weights.insert(at, entry.request.weight)
        self.stream_weights.insert(at, entry.stream_weight)
        self.prompts.insert(at, entry.prompt_tokens)
        self.tpots.insert(at, entry.tpot_s)
        self.outputs.insert(at, _expected_decodes(entry))
        self.decode_tokens_weighted += _decode_tokens(entry)

    def remove(self, entry: _Entry) -> None:
        at = bisect.bisect_left(self.padded, entry.deadline_s, 0, len(self.entries))
        while self.entries[at] is not entry:
            at += 1
        del self.padded[at], self.entries[at], self.weights[at], self.stream_weights[at]
        del self.prompts[at], self.tpots[at], self.outputs[at]
        if self.entries:
            self.decode_tokens_weighted -= _decode_tokens(entry)
        else:  # no drift left behind by a long run of adds and removals
            self.decode_tokens_weighted = 0.0


class DensityOrder:
    """The queued requests in the order ``slide`` serves waiting prefills past capacity: by
    ``weight / slide_rank_work`` descending, ties by first-token deadline then arrival in the
    queue, as parallel sequences kept in order as requests enter and leave (as
    :class:`DeadlineOrder`), priced for one profile (``coefficients``, ``chunk_tokens``). The
    ``array('d')`` buffers are for numpy (:func:`numpy.frombuffer`), read and let go before
    the queue changes again (an array cannot grow while a buffer of it is held)."""

    __slots__ = (
        "chunk_tokens",
        "coefficients",
        "deadlines",
        "dues",
        "entries",
        "keys",
        "outputs",
        "tpots",
        "weights",
        "works",
    )

    def __init__(
        self, entries: Iterable[_Entry], coefficients: LatencyCoefficients, chunk_tokens: int
    ) -> None:
        self.coefficients = coefficients
        self.chunk_tokens = chunk_tokens
        listed = list(entries)
        for entry in listed:
            self._key(entry)
        ordered = sorted(listed, key=lambda e: (e.neg_density, e.deadline_s))  # stable
        self.entries = ordered
        self.keys = [e.neg_density for e in ordered]
        """Minus the density, ascending (the serving order): a router bisects it."""
        self.deadlines = [e.deadline_s for e in ordered]
        """First-token deadlines, in that order (ascending within equal keys)."""
        self.dues = array("d", self.deadlines)
        self.works = array("d", [self._work(e) for e in ordered])
        """Raw (beta = 1) chunked prefill work (:func:`raw_prefill_work`), in that order."""
        self.weights = array("d", [e.request.weight for e in ordered])
        self.tpots = array("d", [e.tpot_s for e in ordered])
        self.outputs = array("d", [_expected_decodes(e) for e in ordered])

    def _key(self, entry: _Entry) -> float:
        done = entry.computed
        rank = slide_rank_work(self.coefficients, entry.prompt_tokens - done, done)
        entry.neg_density = -(entry.request.weight / rank)
        return entry.neg_density

    def _work(self, entry: _Entry) -> float:
        """The chunked work left (the prompt's less what its computed part took)."""
        c, chunk = self.coefficients, self.chunk_tokens
        work = raw_prefill_work(c, chunk, entry.prompt_tokens)[0]
        if entry.computed:
            work = max(0.0, work - raw_prefill_work(c, chunk, entry.computed)[0])
        return work

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: _Entry) -> None:
        key = self._key(entry)
        lo = bisect.bisect_left(self.keys, key)
        hi = bisect.bisect_right(self.keys, key, lo)
        at = bisect.bisect_right(self.deadlines, entry.deadline_s, lo, hi)
        self.entries.insert(at, entry)
        self.keys.insert(at, key)
        self.deadlines.insert(at, entry.deadline_s)
        self.dues.insert(at, entry.deadline_s)
        self.works.insert(at, self._work(entry))
        self.weights.insert(at, entry.request.weight)
        self.tpots.insert(at, entry.tpot_s)
        self.outputs.insert(at, _expected_decodes(entry))

    def remove(self, entry: _Entry) -> None:
        key = entry.neg_density
        lo = bisect.bisect_left(self.keys, key)
        hi = bisect.bisect_right(self.keys, key, lo)
        at = bisect.bisect_left(self.deadlines, entry.deadline_s, lo, hi)
        while self.entries[at] is not entry:
            at += 1
        del self.entries[at], self.keys[at], self.deadlines[at], self.dues[at]
        del self.works[at], self.weights[at], self.tpots[at], self.outputs[at]


def _decode_tokens(entry: _Entry) -> float:
    return entry.stream_weight * _expected_decodes(entry)


def _expected_decodes(entry: _Entry) -> float:
    return float(max(0, entry.request.expected_output_tokens - 1))


class _LazyMin:
    """Minimum of one value over the live entries of a queue, under removals (module docstring)."""

    __slots__ = ("_heap", "_pick")

    def __init__(self, pick: str) -> None:
        self._pick = pick
        self._heap: list[tuple[float, int, str]] = []
        """(value, -token, key): equal values put the newest on top (a FIFO queue removes its
        oldest, so the top stays live)."""

    def push(self, key: str, entry: _Entry, live: Mapping[str, _Entry]) -> None:
        """Count ``entry`` (just made live under ``key``); ``live``: all the live entries."""
        value: float = getattr(entry, self._pick)
        if value < math.inf:
            heapq.heappush(self._heap, (value, -entry.token, key))
        # mostly stale (removals whose pairs never reached the top): rebuild from the live
        # entries, O(W) after at least W pushes, so that the heap stays O(W) even if the
        # minimum is never asked for
        if len(self._heap) > 2 * len(live) + 16:
            pick = self._pick
            pairs = [(getattr(e, pick), -e.token, k) for k, e in live.items()]
            self._heap = [pair for pair in pairs if pair[0] < math.inf]
            heapq.heapify(self._heap)

    def get(self, live: Mapping[str, _Entry]) -> float:
        """The minimum over ``live`` (inf: none), dropping stale pairs from the top."""
        heap = self._heap
        while heap:
            value, token, key = heap[0]
            entry = live.get(key)
            if entry is not None and entry.token == -token:
                return value
            heapq.heappop(heap)
        return math.inf

    def clear(self) -> None:
        self._heap.clear()


class PrefillQueue(dict[str, Request]):
    """Dispatched requests whose first token has not been seen, by request id, with O(1)
    :meth:`totals` (module docstring). Every ``dict`` mutator keeps the totals."""

    __slots__ = (
        "_chunks",
        "_deadline",
        "_density",
        "_entries",
        "_key",
        "_last",
        "_order",
        "_prompt_tokens",
        "_tokens",
        "_tpot",
        "_work",
        "mutations",
    )

    def __init__(self, items: Mapping[str, Request] | Iterable[tuple[str, Request]] = ()) -> None:
        super().__init__()
        self._entries: dict[str, _Entry] = {}
        self.mutations = 0
        """How many times a request entered or left (or the queue was cleared): a reader that
        kept something derived from the queue knows it is stale when this moved."""
        self._prompt_tokens = 0
        self._key: tuple[LatencyCoefficients, int] | None = None
        """The (coefficients, chunk tokens) that ``_work`` and ``_chunks`` are summed for."""
        self._work = 0
        self._chunks = 0
        self._tokens = count(1)
        self._tpot = _LazyMin("tpot_s")
        self._deadline = _LazyMin("deadline_s")
        self._last: PrefillTotals | None = None
        """The latest answer of :meth:`totals`, until the queue or its pricing changes."""
        self._order: DeadlineOrder | None = None
        """Kept from the first call of :meth:`deadline_order` on."""
        self._density: DensityOrder | None = None
        """Kept from the first call of :meth:`density_order` on (for its latest pricing)."""
        self.update(items)

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt through __init__ (pickle and copy would otherwise set items before the slots)
        return (type(self), (dict(self),))

    # ---- the totals ------------------------------------------------------------------------

    def totals(self, coefficients: LatencyCoefficients, chunk_tokens: int) -> PrefillTotals:
        """The queue's summary, its work in units of ``coefficients`` cut in ``chunk_tokens``."""
        key = self._key
        if key is None or key[1] != chunk_tokens or key[0] is not coefficients:
            if key is None or key != (coefficients, chunk_tokens):
                self._recompute_work(coefficients, chunk_tokens)
                self._last = None
            self._key = (coefficients, chunk_tokens)
        if self._last is None:  # asked again before the next change: the same answer
            self._last = PrefillTotals(
                len(self._entries),
                self._prompt_tokens,
                self._work / _SCALE,  # int / int: correctly rounded
                self._chunks,
                self._tpot.get(self._entries),
                self._earliest_deadline(),
            )
        return self._last

    def _earliest_deadline(self) -> float:
        if self._order is not None:  # kept sorted: its first (the infinite pad if empty)
            return self._order.padded[0]
        return self._deadline.get(self._entries)

    def deadline_order(self) -> DeadlineOrder:
        """The queue sorted by first-token deadline: sorted once, O(W log W), on the first call,
        then kept in order by every mutation (O(W) memmove each)."""
        if self._order is None:
            self._order = DeadlineOrder(self._entries.values())
            self._deadline.clear()  # the order answers the earliest deadline from now on
        return self._order

    def density_order(self, coefficients: LatencyCoefficients, chunk_tokens: int) -> DensityOrder:
        """The queue in ``slide``'s serving order under that profile: sorted on the first call
        (and when asked for another profile), O(W log W), then kept in order by every mutation
        (O(log W) search, O(W) memmove)."""
        order = self._density
        if (
            order is None
            or order.chunk_tokens != chunk_tokens
            or (order.coefficients is not coefficients and order.coefficients != coefficients)
        ):
            order = self._density = DensityOrder(self._entries.values(), coefficients, chunk_tokens)
        return order

    def progress(self, key: str, computed_tokens: int) -> None:
        """Record that ``computed_tokens`` of the request's prompt are believed prefilled (a
        router's model of the engine; clamped to the prompt): only the density order moves
        (the request ranks by what is left, as ``slide`` ranks it); the totals, the deadline
        order and :attr:`mutations` stay as they are. A request not queued is ignored."""
        entry = self._entries.get(key)
        if entry is None:
            return
        done = max(0, min(int(computed_tokens), entry.prompt_tokens))
        if done == entry.computed:
            return
        order = self._density
        if order is not None:
            order.remove(entry)
        entry.computed = done
        if order is not None:
            order.add(entry)

    def computed(self, key: str) -> int:
        """Prompt tokens of ``key`` recorded as prefilled (:meth:`progress`; 0 if not queued)."""
        entry = self._entries.get(key)
        return 0 if entry is None else entry.computed

    def _recompute_work(self, coefficients: LatencyCoefficients, chunk_tokens: int) -> None:
        self._work = self._chunks = 0
        for entry in self._entries.values():
            self._price(entry, coefficients, chunk_tokens)

    def _price(self, entry: _Entry, coefficients: LatencyCoefficients, chunk_tokens: int) -> None:
        entry.work, entry.chunks = _exact_work(coefficients, chunk_tokens, entry.prompt_tokens)
        self._work += entry.work
        self._chunks += entry.chunks

    def _enter(self, key: str, request: Request) -> None:
        self._leave(key)
        tpot = request.slo.tpot_s
        entry = _Entry(
            request,
            request.prompt_tokens,
            math.inf if tpot is None else tpot,
            request.arrival_s + request.slo.token_due_s(1),
            token=next(self._tokens),
        )
        self._entries[key] = entry
        self.mutations += 1
        self._last = None
        self._prompt_tokens += entry.prompt_tokens
        if self._key is not None:
            self._price(entry, *self._key)
        self._tpot.push(key, entry, self._entries)
        if self._order is None:
            self._deadline.push(key, entry, self._entries)
        else:
            self._order.add(entry)
        if self._density is not None:
            self._density.add(entry)

    def _leave(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self.mutations += 1
        self._last = None
        self._prompt_tokens -= entry.prompt_tokens
        self._work -= entry.work
        self._chunks -= entry.chunks
        if self._order is not None:
            self._order.remove(entry)
        if self._density is not None:
            self._density.remove(entry)
        # the heaps drop the entry when it reaches their top (it is no longer in _entries)

    # ---- dict's mutators -------------------------------------------------------------------

    def __setitem__(self, key: str, value: Request) -> None:
        super().__setitem__(key, value)
        self._enter(key, value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._leave(key)

    def pop(self, key: str, default: Any = _MISSING) -> Any:
        if key in self:
            self._leave(key)
            return super().pop(key)
        if default is _MISSING:
            raise KeyError(key)
        return default

    def popitem(self) -> tuple[str, Request]:
        key, value = super().popitem()
        self._leave(key)
        return key, value

    def clear(self) -> None:
        super().clear()
        self.mutations += 1
        self._entries.clear()
        self._last = None
        self._prompt_tokens = self._work = self._chunks = 0
        self._tpot.clear()
        self._deadline.clear()
        self._order = None
        self._density = None

    def setdefault(self, key: str, default: Request | None = None) -> Request | None:  # type: ignore[override]
        if key not in self:
            if default is None:
                raise TypeError("a PrefillQueue holds requests, not None")
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> PrefillQueue:  # type: ignore[override,misc]
        self.update(other)
        return self
