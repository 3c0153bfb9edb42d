"""Route, then shed or demote by the predicted first token (:mod:`gateway.app.shedding`).

The router's pick prices the engine's part; the admission queue's predicted wait the rest. A
request of an end-to-end kind (deadline, workflow) is judged by its predicted finish against its
deadline. Shed: 503 ``slo_infeasible`` / ``slo_unattainable`` with ``retry-after``; demoted: it
queues below every request that is not (demotion itself is applied at the queue's grant).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from engine_common.protocol import milliseconds
from gateway.app.shedding import Action, decode_s, judge, lone_prefill_s, shed_message
from gateway.limits import AdmissionRejected
from gateway.limits.backlog import gain_density
from priority.gain import kind_slo

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.app.proxy import Job
    from priority.routing import RouteDecision


def route_and_shed(job: Job, http: Request) -> None:
    """The router's pick on ``job.decision``, admission's verdict on ``job.verdict`` and the
    request's place in the queue on ``job.priority``; or 503 when it is shed."""
    state, policy = job.state, job.identity.policy
    meta = job.meta
    assert meta is not None and job.core is not None and job.model is not None
    now = time.monotonic()
    decision = job.decision = job.route(now)
    judged = kind_slo(meta.kind, job.core.slo)
    end_to_end = not judged.is_streaming
    due_s = judged.token_due_s(1)
    priority = gain_density(state.pool.weights, policy.weight, job.prompt_tokens)
    wait = state.queue.predicted_wait_s(priority, job.model)
    verdict = job.verdict = judge(
        elapsed_s=now - job.arrival,
        due_s=due_s,
        shed_slack=policy.shed_slack,
        best_effort=policy.best_effort_allowed,
        wait_s=wait,
        engine_s=engine_ttft(job, decision),
        zero_load_s=engine_ttft(job, decision, idle=True),
        drain_s=state.queue.drain_time_s() if wait == math.inf else None,
        horizon_s=state.settings.dispatch_horizon_s,
        checked=job.fits,  # else maybe too long: the engine's tokenizer decides, not a 503
        decode_s=engine_decode(job, decision) if end_to_end else 0.0,
    )
    if verdict.action is Action.SHED:
        assert verdict.reason is not None
        due_ms = due_s * 1e3 if end_to_end else milliseconds(ttft_s(job))
        message = shed_message(verdict, job.tier, due_ms, policy.shed_slack, end_to_end=end_to_end)
        raise AdmissionRejected(verdict.reason, verdict.retry_after_s, message)
    if verdict.action is Action.DEMOTE:
        priority = -float(job.prompt_tokens)  # below every request not demoted
    job.priority = priority


def ttft_s(job: Job) -> float:
    """The request's TTFT objective: the gateway gives every request one (its tier's)."""
    assert job.meta is not None and job.meta.slo.ttft_s is not None
    return job.meta.slo.ttft_s


def engine_ttft(job: Job, decision: RouteDecision, *, idle: bool = False) -> float:
    """Predicted dispatch-to-first-token time on the decision's backend: the router's
    estimate under its load, or (``idle``, or a router that makes none) the zero-load
    prefill time from the backend's profile."""
    if not idle and decision.predicted_ttft_s is not None:
        return decision.predicted_ttft_s
    assert job.group is not None
    return lone_prefill_s(job.group.backends[decision.instance], job.prompt_tokens)


def engine_decode(job: Job, decision: RouteDecision) -> float:
    """Predicted first-to-last-token time of the expected output on the decision's backend,
    decoding it alone (:func:`~gateway.app.shedding.decode_s`)."""
    assert job.group is not None
    estimator = job.group.backends[decision.instance].view.estimator
    return decode_s(estimator, job.prompt_tokens, job.expected_output)
