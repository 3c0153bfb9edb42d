"""The request's metadata, built in three stages and then the core request from it.

SLO (400 for a malformed objective), kind (workflow stage, sub-deadline; 400/409), the
conversation stage of a tool continuation, and the core :class:`~priority.request.Request` the
router and shedding judge — end to end, so a workflow call by its workflow's deadline. The meta
is published on ``job.meta`` only once whole: a request refused while it is being built logs no
SLO, as before admission had stages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.app.slo import resolve_slo
from gateway.app.stages import mark_stage
from priority.request import Request as CoreRequest

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.app.proxy import Job


def slo(job: Job, http: Request) -> None:
    """The SLO from the headers within what the tier allows (:mod:`gateway.app.slo`)."""
    identity = job.identity
    job.draft = resolve_slo(
        http.headers,
        identity.policy,
        job.tier,
        tenant=identity.tenant_name,
        arrival_unix_s=job.arrival_unix,
    )


async def kind(job: Job, http: Request) -> None:
    """The request's kind, workflow stage and sub-deadline (:mod:`gateway.app.kinds`)."""
    identity = job.identity
    assert job.draft is not None
    job.draft = await job.state.kinds.resolve(
        http.headers,
        job.draft,
        identity.policy,
        tier=job.tier,
        tenant_key=str(identity.tenant_id),
    )


def conversation(job: Job, http: Request) -> None:
    """A tool response sent back for a new turn: a new prefill stage of its conversation
    (:mod:`gateway.app.stages`). Publishes the finished meta."""
    assert job.draft is not None and job.model is not None
    job.meta = mark_stage(job.draft, job.body, tenant=str(job.identity.tenant_id), model=job.model)


def core(job: Job, http: Request) -> None:
    """The core request, judged end to end: a workflow call by its workflow's deadline."""
    assert job.meta is not None
    job.core = CoreRequest.from_meta(
        job.meta,
        job.request_id,
        arrival_s=job.arrival,
        prompt_tokens=job.prompt_tokens,
        max_output_tokens=job.expected_output,
        end_to_end=True,
    )
