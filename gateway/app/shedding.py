"""SLO-aware admission under overload: admit, demote or shed a request by its predicted TTFT
(a latency request) or its predicted finish (a deadline, compound or best-effort request).

A gateway that queues what it cannot serve in time answers late for everyone: under 10x load a
deep FIFO-ish queue makes every first token wait for the queue's whole length. Instead each
request's time to first token is *predicted* at admission (``docs/operations/overload.md``)::

    predicted = (now - arrival)            # already spent: auth, parsing, limits
              + wait in the admission queue  # AdmissionQueue.predicted_wait_s (measured rate)
              + dispatch to first token      # the router's Exec(p, r) (GoRouting), else the
                                             # backend's zero-load prefill time; after a wait
                                             # at least the dispatch horizon plus its prefill

and compared with what the request's tier promises, ``due × (1 + shed_slack)`` (``due``: the
first token's due time, the TTFT objective or an earlier deadline). Within it: admitted, and
told how long it may still wait in the queue (``slo_wait_s``) before that wait alone makes the
objective unattainable. Past it: *demoted* where the tier allows best effort (served at the
lowest priority, without its SLO), else *shed* at once with 503 and a ``retry-after`` of the
predicted drain time — ``slo_infeasible`` when the backends alone already miss (no queue wait
involved), ``slo_unattainable`` when the queue's wait does.

**Requests judged end to end** (the ``deadline``, ``compound`` and ``best-effort`` kinds,
:func:`priority.gain.kind_slo`) are worth something only if they *finish* by their deadline, and
nothing more for an early first token: shedding them on their tier's TTFT would refuse work
that can still be done in time, and admit work that cannot. Their prediction adds the decode
(:func:`decode_s`) to the same first-token prediction, and ``due`` is the deadline itself (for a
workflow call, the time left to its workflow's deadline: a call that cannot finish by then
cannot help the workflow)::

    predicted finish = predicted first token + (expected output - 1) x decode step

The expected output is what the limits reserve (``max_tokens``, else ``default_max_tokens``: the
length prediction runs beside admission and is not waited for), each step the backend's decode
step on its own (the estimator's ``t_c + T_d`` at the request's mean context): the engine's
scheduler may speed a request with a deadline up, but never past that. The verdicts, the
reasons, the retry hint and the error dialect are the latency requests'.

503 rather than 429: the request is refused because the gateway's capacity is short, not because
its tenant sent too much (429 stays with the tenant's own limits and a full queue).

The rule is a pure function of numbers (:func:`judge`), tested without a server.

**The backlog stays in the gateway** (:func:`dispatch_gate`). A backend takes up to its
``max_num_seqs`` requests, far more than it can start promptly: dispatched at once, an overload
would queue in the engines, out of the gateway's order and beyond its reach (no shedding, no
demotion), and GoRouting, which counts every pending prefill as work ahead of a newcomer (its
drain estimate is conservative), would predict every newcomer late — premium ones shed because
batch ones sit in the engine. So a request is dispatched only while some backend of its model
would make a newcomer wait less than ``dispatch_horizon_s`` before its own prefill (GoRouting's
``Exec(p)``; for other routers, the pending prefill work); the rest waits here, in gain order,
where its wait is predicted and bounded by its SLO. A demoted request goes only to a backend
that is nearly idle (no prefill pending, none for a while, few decodes): best effort uses
what is left over, as in SLOs-Serve's best-effort tier, so it delays promised work by at most
a step it may be in when promised work arrives, and rarely (:data:`BEST_EFFORT_REST`): what it
leaves queued when a load ends holds no one up for long.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from gateway.limits import RejectReason
from gateway.limits.backlog import Ready
from priority.routing.goroute import GoRouter
from priority.routing.prefill_queue import raw_prefill_work

if TYPE_CHECKING:
    from gateway.app.backends import Backend, BackendPool
    from priority.estimator import BatchLatencyEstimator
    from priority.routing.base import InstanceView


MIN_RETRY_AFTER_S = 1.0
MAX_RETRY_AFTER_S = 60.0
"""A retry hint is the predicted drain time, within these bounds (``retry-after`` is whole
seconds; past a minute the prediction says little)."""


class Action(StrEnum):
    ADMIT = "admit"
    DEMOTE = "demote"
    SHED = "shed"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What admission decided for one request, and the numbers it decided on (seconds)."""

    action: Action
    reason: RejectReason | None
    """Why it was demoted or shed; None when admitted."""
    predicted_ttft_s: float
    """When the judged token comes after arrival: the first (latency requests), or the last
    (requests judged end to end, :func:`judge`'s ``decode_s``)."""
    limit_s: float
    """``due × (1 + shed_slack)``: the latest the tier accepts that token."""
    slo_wait_s: float
    """Longest wait in the admission queue that keeps the prediction within ``limit_s``
    (``inf`` when no limit applies; 0 when demoted)."""
    retry_after_s: float | None
    """For a shed request: when its backlog has been served (None: retrying cannot help)."""

    @property
    def late_by_s(self) -> float:
        return self.predicted_ttft_s - self.limit_s


def judge(
    *,
    elapsed_s: float,
    due_s: float,
    shed_slack: float,
    best_effort: bool,
    wait_s: float | None,
    engine_s: float,
    zero_load_s: float,
    drain_s: float | None = None,
    horizon_s: float = 0.0,
    checked: bool = True,
    decode_s: float = 0.0,
) -> Verdict:
    """Decide one request.

    ``elapsed_s``: time since its arrival. ``due_s``: its first token's due time after arrival.
    ``wait_s``: predicted wait for a dispatch slot (None: unknown yet; counted as 0, and the
    queue's SLO-derived limit still ends a wait that turns out too long). ``engine_s``:
    predicted time from dispatch to its first token. ``zero_load_s``: its prefill time on an
    idle backend (a request that misses even then gets no retry-after: waiting cannot help).
    ``drain_s``: how long the admission queue takes to empty (the retry hint when no wait
    can be predicted for this request: higher-priority arrivals take all the service).
    ``horizon_s``: the dispatch horizon. A request that waits in the queue is dispatched once
    its backend would make it wait less than that (:func:`dispatch_gate`), which under load is
    about when it is dispatched: so after a wait it expects at least ``horizon_s`` plus its own
    prefill there, whatever the backend's queue is now — and its wait in the queue must leave
    room for that.
    ``checked``: False when the request may exceed the context (the engine's tokenizer decides,
    not a retryable 503): admitted without a limit.
    ``decode_s``: for a request judged end to end (module docstring), the predicted time from
    its first token to its last, and ``due_s`` is then its deadline; 0 judges the first token.
    """
    limit = due_s * (1.0 + shed_slack)
    wait = wait_s or 0.0
    after_wait = max(engine_s, horizon_s + zero_load_s) + decode_s
    goes_at_once = wait_s is not None and wait_s <= 0.0
    predicted = elapsed_s + (engine_s + decode_s if goes_at_once else wait + after_wait)
    if not checked or not math.isfinite(limit):
        return Verdict(Action.ADMIT, None, predicted, limit, math.inf, None)
    if predicted <= limit:
        slo_wait = max(0.0, limit - elapsed_s - after_wait)
        return Verdict(Action.ADMIT, None, predicted, limit, slo_wait, None)
    infeasible = elapsed_s + engine_s + decode_s > limit
    reason = RejectReason.SLO_INFEASIBLE if infeasible else RejectReason.SLO_UNATTAINABLE
    if best_effort:
        return Verdict(Action.DEMOTE, reason, predicted, limit, 0.0, None)
    retry: float | None = None  # hopeless (too long even for an idle backend): never helps
    if zero_load_s + decode_s <= limit:
        retry = wait + engine_s if math.isfinite(wait) else (drain_s or 0.0) + engine_s
        retry = min(max(retry, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S)
    return Verdict(Action.SHED, reason, predicted, limit, 0.0, retry)


def decode_s(estimator: BatchLatencyEstimator, prompt_tokens: int, output_tokens: int) -> float:
    """Time from a request's first token to its last on a backend decoding it alone:
    ``output_tokens - 1`` steps of ``t_c + T_d`` at its mean context (the fastest it can go)."""
    steps = max(0, output_tokens - 1)
    if steps == 0:
        return 0.0
    return steps * (estimator.t_c + estimator.decode_time(prompt_tokens + output_tokens / 2))


def shed_message(
    verdict: Verdict, tier: str, due_ms: float, slack: float, *, end_to_end: bool = False
) -> str:
    """The refusal's message: what was predicted against what the tier allows (``due_ms``: the
    TTFT objective, or for a request judged end to end its deadline)."""
    allowed = f"{due_ms:g} ms" + (f" + {slack:.0%} slack" if slack else "")
    token = "its last token by its deadline" if end_to_end else "its first token in time"
    if verdict.reason is RejectReason.SLO_INFEASIBLE:
        cause = f"no backend can produce {token} now"
    else:
        cause = f"the gateway's admission queue is too long to produce {token}"
    what = "a deadline of " if end_to_end else ""
    return (
        f"overloaded: {cause} (predicted {verdict.predicted_ttft_s * 1e3:.0f} ms, tier "
        f"{tier!r} allows {what}{allowed}), and the tier does not allow best-effort service"
    )


def dispatch_gate(pool: BackendPool, horizon_s: float) -> Ready:
    """``ready(model, demoted)`` for the admission queue (see the module docstring): a promised
    request goes once some healthy backend of its model has less than ``horizon_s`` of prefill
    work pending; a demoted one once some is nearly idle (:func:`_idle`)."""

    def ready(model: str, demoted: bool) -> bool:
        group = pool.group(model)
        if group is None:  # reconfigured away meanwhile: dispatch answers for it
            return True
        healthy = [b for b in group.backends if b.view.healthy]
        if not healthy:  # dispatch answers 503 no_healthy_backend at once
            return True
        now = time.monotonic()
        if demoted:
            return any(_idle(b, now) for b in healthy)
        router = group.router
        if isinstance(router, GoRouter):
            return any(router.drain_s(b.view, now) < horizon_s for b in healthy)
        return any(pending_prefill_s(b, now) < horizon_s for b in healthy)

    return ready


BEST_EFFORT_LOAD = 0.1
"""Best effort runs on a backend only while its decoding requests add less than this share of
a step's fixed cost (``t_c``) to every step: a newcomer there then gets its first token within
about that share of its idle time, so best effort never holds a recovering gateway back."""

BEST_EFFORT_REST = 10.0
"""...and only once no prefill has been pending there for this many step fixed costs
(``t_c``; 111 ms on an A100). A promised newcomer that lands behind a best-effort prefill step
waits for it (steps are not preempted), so that step's share of the backend's time is what best
effort costs promised work: with a rest after every prefill, a best-effort prefill of ``P`` takes
at most ``P / (P + rest)`` of it, whatever the outputs' lengths (the decode share above bounds
nothing when outputs are short: every finished request lets the next prefill in at once), and a
backend whose promised prefills come often rarely rests that long: best effort takes the gaps.
Without it, 10x overload drills recovered in 13 s (``docs/results.md``, "Overload")."""


def _idle(backend: Backend, now: float) -> bool:
    """Nothing waiting for a first token, none for a while (:data:`BEST_EFFORT_REST`), and
    decoding light (:data:`BEST_EFFORT_LOAD`) — counting what the other gateway workers have
    queued there (``view.external_prefills``) as this worker's own."""
    view = backend.view
    if view.prefill_queue or view.num_external_prefills:
        return False
    estimator = view.estimator
    if now - _queue_changed_s(view) < BEST_EFFORT_REST * estimator.t_c:
        return False
    return view.num_decoding * estimator.decode_time(0) < BEST_EFFORT_LOAD * estimator.t_c


def prefill_s(estimator: BatchLatencyEstimator, raw_work: float, chunks: int) -> float:
    """Seconds of chunked prefill work on ``estimator``'s backend: the uncorrected (beta = 1)
    work of :func:`~priority.routing.prefill_queue.raw_prefill_work`, corrected, and each
    chunk's step fixed cost ``t_c``."""
    return estimator.beta * raw_work + estimator.t_c * chunks


def lone_prefill_s(backend: Backend, prompt_tokens: int) -> float:
    """A prompt's prefill time on ``backend`` alone — its zero-load TTFT, as
    :meth:`~priority.profiles.Profile.zero_load_ttft_s`, in the estimator the backend is routed
    with (the engine's refit and correction included): chunked at the engine's token budget."""
    estimator = backend.view.estimator
    raw, chunks = raw_prefill_work(
        estimator.coefficients, backend.profile.engine.max_num_batched_tokens, prompt_tokens
    )
    return prefill_s(estimator, raw, chunks)


def pending_prefill_s(backend: Backend, now: float) -> float:
    """For routers that estimate no drain time: prefill work dispatched to ``backend`` and not
    yet through its first token (seconds of its profile's estimator), this worker's and the
    other workers' (``view.external_prefills``), less the time since that set last changed
    (progress made meanwhile, as GoRouting compensates its lag). O(1): this worker's part comes
    from the queue's running totals (:attr:`~priority.routing.base.InstanceView.prefill_totals`,
    in the units of the view's profile, which is the backend's)."""
    view = backend.view
    external = view.external_prefills
    if not view.prefill_queue and external is None:
        return 0.0
    estimator = view.estimator
    total = 0.0
    if external is not None:
        total += prefill_s(estimator, external.raw_work, external.chunks)
    if view.prefill_queue:
        own = view.prefill_totals
        total += prefill_s(estimator, own.raw_work, own.chunks)
    return max(0.0, total - (now - _queue_changed_s(view)))


def _queue_changed_s(view: InstanceView) -> float:
    """When the backend's prefill queue last changed, this worker's or another's."""
    external = view.external_prefills
    if external is None:
        return view.queue_updated_s
    return max(view.queue_updated_s, external.updated_s)
