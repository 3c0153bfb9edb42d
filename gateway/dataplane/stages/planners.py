"""The engines' admission planners (SLOs-Serve, :mod:`gateway.app.slo_admission`), asked in
turn just before dispatch, the router's choice first: the first that admits gets the request;
when all decline, it is demoted where its tier allows best effort (and waits again, as best
effort does, for a nearly idle engine), else shed (503 ``slo_declined`` with ``retry-after``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from gateway.app.slo_admission import PlanOutcome
from gateway.dataplane.demotion import demote
from gateway.dataplane.stages.queue import queue_ttl
from gateway.dataplane.stages.shed import ttft_s
from gateway.limits import AdmissionRejected, QueueItem, RejectReason
from priority.routing import RouteDecision

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.app.proxy import Job


def ask(job: Job, http: Request) -> Awaitable[None] | None:
    """Nothing to ask (no coroutine made) when the request was demoted at its grant or no
    engine of its group runs a planner."""
    assert job.group is not None
    if job.demoted is not None or not job.state.slo_admission.applies(job.group):
        return None
    return _ask(job)


async def _ask(job: Job) -> None:
    assert job.group is not None and job.core is not None and job.model is not None
    admission = job.state.slo_admission
    routed = job.decision or job.route(time.monotonic())
    placement = admission.place(
        job.core,
        job.group,
        routed.instance,
        best_effort_allowed=job.identity.policy.best_effort_allowed,
        metrics=job.state.metrics,
        tier=job.tier,
    )
    if placement is None:
        return
    if placement.instance is not None:  # admitted there: dispatch goes where it was asked
        moved = placement.instance != routed.instance
        job.decision = RouteDecision(placement.instance) if moved else routed
        return
    reason = RejectReason.SLO_DECLINED
    if placement.outcome is PlanOutcome.DEMOTED:
        demote(job, reason)
        job.decision = None
        # its slot back to the queue: best effort waits behind every promised request for an
        # idle engine (dispatched at once, a best-effort prefill step delays promised ones)
        job.slot = False
        job.state.queue.release()
        item = QueueItem(
            job.request_id,
            job.tier,
            priority=-float(job.prompt_tokens),
            ttl_s=queue_ttl(job, demoted=True),
            aging_s=ttft_s(job),
            slo_wait_s=0.0,
            demotable=True,
            model=job.model,
        )
        await job.state.queue.wait_for_turn(item)
        job.slot = True
        return
    raise AdmissionRejected(reason, placement.retry_after_s, placement.message(job.tier))
