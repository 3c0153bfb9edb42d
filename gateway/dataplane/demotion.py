"""Demotion to best effort: one function, applied at most once per request (at the queue's grant
or by the engines' admission planners, never both: a request demoted at its grant is not asked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.bounds import MIN_WEIGHT
from gateway.limits import RejectReason

if TYPE_CHECKING:
    from gateway.app.proxy import Job


def demote(job: Job, reason: RejectReason) -> None:
    """Serve without its SLO at the lowest priority (``docs/operations/overload.md``): the
    engine gets the smallest weight (vLLM priority +10), the router counts its first token
    as worth nothing, and its usage record says why. Its gain is still accounted at the
    tier's weight and SLO: demotion changes how it is served, not what it was worth."""
    assert job.core is not None
    job.demoted = reason.value
    job.core.weight = MIN_WEIGHT
    job.state.metrics.demotions.labels(job.tier, reason.value).inc()
