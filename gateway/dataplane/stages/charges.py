"""What the request is charged before it is dispatched: the tenant's budget (402/429 by the
budget guard) and then its rate limits (429) — prompt tokens plus expected output. A spent
budget refuses before the rate limits are charged for the request; ``Job.finish`` settles both
with what the usage record shows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.limits import Limits

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.app.proxy import Job


async def budgets(job: Job, http: Request) -> None:
    """Hold the request's price against its tenant's and key's budgets."""
    identity = job.identity
    job.budget_hold = await job.state.budgets.admit(
        identity.tenant_id,
        identity.key_id,
        job.model,
        job.prompt_tokens,
        job.expected_output,
    )


async def limits(job: Job, http: Request) -> None:
    """Reserve the tenant's requests, tokens and concurrency."""
    policy = job.identity.policy
    allowed = Limits(policy.rpm_limit, policy.tpm_limit, policy.max_concurrency)
    job.reservation = await job.state.limiter.reserve(
        str(job.identity.tenant_id), allowed, job.prompt_tokens + job.expected_output
    )
