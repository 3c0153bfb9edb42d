"""Accounting: a request's end, once, with its outcome — what it held released, what it was
worth recorded.

Off the per-token path: each streamed chunk only appended its egress time to the job; gain
(TDG), SLO attainment, metrics, the limiter's reconciliation, the budget's charge and the usage
record are computed from those times here, at the end, by the rules of
:mod:`gateway.app.accounting`: only work an engine accepted (answered 200) earns gain, ideal
gain, tokens or an attainment sample; refusals (the gateway's, or an engine's 4xx) are
``rejected``, never failures or misses (``docs/usage.md``). Usage records go to the batched
:class:`~gateway.db.usage.UsageWriter` (never a database write on the request path).
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING

from engine_common.protocol import milliseconds
from gateway.app.accounting import (
    Account,
    Outcome,
    account,
    miss_reason,
    record_gain,
    tier_series,
)
from gateway.app.metrics import objectives_met
from gateway.app.patterns import CallEnd
from gateway.app.stages import record_stage
from gateway.dataplane.routing import released
from gateway.db.request_log import RequestExplain
from gateway.db.usage import UsageEvent

if TYPE_CHECKING:
    from gateway.app.proxy import Job
    from priority.routing import RouteDecision

log = logging.getLogger("gateway.app.proxy")
"""The request path's one logger: operators filter on it, wherever the code lives."""


async def finish(job: Job, outcome: Outcome, http_status: int, reason: str | None = None) -> None:
    """Release what the job holds and account for it (idempotent): every request's one end,
    from ``serve``'s ``finally`` or when :class:`~gateway.app.proxy.RelayStream` ends."""
    if job.finished:
        return
    job.finished = True
    state, now = job.state, time.monotonic()
    release_engine(job, now)
    # what reached the client: a non-streamed answer only when it is returned
    times = job.chunk_times if job.stream else ([now] if outcome is Outcome.OK else [])
    delivered = job.completion_tokens if job.completion_tokens is not None else len(times)
    token_times = per_token_times(times, delivered)
    result = account(
        outcome,
        accepted=job.accepted,
        arrival_s=job.arrival,
        slo=job.core.slo if job.core is not None else None,
        weight=job.identity.policy.weight,
        token_times=token_times,
        output_budget=job.expected_output,
        prompt_tokens=job.upstream_prompt_tokens or job.prompt_tokens,
        weights=state.pool.weights,
    )
    if job.reservation is not None:  # the limits charge exactly what the usage shows
        try:
            if outcome is Outcome.OK:
                await state.limiter.reconcile(job.reservation, result.total_tokens)
            else:
                await state.limiter.release(job.reservation, result.total_tokens)
        except Exception:  # a limiter outage must not lose the usage record
            log.exception("could not reconcile reservation of %s", job.request_id)
    if job.budget_hold is not None:  # the budget is charged what the usage record costs
        try:
            await state.budgets.charge(
                job.budget_hold, result.prompt_tokens, result.completion_tokens
            )
        except Exception:  # a budget store's outage must not lose the usage record
            log.exception("could not settle the budget of %s", job.request_id)
    _account(job, outcome, http_status, reason, times, token_times, result, now)
    meta = job.meta
    if meta is not None and meta.kind == "compound" and meta.workflow_id:
        end = CallEnd(  # the workflow history learns from every call
            f"{job.identity.tenant_id}:{meta.workflow_id}",
            meta.stage,
            model=job.model or "",
            prompt_tokens=result.prompt_tokens,
            output_tokens=result.completion_tokens,
            end_s=token_times[-1] if token_times else now,
            ok=outcome is Outcome.OK and result.accepted,
        )
        state.kinds.call_ended(end)


def release_engine(job: Job, now: float) -> None:
    """Give back what the request holds of an engine, once: the router's count of it on its
    backend (:func:`~gateway.dataplane.routing.released`), its dispatch slot and its SLO
    planner entry. A stream calls it as soon as its upstream has ended, before its last write:
    a client slow to take the last bytes must not hold a slot the engine is done with (for up
    to ``client_write_timeout_s``); :func:`finish` calls it for every other request."""
    if job.engine_released:
        return
    job.engine_released = True
    if job.backend is not None and job.group is not None and job.core is not None:
        released(job, now)
    if job.slot:
        job.slot = False
        job.state.queue.release()
    job.state.slo_admission.release(job.request_id)


def _account(
    job: Job,
    outcome: Outcome,
    http_status: int,
    reason: str | None,
    times: list[float],
    token_times: list[float],
    result: Account,
    now: float,
) -> None:
    """Observe latencies, add the request's gain to its tier and queue its usage record."""
    state, metrics, tier = job.state, job.state.metrics, job.tier
    series = tier_series(metrics, tier)
    ttft_ms = tpot_ms = None
    if token_times:
        ttft_ms = (token_times[0] - job.arrival) * 1e3
        if len(token_times) > 1:
            tpot_ms = (token_times[-1] - token_times[0]) / (len(token_times) - 1) * 1e3
            metrics.observe_itl(tier, [b - a for a, b in itertools.pairwise(times)])
        series.ttft.observe(ttft_ms / 1e3)
    record_gain(metrics, tier, result, series)
    series.e2e.observe(now - job.arrival)
    tenant = metrics.tenant_label(job.identity.tenant_name)
    metrics.requests.labels(tenant, tier, str(http_status)).inc()
    if result.accepted:
        met: list[tuple[str, bool]] = []
        if result.slo_met is not None and job.core is not None:
            met = objectives_met(job.arrival, job.core.slo, token_times)
        metrics.record_served(tenant, tier, result.prompt_tokens, result.completion_tokens, met)
        if job.meta is not None and job.meta.workflow_id is not None:  # a stage
            record_stage(state.stages, metrics, job.meta, tier, met=bool(result.slo_met))
    if reason is not None:
        metrics.rejections.labels(tenant, tier, reason).inc()
    samples = state.length_samples
    if samples is not None and job.length_features is not None and outcome is Outcome.OK:
        samples.submit(job.length_features, result.completion_tokens)
    explain = None
    if state.settings.request_log_days:
        times_ms = (ttft_ms, tpot_ms)
        explain = _explain(job, outcome, http_status, reason, token_times, result, times_ms)
    state.usage_writer.submit(
        UsageEvent(
            request_id=job.request_id,
            status=outcome.value,
            tenant_id=job.identity.tenant_id,
            api_key_id=job.identity.key_id,
            tier=tier,
            model=job.model,
            backend=job.backend.name if job.backend is not None else None,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
            reject_reason=reason or (f"demoted:{job.demoted}" if job.demoted else None),
            explain=explain,
            **result.usage_fields(),
        )
    )


def _explain(
    job: Job,
    outcome: Outcome,
    http_status: int,
    reason: str | None,
    token_times: list[float],
    result: Account,
    times_ms: tuple[float | None, float | None],
) -> RequestExplain:
    """The request log's row beyond the usage record: from what the stages left on the job
    (no lookups, a few float operations)."""
    verdict, meta = job.verdict, job.meta
    decision: RouteDecision | None = getattr(job, "decision_live", None)
    predicted = decision.predicted_ttft_s if decision is not None else None
    predicted_ms = predicted * 1e3 if predicted is not None else None
    queue_ms = None  # from the admission queue's turn to the dispatch slot's grant
    if job.granted_at:
        queue_ms = (job.granted_at - job.arrival - job.overhead_s) * 1e3
    ttft_ms, tpot_ms = times_ms
    engine_ms = None
    if token_times and job.dispatched_at:
        engine_ms = (token_times[0] - job.dispatched_at) * 1e3
    slo_ttft = slo_tpot = None
    if meta is not None and meta.slo.ttft_s is not None and meta.slo.tpot_s is not None:
        slo_ttft, slo_tpot = milliseconds(meta.slo.ttft_s), milliseconds(meta.slo.tpot_s)
    why = miss_reason(
        outcome,
        reject_reason=reason,
        slo_met=result.slo_met,
        demoted=job.demoted is not None,
        queue_ms=queue_ms,
        attempts=job.attempts,
        ttft_ms=ttft_ms,
        slo_ttft_ms=slo_ttft,
        tpot_ms=tpot_ms,
        slo_tpot_ms=slo_tpot,
        engine_ttft_ms=engine_ms,
        predicted_ttft_ms=predicted_ms,
    )
    return RequestExplain(
        arrival_unix=job.arrival_unix,
        http_status=http_status,
        slo_met=result.slo_met,
        miss_reason=why.value if why is not None else None,
        admission=verdict.action.value if verdict is not None else None,
        admission_ttft_ms=verdict.predicted_ttft_s * 1e3 if verdict is not None else None,
        predicted_ttft_ms=predicted_ms,
        queue_ms=queue_ms,
        engine_ttft_ms=engine_ms,
        slo_ttft_ms=slo_ttft,
        slo_tpot_ms=slo_tpot,
        attempts=job.attempts,
    )


def per_token_times(times: list[float], tokens: int) -> list[float]:
    """Per-token egress times from per-chunk ones: a chunk carrying several tokens (an engine
    that fell behind merges them) emits them all at its time; tokens spread evenly over the
    chunks, earlier chunks taking the remainder — exact when each chunk is one token."""
    chunks = len(times)
    if chunks == 0 or tokens <= 0:
        return []
    if tokens == chunks:
        return times
    if tokens < chunks:  # e.g. a final chunk with only finish_reason: drop the latest times
        return times[:tokens]
    per, extra = divmod(tokens, chunks)
    out: list[float] = []
    for i, t in enumerate(times):
        out.extend([t] * (per + (1 if i < extra else 0)))
    return out
