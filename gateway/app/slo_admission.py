"""SLOs-Serve's admission across engines: the planner decides per engine, the gateway tries the
next engine, and only then sheds (503 ``slo_declined`` with ``retry-after``) or demotes.

**Where the decision is made.** An engine running the ``slos-serve`` policy runs SLOs-Serve's
admission planner (:mod:`priority.policies.slos_planner`) at every step and puts what it cannot
serve within its SLO in its best-effort tier. The gateway runs *the same planner*, per candidate
engine, just before dispatch, on that engine's view: its estimator (the engine's own refitted
coefficients and correction, adopted from its ``/metrics``: one performance model, not a second
one in the gateway), its limits (seats, KV blocks, block size, as the engine states them), its
scraped load (running, waiting, KV use), and the requests this gateway placed there and has not
seen finish (their prefill deadlines, decode pace and predicted length bounds). The first engine
whose planner admits the request gets it; the router's choice is asked first, then the other
healthy engines with the least prefill work pending. When every planner declines, the request is
demoted to best effort where its tier allows that, else refused with 503 ``slo_declined``, a
``retry-after`` and the engines' reasons.

*Why the gateway asks, and not the engine refusing and the gateway re-routing:* by the time an
engine's scheduler has declined a request, the request is in the engine's queue, its response
(a stream) has begun, and the engine may already be serving it best effort: taking it back is an
abort that races with its first token, so "declined" and "served" could both happen, and each
re-route costs a round trip and a tokenization on each engine. Asked in the gateway, the
decision is made once, before any engine sees the request, so a declined request is never
served (nothing was sent) and a demoted one is served only as best effort; asking costs a
planner call per engine tried (tens of microseconds with one candidate: the DP has one item).
It also needs no change to the engines' API, so it works in front of stock vLLM with the
plugin. The price is that the gateway's view lags the engine's by up to a scrape; the engine's
own planner stays the authority for what it runs: a request the gateway placed and the engine
then judges unattainable is served best effort there (``tiergate:hopeless_requests``).

**The view of an engine** (:func:`engine_view`): requests this gateway placed there and not yet
past their first token are *forced* items with their prefill deadline, their whole prefill (the
gateway does not see chunk progress) and their decode load from the deadline on; those past it
are running decodes until their predicted end (first token deadline plus the length bound at the
policy's pace), no more of them than the gateway counts decoding there (they may have ended
early). Work the gateway did not place there — other workers' queued prefills (one forced item
from their summary) and decodes it cannot attribute — is counted as running decodes like the
newcomer, at the tightest pace, to the end of the plan (conservative: they could only end
earlier). Free KV is what the engine reported free less the blocks the placed, not yet prefilled
requests will take; free seats are the engine's seats less what runs and waits there.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np

from gateway.app.shedding import MAX_RETRY_AFTER_S, MIN_RETRY_AFTER_S, pending_prefill_s
from gateway.limits import RejectReason
from priority.policies.slos_batch import decode_load, prefill_capacity
from priority.policies.slos_planner import PlanItems, PlannerInput, plan_admission
from priority.request import Request

if TYPE_CHECKING:
    from gateway.app.backends import Backend, ModelGroup
    from gateway.app.metrics import GatewayMetrics
    from priority.estimator import BatchLatencyEstimator

POLICY = "slos-serve"
"""The engine policy (as the engine states it, ``tiergate:engine_config_info``) whose planner
the gateway asks."""
QUANTILE = 0.9
"""Length-bound quantile memory and decode time are planned with (the policy's default)."""
TPOT_SHARE = 0.95
"""A step lasts this share of the tightest TPOT (the policy's default)."""
DEFAULT_STEP_S = 0.1
"""Decode period assumed of a request without a TPOT objective (the policy's)."""
UNSEEN_GRACE_S = 0.5
"""A placed request not yet seen in its engine's prefill queue counts as prefilling this long
(placement comes a few milliseconds before the router is told of the dispatch)."""


class PlanOutcome(StrEnum):
    """What the planners decided for one request (``tiergate_slo_admission_total``)."""

    ADMITTED = "admitted"
    """By the first engine asked."""
    REROUTED = "rerouted"
    """By another engine, after the first declined."""
    DEMOTED = "demoted"
    SHED = "shed"


@dataclass(slots=True)
class Placed:
    """A request the gateway placed on an engine, as that engine's planner budgets it."""

    request_id: str
    deadline_s: float
    """Absolute prefill deadline (the gateway's monotonic clock, as ``Request.arrival_s``)."""
    work_s: float
    load: float
    blocks: int
    period_s: float
    bound: int
    placed_s: float
    seen_queued: bool = False

    @property
    def end_s(self) -> float:
        """Predicted end: first token at the deadline, then one token per period."""
        return self.deadline_s + self.bound * self.period_s


@dataclass(frozen=True, slots=True)
class Placement:
    """The admission decision for one request."""

    outcome: PlanOutcome
    instance: int | None
    """The engine (index in its model group) that admitted it, or None."""
    declined_by: tuple[str, ...] = ()
    """Engines whose planner declined it, in the order asked."""
    retry_after_s: float | None = None
    """For a shed request: when an engine is predicted to have room (None: never in time)."""
    planner_s: float = 0.0

    @property
    def reason(self) -> RejectReason | None:
        declined = self.outcome in (PlanOutcome.SHED, PlanOutcome.DEMOTED)
        return RejectReason.SLO_DECLINED if declined else None

    def message(self, tier: str) -> str:
        engines = ", ".join(self.declined_by) or "none"
        return (
            f"overloaded: no engine can serve this request within its SLO now (the admission "
            f"planner of every engine declined it: {engines}), and tier {tier!r} does not allow "
            "best-effort service"
        )


def streams(request: Request) -> bool:
    """Judged by TTFT and TPOT (the policy's rule, :meth:`SlosServePolicy.streams`)."""
    slo = request.slo
    if request.kind == "best-effort" or not slo.is_streaming:
        return False
    return request.kind == "latency" or slo.deadline_s is None


def tpot_s(request: Request) -> float | None:
    slo = request.slo
    return slo.tpot_s if streams(request) and slo.tpot_s else None


def prefill_deadline(request: Request, bound: int, step_s: float) -> float:
    """When its first token is due, as the engine's policy computes it: arrival + TTFT for a
    streaming request; for an end-to-end deadline, late enough that one token per step still
    ends by it; never for a request with neither."""
    slo = request.slo
    if tpot_s(request) is not None and slo.ttft_s is not None:
        return request.arrival_s + slo.ttft_s
    if slo.deadline_s is not None:
        return request.arrival_s + slo.deadline_s - bound * step_s
    return math.inf


def placed(
    request: Request, estimator: BatchLatencyEstimator, block_size: int, now: float, step_s: float
) -> Placed:
    """The request as an engine's planner budgets it."""
    bound = request.length_bound(QUANTILE)
    period = tpot_s(request) or DEFAULT_STEP_S
    return Placed(
        request_id=request.request_id,
        deadline_s=prefill_deadline(request, bound, step_s),
        work_s=estimator.prefill_time(max(request.prompt_tokens, 2), 0),
        load=decode_load(estimator, request.prompt_tokens + bound / 2, period),
        blocks=-(-(request.prompt_tokens + bound) // block_size),
        period_s=period,
        bound=bound,
        placed_s=now,
    )


@dataclass(slots=True)
class Ledger:
    """What this gateway placed on one engine and has not seen end."""

    entries: dict[str, Placed] = field(default_factory=dict)

    def prune(self, backend: Backend, now: float) -> tuple[list[Placed], list[Placed]]:
        """The entries still live, as (prefilling, decoding); the rest are dropped."""
        queue = backend.view.prefill_queue
        prefilling: list[Placed] = []
        decoding: list[Placed] = []
        for rid, entry in list(self.entries.items()):
            if rid in queue:
                entry.seen_queued = True
                prefilling.append(entry)
            elif not entry.seen_queued and now - entry.placed_s < UNSEEN_GRACE_S:
                prefilling.append(entry)
            elif entry.end_s > now:
                decoding.append(entry)
            else:
                del self.entries[rid]
        # no more decodes than the gateway counts there: the ones predicted to end first did
        excess = len(decoding) - backend.own_decoding
        if excess > 0:
            decoding.sort(key=lambda e: e.end_s)
            for entry in decoding[:excess]:
                self.entries.pop(entry.request_id, None)
            decoding = decoding[excess:]
        return prefilling, decoding


def engine_view(
    backend: Backend, ledger: Ledger, candidate: Request, now: float
) -> tuple[PlannerInput, Placed]:
    """The planner's input for ``candidate`` on ``backend`` (see the module docstring)."""
    view = backend.view
    est = view.estimator
    engine = backend.profile.engine
    prefilling, decoding = ledger.prune(backend, now)
    periods = [e.period_s for e in prefilling + decoding]
    own_tpot = tpot_s(candidate)
    if own_tpot is not None:
        periods.append(own_tpot)
    external = view.external_prefills
    if external is not None and external.count and math.isfinite(external.min_tpot_s):
        periods.append(external.min_tpot_s)
    step = TPOT_SHARE * min(periods) if periods else None
    ref_step = step if step is not None else DEFAULT_STEP_S
    entry = placed(candidate, est, engine.block_size, now, ref_step)

    forced = [(e.deadline_s, e.work_s, e.load, 0) for e in prefilling]
    if external is not None and external.count:
        deadline = external.earliest_deadline_s
        work = est.beta * external.raw_work + est.t_c * external.chunks
        period = external.min_tpot_s if math.isfinite(external.min_tpot_s) else ref_step
        load = external.count * decode_load(est, external.prompt_tokens / external.count, period)
        forced.append((deadline if math.isfinite(deadline) else now, work, load, 0))
    run_load = [e.load for e in decoding]
    run_end = [e.end_s for e in decoding]
    # decodes the gateway cannot attribute: like the newcomer, at the tightest pace, all along
    unknown = max(0, view.num_decoding - len(decoding))
    if unknown:
        per = decode_load(est, candidate.prompt_tokens + entry.bound / 2, ref_step)
        run_load.append(unknown * per)
        run_end.append(math.inf)

    total_blocks = engine.num_kv_blocks
    used = backend.kv_usage if backend.kv_usage is not None else 0.0
    pending_blocks = sum(e.blocks for e in prefilling)
    free_memory = int(total_blocks * (1.0 - used)) - pending_blocks
    occupied = max(
        (backend.running or 0) + (backend.waiting or 0),
        len(prefilling) + len(decoding) + unknown + view.num_external_prefills,
    )
    inp = PlannerInput(
        now=now,
        capacity=prefill_capacity(est, step),
        running_load=np.asarray(run_load, dtype=np.float64),
        running_end=np.asarray(run_end, dtype=np.float64),
        forced=PlanItems.of_rows(forced),
        candidates=PlanItems.of_rows([(entry.deadline_s, entry.work_s, entry.load, entry.blocks)]),
        free_memory=free_memory,
        free_seats=engine.max_num_seqs - occupied,
    )
    return inp, entry


def runs_planner(backend: Backend) -> bool:
    facts = backend.facts
    return facts is not None and facts.policy == POLICY


class SloAdmission:
    """The gateway's per-engine admission with SLOs-Serve's planner (module docstring): one per
    gateway worker, holding what it placed on each engine."""

    def __init__(self) -> None:
        self.ledgers: dict[str, Ledger] = {}

    def applies(self, group: ModelGroup) -> bool:
        """Some engine of the group runs the planner (else there is nothing to ask)."""
        return any(runs_planner(b) for b in group.backends)

    def candidates(self, group: ModelGroup, preferred: int | None, now: float) -> list[int]:
        """Healthy engines in the order asked: the router's choice, then the least prefill work
        pending first."""
        healthy = [i for i, b in enumerate(group.backends) if b.view.healthy]
        rest = sorted(
            (i for i in healthy if i != preferred),
            key=lambda i: pending_prefill_s(group.backends[i], now),
        )
        return ([preferred] if preferred in healthy else []) + rest

    def place(
        self,
        request: Request,
        group: ModelGroup,
        preferred: int | None,
        *,
        best_effort_allowed: bool,
        metrics: GatewayMetrics | None = None,
        tier: str = "",
        now: float | None = None,
    ) -> Placement | None:
        """Ask the engines' planners in turn; None when no engine of the group runs one (the
        gateway's other admission rules decide alone). The decision is recorded: an admitted
        request is a forced item of its engine's next plans, a demoted one is best effort."""
        now = time.monotonic() if now is None else now
        if not self.applies(group):
            return None
        started = time.perf_counter()
        declined: list[str] = []
        retry: float | None = None
        chosen: int | None = None
        entry: Placed | None = None
        for index in self.candidates(group, preferred, now):
            backend = group.backends[index]
            if not runs_planner(backend):  # no planner there: the gateway's own rules admitted it
                chosen = index
                break
            ledger = self.ledgers.setdefault(backend.name, Ledger())
            inp, entry = engine_view(backend, ledger, request, now)
            if plan_admission(inp, dp_window=1).accepted[0]:
                chosen = index
                break
            declined.append(backend.name)
            if metrics is not None:
                metrics.slo_declines.labels(backend.name).inc()
            hint = _room_in_s(backend, ledger, entry, request, now)
            if hint is not None:
                retry = hint if retry is None else min(retry, hint)
            entry = None
        elapsed = time.perf_counter() - started
        if chosen is not None:
            outcome = PlanOutcome.REROUTED if declined else PlanOutcome.ADMITTED
            if entry is not None:
                self.ledgers[group.backends[chosen].name].entries[request.request_id] = entry
            placement = Placement(outcome, chosen, tuple(declined), None, elapsed)
        elif best_effort_allowed:
            placement = Placement(PlanOutcome.DEMOTED, None, tuple(declined), None, elapsed)
        else:
            if retry is not None:
                retry = min(max(retry, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S)
            placement = Placement(PlanOutcome.SHED, None, tuple(declined), retry, elapsed)
        if metrics is not None:
            metrics.slo_admission.labels(tier, placement.outcome.value).inc()
            metrics.slo_planner_time.observe(elapsed)
        return placement

    def release(self, request_id: str) -> None:
        """The request ended (or failed over): nothing of it is budgeted any more."""
        for ledger in self.ledgers.values():
            ledger.entries.pop(request_id, None)


def _room_in_s(
    backend: Backend, ledger: Ledger, entry: Placed, request: Request, now: float
) -> float | None:
    """When ``backend`` is predicted to have room for a request like this one: its pending
    prefill work drained, or its first placed decode ended, whichever is later than now and
    sooner; None when even an idle engine could not prefill it by its deadline (retrying cannot
    help)."""
    est = backend.view.estimator
    if request.arrival_s + est.t_c + entry.work_s > entry.deadline_s:
        return None
    drain = pending_prefill_s(backend, now)
    ends = [e.end_s - now for e in ledger.entries.values() if e.end_s > now and e.seen_queued]
    first_end = min(ends) if ends else math.inf
    hint = min(drain, first_end) if drain > 0 else first_end
    return hint if math.isfinite(hint) else drain
