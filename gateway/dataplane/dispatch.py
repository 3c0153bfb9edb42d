"""Dispatch: the engine's payload, the attempts, and the wait for the first token.

The router picks a backend (:mod:`gateway.dataplane.routing`); a failure before the first token
(connect error, 5xx, a stream that ends first or with a server error, garbage, no first token
within the request's own budget — ``TTFT x first_token_timeout_factor``,
:mod:`gateway.app.deadlines` — or the backend's breaker opening meanwhile) counts against that
backend's breaker and retries on another one, up to ``max_attempts`` attempts, within what is
left of that budget; once every healthy backend has been tried, a healthy one is tried again
while budget is left, and only then 503 ``upstream_unavailable`` with ``retry-after``. A pooled
connection the engine closed as idle just as the request went out is retried on a new
connection inside :mod:`gateway.app.upstream`: not a failure at all. A streaming response is
only started once the first token is in hand, so the client never sees a failed attempt. An
engine's refusal (a 4xx, or a stream whose first event is a 4xx error) is the client's answer,
not a failed attempt.

Functions of the job, as admission's stages are: what an attempt leaves (the open upstream
response, the events held until the first token, ``accepted``) is on the job for the relay and
for ``Job.finish``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING

from fastapi.responses import Response

from engine_common.protocol import encode, without_protocol_keys
from gateway.app.deadlines import AttemptBudget, attempt_budget
from gateway.app.shedding import lone_prefill_s
from gateway.app.slo import engine_priority
from gateway.app.upstream import UpstreamError, UpstreamResponse
from gateway.bounds import MIN_WEIGHT
from gateway.dataplane.answers import (
    EngineRefused,
    UpstreamFailed,
    engine_error,
    has_output,
    json_object,
    take_usage,
)
from gateway.dataplane.routing import (
    alternative,
    dispatched,
    first_token,
    retry_tried,
    route,
    undispatch,
)
from gateway.errors import ApiError
from priority.request import SLO

if TYPE_CHECKING:
    from gateway.app.backends import Backend
    from gateway.app.proxy import Job
    from priority.routing import RouteDecision

log = logging.getLogger("gateway.app.proxy")
"""The request path's one logger: operators filter on it, wherever the code lives."""


async def dispatch(job: Job) -> UpstreamResponse | Response:
    """Send to a backend, failing over before the first token.

    Returns the upstream response: for streaming, open and positioned after the first
    token's event (kept in ``job.pending``); for non-streaming, fully read. A 4xx from the
    engine is returned to the client in the gateway's dialect (:func:`engine_error`, as a
    finished :class:`Response`), as is a stream whose first event is a 4xx error.
    """
    assert job.group is not None and job.core is not None
    if job.length is not None:  # at most what is left of its budget (5 ms by default)
        await job.length.ready()
    body = payload(job)
    tried: set[str] = set()
    exclude: frozenset[str] = frozenset()
    last_error = "no backend was tried"
    budget: AttemptBudget | None = None
    for _ in range(job.state.settings.max_attempts):
        now = time.monotonic()
        decision = job.decision or route(job, now, exclude)
        job.decision = None
        if budget is None:  # from the first dispatch; retries get what is left of it
            budget = _budget(job, decision, now)
        backend = job.group.backends[decision.instance]
        dispatched(job, backend, decision, now)
        try:
            return await _timed_attempt(job, backend, body, budget.timeout(now), tried)
        except UpstreamFailed as exc:
            last_error = f"backend {backend.name}: {exc}"
            log.info(
                "request %s failed before its first token on %s: %s",
                job.request_id,
                backend.name,
                exc,
            )
            if not exc.recorded:
                job.state.pool.record_failure(backend, counts=not exc.abandoned)
            undispatch(job)
            tried.add(backend.name)
            exclude = frozenset(tried)
            if not alternative(job, backend, tried):
                if not retry_tried(job, budget):  # a healthy one failed: say so, not
                    break  # "no healthy backend"
                exclude = frozenset()
            job.state.metrics.failovers.labels(job.tier).inc()
    raise ApiError(
        503,
        f"every backend attempt failed; last: {last_error}",
        code="upstream_unavailable",
        headers={"retry-after": "1"},
    )


def payload(job: Job) -> bytes:
    """The client's body as the engine gets it: the engine's priority, the request's metadata
    in ``vllm_xargs`` (a demoted request's as best effort), the usage chunk asked for."""
    assert job.meta is not None
    meta = job.meta
    if job.length is not None:  # the length distribution, if predicted by now
        meta = dataclasses.replace(meta, length=job.length.now())
    if job.demoted:  # it gave its deadline up at admission: the engine serves it as such
        slo = SLO(ttft_s=meta.slo.ttft_s, tpot_s=meta.slo.tpot_s)
        meta = dataclasses.replace(
            meta,
            slo=slo,
            weight=MIN_WEIGHT,  # overload: the smallest weight
            kind="best-effort",
            workflow_id=None,
            stage=0,
            workflow_deadline_s=None,
        )
    body = dict(job.body)
    body["priority"] = engine_priority(meta.weight)
    # a client's own tiergate_* keys never reach the engine: only the gateway sets them (a
    # tier without a deadline must not let the client pick one)
    xargs = without_protocol_keys(body.get("vllm_xargs"))
    xargs.update(encode(meta))
    body["vllm_xargs"] = xargs
    if job.stream:  # the gateway needs the usage chunk; it strips it if not asked for
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


def _budget(job: Job, decision: RouteDecision, now: float) -> AttemptBudget:
    assert job.meta is not None
    return attempt_budget(
        job.state.settings,
        job.meta,
        stream=job.stream,
        expected_output=job.expected_output,
        best_effort=best_effort(job, decision),
        arrival=job.arrival,
        first_dispatch=now,
    )


def best_effort(job: Job, decision: RouteDecision) -> bool:
    """Served without a TTFT objective: demoted at admission, or its tier allows best
    effort and the router sees no backend meeting its TTFT."""
    if job.demoted:
        return True
    gain = decision.expected_gain
    return job.identity.policy.best_effort_allowed and gain is not None and gain <= 0.0


async def _timed_attempt(
    job: Job, backend: Backend, body: bytes, timeout_s: float, tried: set[str]
) -> UpstreamResponse | Response:
    """:func:`_attempt` within ``timeout_s`` (to the first token, or the whole answer when
    not streaming); abandoned at once if the backend's breaker opens meanwhile.

    When the budget runs out on an engine that is serving (:meth:`BackendPool.queueing`:
    its own queue holds the request) the wait is queueing, not a fault: it counts nothing
    against the engine, and where no other healthy backend is left to try, the request
    keeps waiting there (until its deadline, else the upstream read timeout) rather than
    failing on the one engine that can still serve it.
    """
    pool = job.state.pool
    loop = asyncio.get_running_loop()
    queued = False
    patience_end = loop.time() + patience_s(job)
    check: asyncio.TimerHandle | None = None

    def budget_spent(deadline: asyncio.Timeout) -> None:
        nonlocal queued, check
        if deadline.expired():  # abandoned meanwhile (the breaker opened): nothing to judge
            return
        if not queued and pool.queueing(backend, time.monotonic()):
            queued = True  # counted once per attempt, whether it then waits or moves
            pool.metrics.upstream_timeouts.labels(backend.name, "queued").inc()
        else:
            queued = queued and pool.queueing(backend, time.monotonic())
        now = loop.time()
        if queued and not alternative(job, backend, tried) and now < patience_end:
            recheck = max(0.05, min(pool.stall_threshold(backend), patience_end - now))
            check = loop.call_later(recheck, budget_spent, deadline)
            return
        deadline.reschedule(now)

    try:
        async with asyncio.timeout(None) as deadline:
            backend.attempts.add(deadline)
            check = loop.call_later(timeout_s, budget_spent, deadline)
            try:
                return await _attempt(job, backend, body)
            finally:
                backend.attempts.discard(deadline)
                if check is not None:
                    check.cancel()
    except TimeoutError:
        if not backend.breaker.routable(time.monotonic()):
            raise UpstreamFailed(
                f"abandoned: the backend's breaker opened ({backend.breaker.reason})",
                abandoned=True,
            ) from None
        what = "no first token" if job.stream else "no answer"
        if queued:  # the engine's own queue: try elsewhere, blame nothing
            raise UpstreamFailed(
                f"{what} within {timeout_s:.3g} s: queued on a busy engine", recorded=True
            ) from None
        pool.record_timeout(backend, "first_token" if job.stream else "response")
        raise UpstreamFailed(f"{what} within {timeout_s:.3g} s", recorded=True) from None


def patience_s(job: Job) -> float:
    """How long a request may keep waiting in a serving engine's queue when no other
    backend could take it: to its deadline, else the upstream read timeout."""
    limit = job.state.settings.upstream_timeout_s
    deadline_s = job.deadline_s()
    if deadline_s is not None and not job.demoted:
        limit = min(limit, job.arrival + deadline_s - time.monotonic())
    return max(0.0, limit)


async def _attempt(job: Job, backend: Backend, body: bytes) -> UpstreamResponse | Response:
    url = backend.chat_url if job.kind == "chat" else backend.completions_url
    try:
        upstream = await job.state.pool.upstream.post_json(url, body)
    except UpstreamError as exc:
        raise UpstreamFailed(str(exc)) from None
    keep_open = False
    try:
        if upstream.status != 200 and not 400 <= upstream.status < 500:
            raise UpstreamFailed(f"HTTP {upstream.status}")  # 5xx, or no OpenAI answer
        if upstream.status != 200:  # the engine refused it: the client's answer
            content = await upstream.read()
            return engine_error(upstream.status, content).response()
        job.accepted = True  # reset by undispatch if this attempt fails before a token
        if not job.stream:
            timer = _expect_first_token(job, backend)
            try:
                content = await upstream.read()
            finally:
                timer.cancel()
            answer = json_object(content)
            if answer is None:  # garbage with a 200: another backend may do better
                raise UpstreamFailed("the engine answered 200 with a body that is not JSON")
            if not job.first_token:
                first_token(job, backend)
            take_usage(job, answer)
            job.state.pool.record_success(backend)
            return Response(content, 200, media_type="application/json")
        job.response, job.batches = upstream, upstream.event_batches()
        try:
            job.pending = await _until_first_token(job, backend)
        except EngineRefused as refused:
            job.accepted = False  # refused, as a 4xx status is: nothing was served
            return refused.error.response()
        keep_open = True
        return upstream
    except UpstreamError as exc:
        raise UpstreamFailed(str(exc)) from None
    finally:
        if not keep_open:
            upstream.close()


async def _until_first_token(job: Job, backend: Backend) -> list[bytes]:
    """Events up to the first one carrying output (parsed until then), and any that came
    in the same read; ``job.first_output`` is that event's index."""
    held: list[bytes] = []
    async for batch in job.batches:
        backend.last_event = time.monotonic()
        for position, event in enumerate(batch):
            held.append(event)
            if has_output(event):
                first_token(job, backend)
                job.first_output = len(held) - 1
                held.extend(batch[position + 1 :])
                return held
            if event.startswith(b"data: [DONE]"):
                job.first_output = len(held)  # a stream with no output at all
                return held
    raise UpstreamFailed("the stream ended before the first token")


def _expect_first_token(job: Job, backend: Backend) -> asyncio.TimerHandle:
    """A non-streaming response shows no first token, so the router is told it came after
    the backend's estimated zero-load prefill time (the next scrape corrects the rest):
    otherwise the request would count as queued prefill work for its whole life."""
    delay = lone_prefill_s(backend, job.prompt_tokens)
    return asyncio.get_running_loop().call_later(delay, first_token, job, backend)
