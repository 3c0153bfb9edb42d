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
request to a slow instance as often as to a fast one, so by default (``fallback="expected-gain"``)
the router picks the instance of the largest **expected gain** ``G_p`` — *beyond the paper*:

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
``on_*`` callbacks drop when that queue changes. Per decision the cost is then O(log |Q|) per
instance; prompt work is cached per (profile coefficients, chunk size, prompt length), and the
queue's total work, chunks and smallest TPOT SLO come from its running totals
(:class:`~priority.routing.prefill_queue.PrefillQueue`), so a rebuilt summary walks the queue
only for the per-request deadlines and values it sorts.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from priority.gain import GainWeights
from priority.request import Request
from priority.routing.base import (
    ExternalPrefills,
    InstanceRole,
    InstanceView,
    RouteDecision,
    Router,
)
from priority.routing.decode import decode_step_s, pick_decode_by_capacity, running_decodes_s
from priority.routing.prefill_queue import PrefillQueue
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
FALLBACKS = ("expected-gain", "random")
"""What GoRouting does when no instance meets the request's SLO (module docstring)."""
GAP_FLOOR = 0.1
"""Floor of ``|TPOT - s|`` as a fraction of TPOT in the queued requests' decode loss: near
``s = TPOT`` a delay moves a late request's catch-up point by an unbounded number of tokens in
the closed form; the floor bounds that at ten tokens per TPOT of delay (the cap by their
expected tokens bounds the total)."""

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


@dataclass(frozen=True, slots=True)
class _QueueSummary:
    """Everything GoRouting needs from one instance's queue; rebuilt only when the queue changes."""

    deadlines: list[float]
    """First-token deadlines, ascending."""
    value_suffix: list[float]
    """``value_suffix[i]`` = total tier weight of the requests with deadlines[i:] (times the
    first-token weight: their first-token value)."""
    raw_work: float
    chunks: int
    min_tpot_s: float
    stream_weight_suffix: list[float]
    """``stream_weight_suffix[i]``: total tier weight of the streaming requests with
    deadlines[i:] (the expected-gain fallback's decode loss)."""
    decode_tokens_weighted: float
    """Sum over queued streaming requests of tier weight times expected decode tokens."""

    def min_remaining_s(self, now: float) -> float:
        """Time to the earliest first-token deadline not yet past (inf if none)."""
        first_live = bisect.bisect_right(self.deadlines, now)
        return self.deadlines[first_live] - now if first_live < len(self.deadlines) else math.inf


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
    ) -> None:
        super().__init__(instances)
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
            int, tuple[tuple[int, int, float, ExternalPrefills | None], _QueueSummary]
        ] = {}

    # ---- Algorithm 2 ----------------------------------------------------------------------

    def route(self, request: Request, now: float) -> RouteDecision:
        """Algorithm 2. Pure apart from the random draw of the fallback branch."""
        estimates = self.estimates(prefill_candidates(self.instances), request, now)
        decode = (
            pick_decode_by_capacity(self.instances, request)
            if self.decode_choice == "capacity"
            else pick_decode_instance(self.instances)
        )
        if self.fallback == "expected-gain" and max(e.delta for e in estimates) <= 0.0:
            gains = self.fallback_gains(estimates, request, now, decode)
            best = max(gains)
            tie = _RELATIVE_TIE * max(1.0, abs(best))
            chosen = min(
                (e for e, g in zip(estimates, gains, strict=True) if g >= best - tie),
                key=lambda e: (e.exec_with_s, e.index),
            )
        else:
            chosen = self._select(estimates, request)
        return RouteDecision(
            instance=chosen.index,
            decode_instance=decode,
            expected_gain=chosen.delta,
            predicted_ttft_s=chosen.exec_with_s,
        )

    def _select(self, estimates: list[InstanceEstimate], request: Request) -> InstanceEstimate:
        deltas = [e.delta for e in estimates]
        delta_max = max(deltas)
        if delta_max <= 0.0:
            pool = estimates
            if self.avoid_harm_on_fallback:
                tie = _RELATIVE_TIE * max(1.0, abs(delta_max))
                pool = [e for e in estimates if e.delta >= delta_max - tie]
            return pool[int(self.rng.integers(len(pool)))]
        threshold = self.alpha * delta_max
        candidates = [e for e in estimates if e.delta >= threshold]
        ttft = request.slo.token_due_s(1)
        light = [e for e in candidates if e.exec_s < self.mu * ttft]
        if light:
            return min(light, key=lambda e: (e.exec_s, e.index))
        safe = [e for e in candidates if not e.exec_with_s > self.lambda_ * ttft]
        if safe:
            return min(safe, key=lambda e: (-e.exec_s, e.index))
        return min(candidates, key=lambda e: (e.exec_s, e.index))

    # ---- EstimateGain / EstimateExec ------------------------------------------------------

    def estimate(self, instance: InstanceView, request: Request, now: float) -> InstanceEstimate:
        """Exec and gain of ``instance`` without and with ``request`` (see the module docstring)."""
        return self.estimates([instance], request, now)[0]

    def estimates(
        self, instances: Sequence[InstanceView], request: Request, now: float
    ) -> list[InstanceEstimate]:
        """:meth:`estimate` of each of ``instances``, in one loop: a decision makes one per
        instance, so the phi, batch-factor and lag terms (:meth:`_phi`, :meth:`_exec`) are
        written out inline here, and the request's prompt work is looked up once per profile."""
        slo = request.slo
        req_deadline = request.arrival_s + slo.token_due_s(1)
        req_remain = req_deadline - now if req_deadline > now else math.inf
        req_tpot = slo.tpot_s if slo.tpot_s is not None else math.inf
        req_value = self.weights.token_value(request.weight, 1)
        first, eta, prompt = self.weights.first_token, self.eta, request.prompt_tokens
        prefill_role = InstanceRole.PREFILL
        bisect_right, inf = bisect.bisect_right, math.inf
        summary_of = self._summary
        work: dict[tuple[int, int], tuple[float, int]] = {}
        out: list[InstanceEstimate] = []
        for instance in instances:
            est = instance.estimator
            c, beta = est.coefficients, est.beta
            t_c = beta * c.t_c
            chunk = instance.profile.engine.max_num_batched_tokens
            key = (id(c), chunk)
            req_work = work.get(key)
            if req_work is None:
                req_work = work[key] = raw_prefill_work(c, chunk, prompt)
            req_raw, req_chunks = req_work
            summary = summary_of(instance)
            deadlines = summary.deadlines
            live = bisect_right(deadlines, now)
            remain = deadlines[live] - now if live < len(deadlines) else inf
            if instance.role is prefill_role:
                phi_before = beta * summary.raw_work + t_c * summary.chunks
                phi_after = phi_before + beta * req_raw + t_c * req_chunks
            else:
                # Eq. 8's t_b / (t_b - t_c), before and with the request (see _batch_factor)
                min_tpot = summary.min_tpot_s
                floor = 2.0 * t_c
                if min_tpot < inf and eta * min_tpot > floor:
                    floor = eta * min_tpot
                budget = min(remain, min_tpot)
                budget = budget if budget > floor else floor
                factor = budget / (budget - t_c) if budget < inf and budget > t_c else 1.0
                phi_before = factor * beta * summary.raw_work
                tpot_after = min(min_tpot, req_tpot)
                floor = 2.0 * t_c
                if tpot_after < inf and eta * tpot_after > floor:
                    floor = eta * tpot_after
                budget = min(remain, req_remain, tpot_after)
                budget = budget if budget > floor else floor
                factor = budget / (budget - t_c) if budget < inf and budget > t_c else 1.0
                phi_after = factor * beta * (summary.raw_work + req_raw)
            updated = instance.queue_updated_s
            external = instance.external_prefills
            if external is not None and external.updated_s > updated:
                updated = external.updated_s
            left = phi_before - (now - updated if now > updated else 0.0)
            exec_s = (left if left > 0.0 else 0.0) + instance.num_decoding * beta * c.b_d
            exec_with_s = exec_s + (phi_after - phi_before)
            suffix = summary.value_suffix
            gain_before = first * suffix[bisect_right(deadlines, now + exec_s)]
            gain_after = first * suffix[bisect_right(deadlines, now + exec_with_s)]
            if now + exec_with_s < req_deadline:
                gain_after += req_value
            out.append(
                InstanceEstimate(instance.index, exec_s, exec_with_s, gain_before, gain_after)
            )
        return out

    def fallback_gain(
        self, estimate: InstanceEstimate, request: Request, now: float, decode: int | None
    ) -> float:
        """G_p of the expected-gain fallback (module docstring) for one instance's estimate;
        ``decode`` is the PD decode instance (None: co-located, the request decodes in place)."""
        return self.fallback_gains([estimate], request, now, decode)[0]

    def fallback_gains(
        self,
        estimates: Sequence[InstanceEstimate],
        request: Request,
        now: float,
        decode: int | None,
    ) -> list[float]:
        """:meth:`fallback_gain` of each estimate, what depends only on the request (and, under
        PD, on its decode instance) worked out once."""
        weights, slo = self.weights, request.slo
        due_first = request.arrival_s + slo.token_due_s(1)
        deadline_at = None if slo.deadline_s is None else request.arrival_s + slo.deadline_s
        tokens = max(0, request.expected_output_tokens - 1)
        extra_kv = request.prompt_tokens + tokens / 2
        decode_value = weights.token_value(request.weight, 2)
        unit_value = weights.token_value(1.0, 2)
        tpot = slo.tpot_s
        pd_step = None if decode is None else decode_step_s(self.instances[decode], extra_kv)
        instances, summary_of = self.instances, self._summary
        gains: list[float] = []
        for estimate in estimates:
            instance = instances[estimate.index]
            summary = summary_of(instance)
            first_s = now + estimate.exec_with_s
            step = pd_step if pd_step is not None else decode_step_s(instance, extra_kv)
            own_decode = on_time_decode_tokens(
                slack_s=due_first - first_s,
                tpot_s=tpot,
                step_s=step,
                tokens=tokens,
                deadline_slack_s=math.inf if deadline_at is None else deadline_at - first_s,
            )
            # Delta_p: own first-token value if met, minus the queued ones pushed past theirs
            own = estimate.delta + decode_value * own_decode
            # decode tokens the queued requests lose by the delay (|TPOT - s| floored, capped)
            delay = estimate.exec_with_s - estimate.exec_s
            loss = 0.0
            if delay > 0.0 and summary.decode_tokens_weighted > 0.0:
                tpot_q = summary.min_tpot_s
                gap = tpot_q - step
                stream = summary.stream_weight_suffix
                if gap > 0.0:  # late after the push: they catch up later
                    cut = bisect.bisect_right(summary.deadlines, now + estimate.exec_with_s)
                    exposed = stream[0] - stream[cut]
                else:  # not yet late before the push: they fall behind sooner
                    cut = bisect.bisect_right(summary.deadlines, now + estimate.exec_s)
                    exposed = stream[cut]
                rate = 1.0 / max(abs(gap), GAP_FLOOR * tpot_q)
                loss = min(exposed * delay * rate, summary.decode_tokens_weighted)
            # co-located: the request's decode slowing the running decodes past their TPOT
            if decode is None and tpot is not None and instance.num_decoding and step > tpot:
                before = instance.estimator.t_c + running_decodes_s(instance)
                late_rate = 1.0 / max(before, tpot) - 1.0 / step
                queued_weight = summary.stream_weight_suffix[0]
                queue = instance.prefill_queue
                mean_weight = (
                    queued_weight / len(queue) if queue and queued_weight else request.weight
                )
                n_d = min(instance.num_decoding, instance.profile.engine.max_num_seqs)
                loss += mean_weight * n_d * late_rate * tokens * step
            gains.append(own - unit_value * loss)
        return gains

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
        key = (id(queue), len(queue), instance.queue_updated_s, external)
        cached = self._summaries.get(instance.index)
        if cached is not None and cached[0] == key:
            return cached[1]
        totals = instance.prefill_totals  # O(1)
        raw_work, chunks, min_tpot = totals.raw_work, totals.chunks, totals.min_tpot_s
        if not isinstance(queue, PrefillQueue):  # a plain dict assigned after construction
            queue = PrefillQueue(queue)
        order = queue.deadline_order()  # kept sorted by the queue: no walk, no sort here
        deadlines, weights, stream = list(order.deadlines), order.weights, order.stream_weights
        if external is not None:  # work and deadline pressure only: no gain of ours (docstring)
            raw_work += external.raw_work
            chunks += external.chunks
            min_tpot = min(min_tpot, external.min_tpot_s)
            if math.isfinite(external.earliest_deadline_s):
                at = bisect.bisect_right(deadlines, external.earliest_deadline_s)
                deadlines.insert(at, external.earliest_deadline_s)
                weights, stream = list(weights), list(stream)
                weights.insert(at, 0.0)
                stream.insert(at, 0.0)
        summary = _QueueSummary(
            deadlines,
            _suffix_sums(weights),
            raw_work,
            chunks,
            min_tpot,
            _suffix_sums(stream),
            order.decode_tokens_weighted,
        )
        self._summaries[instance.index] = (key, summary)
        return summary

    # ---- state updates: drop the memo of the queue that changed ----------------------------

    def on_dispatch(self, request: Request, decision: RouteDecision, now: float) -> None:
        super().on_dispatch(request, decision, now)
        self._summaries.pop(decision.instance, None)

    def on_first_token(self, request: Request, decision: RouteDecision, now: float) -> None:
        super().on_first_token(request, decision, now)
        self._summaries.pop(decision.instance, None)

    def on_finish(
        self, request: Request, decision: RouteDecision, now: float, *, saw_first_token: bool
    ) -> None:
        super().on_finish(request, decision, now, saw_first_token=saw_first_token)
        self._summaries.pop(decision.instance, None)


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


def _suffix_sums(values: list[float]) -> list[float]:
    """``out[i] = sum(values[i:])``, ``out[len(values)] = 0`` (C-speed accumulation)."""
    out = list(accumulate(reversed(values), initial=0.0))
    out.reverse()
    return out


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
    if tokens <= 0 or step_s <= 0:
        return 0.0
    upper = (
        tokens if math.isinf(deadline_slack_s) else min(tokens, max(0.0, deadline_slack_s / step_s))
    )
    if tpot_s is None:
        return upper
    gap = tpot_s - step_s
    if gap > 0.0:
        lower = 0.0 if slack_s >= 0.0 else -slack_s / gap
        return max(0.0, upper - lower)
    if slack_s <= 0.0:
        return 0.0
    return upper if gap == 0.0 else min(upper, slack_s / -gap)
