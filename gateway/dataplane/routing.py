"""Routing: which backend serves the request, and the router kept in step with it.

The router is asked, never overridden: a backend that failed this request is left out by the
router's ``exclude`` (its index), not by flipping its health, which every other request reads.
Each function takes the job, as admission's stages do, and writes what it decides there: the
request's one mutable record, so routing allocates nothing of its own per request.

The router hears of a request three times — ``on_dispatch`` when an attempt goes out,
``on_first_token``, ``on_finish`` when the attempt fails or the request ends — and the pool's
view of the backend's queue changes with each (:meth:`BackendPool.queue_changed`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.errors import ApiError
from priority.routing import NoHealthyInstanceError, RouteDecision

if TYPE_CHECKING:
    from gateway.app.backends import Backend
    from gateway.app.deadlines import AttemptBudget
    from gateway.app.proxy import Job

NO_BACKEND_RETRY_AFTER = "1"
"""``retry-after`` of 503 ``no_healthy_backend``: breakers close within seconds of an engine's
return (probes every ``probe_interval_s``), as for ``upstream_unavailable``."""

_NONE: frozenset[int] = frozenset()


def route(job: Job, now: float, exclude: frozenset[str] = frozenset()) -> RouteDecision:
    """Ask the group's router; ``exclude`` (backends that failed this request) sit out."""
    assert job.group is not None and job.core is not None
    skipped: frozenset[int] = _NONE
    if exclude:
        skipped = frozenset(b.view.index for b in job.group.backends if b.name in exclude)
    started = time.perf_counter()
    job.state.pool.see_others(job.group.backends)  # the other workers' queued prefills
    try:
        return job.group.router.route(job.core, now, exclude=skipped)
    except NoHealthyInstanceError:
        raise ApiError(
            503,
            f"no healthy backend serves model {job.model!r}",
            code="no_healthy_backend",
            headers={"retry-after": NO_BACKEND_RETRY_AFTER},
        ) from None
    finally:
        job.state.metrics.routing_time.observe(time.perf_counter() - started)


def alternative(job: Job, backend: Backend, tried: set[str]) -> bool:
    """Another healthy backend of the group this request has not tried yet."""
    assert job.group is not None
    return any(
        b is not backend and b.view.healthy and b.name not in tried for b in job.group.backends
    )


def retry_tried(job: Job, budget: AttemptBudget) -> bool:
    """Every untried backend is gone: try a healthy one again while the budget lasts. A
    backend that failed this request once (a broken connection, an engine restarting) may
    still be the only one left that can serve it — the other having died since — and a
    client must see an error only where no retry could have served it. A timed-out
    attempt has spent the budget, so it is never retried on the backend that was slow."""
    assert job.group is not None
    if budget.end <= time.monotonic():
        return False
    return any(b.view.healthy for b in job.group.backends)


def dispatched(job: Job, backend: Backend, decision: RouteDecision, now: float) -> None:
    """An attempt goes out to ``backend``: the router and the pool count it there."""
    assert job.group is not None and job.core is not None
    if not job.dispatched_at:  # the first attempt: everything before it is overhead
        job.state.metrics.overhead.observe(job.overhead_s + (now - job.granted_at))
    job.dispatched_at = now
    job.attempts += 1
    job.backend, job.decision_live = backend, decision
    job.state.metrics.count_routed(backend.name, job.tier)
    job.group.router.on_dispatch(job.core, decision, now)
    job.state.pool.queue_changed(backend)


def first_token(job: Job, backend: Backend) -> None:
    """The attempt's first token came (or, not streaming, is assumed to have): the router
    stops counting the request as queued prefill work; the TTFT estimate's error observed."""
    assert job.group is not None and job.core is not None
    job.first_token = True
    backend.own_decoding += 1
    now = time.monotonic()
    predicted = job.decision_live.predicted_ttft_s if job.decision_live else None
    if job.stream and predicted and job.dispatched_at:  # how good the router's estimate was
        ratio = (now - job.dispatched_at) / predicted
        job.state.metrics.ttft_prediction_of(backend.name).observe(ratio)
    job.group.router.on_first_token(job.core, job.decision_live, now)
    job.state.pool.queue_changed(backend)


def released(job: Job, now: float) -> None:
    """The attempt on ``job.backend`` is over (failed, or the request ended): the router and
    the pool forget it (a non-streaming one may have been assumed past its first token)."""
    assert job.group is not None and job.core is not None
    job.group.router.on_finish(job.core, job.decision_live, now, saw_first_token=job.first_token)
    backend = job.backend
    if backend is not None:
        job.state.pool.queue_changed(backend)
        if job.first_token:
            backend.own_decoding = max(0, backend.own_decoding - 1)


def undispatch(job: Job) -> None:
    """A failed attempt is gone: released, and the job ready for the next one."""
    released(job, time.monotonic())
    job.first_token = False
    job.accepted = False
    job.backend = None
