"""Wait for a dispatch slot in the gain-ordered admission queue (429 ``queue_full``; 503
``slo_unattainable`` once the wait itself makes the objective unattainable, ``queue_ttl`` for
best effort). The queue may demote the request on its grant; the router's pick at admission is
kept for dispatch only if the request did not wait."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.app.shedding import Action
from gateway.dataplane.demotion import demote
from gateway.dataplane.stages.shed import ttft_s
from gateway.limits import QueueItem, RejectReason

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.app.proxy import Job


async def wait(job: Job, http: Request) -> None:
    """The slot taken (``job.slot``: ``Job.finish`` gives it back), its grant time kept."""
    state, policy, verdict = job.state, job.identity.policy, job.verdict
    assert verdict is not None and job.model is not None
    demoted = verdict.action is Action.DEMOTE
    item = QueueItem(
        job.request_id,
        job.tier,
        priority=job.priority,
        ttl_s=queue_ttl(job, demoted=demoted),
        aging_s=ttft_s(job),
        slo_wait_s=verdict.slo_wait_s,
        demotable=policy.best_effort_allowed,
        model=job.model,
    )
    before = time.monotonic()
    grant = await state.queue.wait_for_turn(item)
    job.slot = True
    job.granted_at = time.monotonic()
    job.overhead_s = before - job.arrival
    if grant.demoted:
        demote(job, verdict.reason or RejectReason.SLO_UNATTAINABLE)
    if grant.waited_s >= 1e-3 or grant.demoted:
        job.decision = None  # routed again at dispatch, under the load it meets then


def queue_ttl(job: Job, *, demoted: bool) -> float:
    """How long the request may wait for a dispatch slot: ``queue_ttl_s``, and no later than
    its deadline, for which waiting longer is pointless — unless it is demoted at admission:
    best effort has given its deadline up and waits like any best-effort request."""
    ttl = job.state.settings.queue_ttl_s
    deadline_s = job.deadline_s()
    if deadline_s is not None and not demoted:
        ttl = min(ttl, max(1e-3, job.arrival + deadline_s - time.monotonic()))
    return ttl
