"""A request's kind — latency, deadline, compound or best-effort — from its headers and tier.

The four request kinds (:data:`priority.request.REQUEST_KINDS`; gains in :mod:`priority.gain`):

* ``x-tiergate-workflow-id: ID`` makes the request **compound**: one call of an agent workflow
  whose calls share one deadline. The workflow's first call sets that deadline with
  ``x-tiergate-workflow-deadline-ms`` (from its arrival); later calls of the same id inherit it
  (the header is then ignored) and get the next stage. An unknown id without a deadline header
  is 400 ``unknown_workflow``, a workflow past its deadline 409 ``workflow_expired``, never a new
  workflow (state and Redis: :mod:`gateway.app.workflows`).
* else ``x-slo-deadline-ms`` makes it a **deadline** request;
* else the tier's ``default_kind``: ``latency`` (TTFT/TPOT, every tier's before kinds existed),
  ``deadline`` or ``best-effort`` (both scheduled to the tier's default deadline).

**Sub-deadlines.** Each workflow call is given D_s, its share of the time left to the workflow's
deadline (``tiergate_sub_deadline_ms``; the deadline its engine schedules for). The share comes
from :attr:`RequestKinds.sub_deadline`, a hook: ``hook(call) -> ms`` (or None: cold start).
The app installs :class:`~gateway.app.patterns.WorkflowPatterns` there: JITServe's φ(s)·D from
historical pattern graphs, learned per process from the workflows this process served whole
(``patterns=``; it also hears every call's end through :meth:`RequestKinds.call_ended`).
Without a match — no history yet, or none of this structure — the **cold start** gives a call
all the time left (:func:`cold_start`): an agent's next step is unknown, and any fixed share
would make the last calls of a long workflow look late when the workflow as a whole is on time.
Whatever the hook says is clipped to (0, time left], and an explicit ``x-slo-deadline-ms`` on
the call caps it.

Header values are checked like the SLO headers: a workflow id is 1–128 of ``A-Z a-z 0-9 . _ :
-``, a workflow deadline a number of milliseconds from :data:`~gateway.bounds.MIN_SLO_MS` to
:data:`~gateway.bounds.MAX_SLO_MS`; anything else is 400 ``invalid_value`` naming the header. A
workflow deadline tighter than the tier's deadline floor is 400 ``invalid_request``, as a
tighter SLO header is (every code: :mod:`gateway.errors`).

**Redis away.** Each workflow call answered without Redis is reported to ``on_degraded`` (the
app's ``tiergate_workflow_degraded_calls_total{outcome}``): ``local`` when this process's
copy of the workflow answered (the call is still compound; a 409 from that copy counts too),
``default_kind`` when the workflow is one this process never saw, served as its tier's default
kind (:class:`~gateway.app.workflows.WorkflowUnavailable`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gateway.app.schemas import ChatBody, CompletionBody
from gateway.app.slo import DEADLINE_HEADER, _floor, _floor_check
from gateway.app.workflows import (
    MemoryWorkflowStore,
    WorkflowCall,
    WorkflowExpired,
    WorkflowStore,
    WorkflowUnavailable,
    WorkflowUnknown,
)
from gateway.bounds import MAX_SLO_MS, MIN_SLO_MS
from gateway.db.identity import EffectivePolicy
from gateway.errors import INVALID_VALUE, ApiError
from priority.lengths.distribution import LengthDistribution
from priority.request import RequestMeta

if TYPE_CHECKING:  # the predictor loads only with TIERGATE_LENGTH_MODEL (imported when used)
    from gateway.app.patterns import CallEnd, WorkflowPatterns
    from priority.lengths.features import RequestFeatures
    from priority.lengths.serving import PredictorHandle

log = logging.getLogger(__name__)

WORKFLOW_ID_HEADER = "x-tiergate-workflow-id"
WORKFLOW_DEADLINE_HEADER = "x-tiergate-workflow-deadline-ms"
WORKFLOW_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
UNKNOWN_WORKFLOW = "unknown_workflow"
WORKFLOW_EXPIRED = "workflow_expired"
DEGRADED_LOCAL = "local"
"""A workflow call answered from this process's copy while Redis is away (still compound)."""
DEGRADED_DEFAULT_KIND = "default_kind"
"""A call of a workflow this process never saw, while Redis is away: its tier's default kind."""
DEGRADED_OUTCOMES = (DEGRADED_LOCAL, DEGRADED_DEFAULT_KIND)
"""Every outcome ``on_degraded`` reports (the metric has a series for each from the start)."""

LENGTH_BUDGET_S = 0.005
"""The most a length prediction may take by default (the p99 target;
``TIERGATE_LENGTH_BUDGET_MS``); later, none is sent."""

SubDeadlineHook = Callable[[WorkflowCall], float | None]
"""``hook(call)``: the call's sub-deadline in ms from its arrival, or None for the cold start."""
DegradedHook = Callable[[str, str], None]
"""``hook(tier, outcome)``: a workflow call answered without Redis (:data:`DEGRADED_LOCAL` or
:data:`DEGRADED_DEFAULT_KIND`); the app's is the ``tiergate_workflow_degraded_calls`` metric."""


def cold_start(call: WorkflowCall) -> float:
    """A call of a workflow without history: all the time left (module docstring)."""
    return call.remaining_ms


class RequestKinds:
    """The gateway's request-kind state: the workflow store and the sub-deadline hook."""

    def __init__(
        self,
        store: WorkflowStore | None = None,
        *,
        sub_deadline: SubDeadlineHook | None = None,
        lengths: PredictorHandle | None = None,
        length_budget_s: float = LENGTH_BUDGET_S,
        on_degraded: DegradedHook | None = None,
        learn: bool = False,
        patterns: WorkflowPatterns | None = None,
    ) -> None:
        self.store: WorkflowStore = store if store is not None else MemoryWorkflowStore()
        self.patterns = patterns
        """The workflow history (:mod:`gateway.app.patterns`); its hook is the default one."""
        if sub_deadline is None and patterns is not None:
            sub_deadline = patterns.sub_deadline
        self.sub_deadline: SubDeadlineHook | None = sub_deadline
        self.on_degraded = on_degraded
        self.lengths = lengths
        """The output-length model (``TIERGATE_LENGTH_MODEL``); None: no distribution is sent."""
        self.length_budget_s = length_budget_s
        self.learn = learn
        """Whether requests' features are kept for length samples (``TIERGATE_LENGTHS_LEARN``)."""
        self.served_without_workflow = 0
        """Workflow calls served as their tier's default kind: Redis away, workflow unseen."""

    async def resolve(
        self,
        headers: Mapping[str, str],
        meta: RequestMeta,
        policy: EffectivePolicy,
        *,
        tier: str,
        tenant_key: str,
    ) -> RequestMeta:
        """``meta`` (from :func:`~gateway.app.slo.resolve_slo`) with its kind, and for a
        workflow call its stage and deadlines (the share as its SLO's deadline, the time left
        to the workflow's as ``workflow_deadline_s``); :class:`ApiError` 400/409 as
        documented."""
        workflow_id = _workflow_id(headers)
        total = _milliseconds(headers, WORKFLOW_DEADLINE_HEADER)
        if workflow_id is None:
            if total is not None:
                raise ApiError(
                    400,
                    f"header {WORKFLOW_DEADLINE_HEADER} needs {WORKFLOW_ID_HEADER}: it sets the "
                    "deadline of the workflow that id names",
                    code=INVALID_VALUE,
                    param=WORKFLOW_DEADLINE_HEADER,
                )
            return dataclasses.replace(meta, kind=_single_kind(headers, policy))
        if total is not None:
            default = policy.deadline_ms if policy.deadline_ms is not None else policy.ttft_ms
            floor, source = _floor(policy.min_deadline_ms, default)
            _floor_check(WORKFLOW_DEADLINE_HEADER, total, floor, tier, source)
        try:
            call = await self.store.join(f"{tenant_key}:{workflow_id}", total)
        except WorkflowUnavailable:
            self.served_without_workflow += 1
            self._degraded(tier, DEGRADED_DEFAULT_KIND)
            log.warning("workflow call served as its tier's default kind: Redis unreachable")
            return dataclasses.replace(meta, kind=_single_kind(headers, policy))
        except WorkflowUnknown:
            raise ApiError(
                400,
                f"unknown workflow {workflow_id!r}: its first call must set "
                f"{WORKFLOW_DEADLINE_HEADER} (a workflow is kept until its deadline, and a "
                "while after it)",
                code=UNKNOWN_WORKFLOW,
                param=WORKFLOW_ID_HEADER,
            ) from None
        except WorkflowExpired as exc:
            self._degraded_if_local(tier)  # a 409 from this process's copy is degraded too
            raise ApiError(
                409,
                f"workflow {workflow_id!r} expired {exc.late_ms:.0f} ms ago: its deadline has "
                "passed; start a new workflow under a new id",
                code=WORKFLOW_EXPIRED,
                param=WORKFLOW_ID_HEADER,
            ) from None
        self._degraded_if_local(tier)
        share_s = self._share(call) / 1e3
        if DEADLINE_HEADER in headers and meta.slo.deadline_s is not None:
            share_s = min(share_s, meta.slo.deadline_s)  # the call's own, when it names one
        return dataclasses.replace(
            meta,
            slo=dataclasses.replace(meta.slo, deadline_s=share_s),
            kind="compound",
            workflow_id=workflow_id,
            stage=call.stage,
            workflow_deadline_s=call.remaining_ms / 1e3,
        )

    def call_ended(self, end: CallEnd) -> None:
        """A workflow call ended (the proxy, once per call): the history learns from it. Never
        raises: learning must not fail a request's accounting."""
        if self.patterns is None:
            return
        try:
            self.patterns.call_ended(end)
        except Exception:
            log.exception("workflow history: could not record a call's end")

    def _degraded_if_local(self, tier: str) -> None:
        """Count the call just answered if this process's copy answered it: the failover store
        says ``degraded-local`` right after a join only then (no await in between)."""
        if self.store.mode == "degraded-local":
            self._degraded(tier, DEGRADED_LOCAL)

    def _degraded(self, tier: str, outcome: str) -> None:
        if self.on_degraded is not None:
            self.on_degraded(tier, outcome)

    def _share(self, call: WorkflowCall) -> float:
        share: float | None = None
        if self.sub_deadline is not None:
            try:
                share = self.sub_deadline(call)
            except Exception:  # a policy bug must not fail the request: cold start instead
                log.exception("sub-deadline hook failed; cold start for this call")
        if share is None or not (math.isfinite(share) and share > 0):
            share = cold_start(call)
        return min(share, call.remaining_ms)

    def length_features(
        self, body: ChatBody | CompletionBody, *, tenant: str, prompt_tokens: int
    ) -> RequestFeatures | None:
        """What the length predictor sees of the request, built once for its prediction and
        its length sample (:mod:`gateway.app.length_learning`); None when neither is wanted (no
        model loaded and not learning)."""
        if not self.learn and (self.lengths is None or self.lengths.current is None):
            return None
        from priority.lengths.features import RequestFeatures

        return RequestFeatures(
            prompt=prompt_text(body),
            model=body.model,
            prompt_tokens=prompt_tokens,
            max_tokens=body.expected_output(),
            tenant=tenant,
        )

    def predict_length(self, features: RequestFeatures | None) -> LengthPrediction | None:
        """Start predicting the request's output length *beside* admission (None: no model).

        The prediction runs in :mod:`priority.lengths.serving`'s pool, bounded by
        ``length_budget_s`` from here, while the request waits for its turn; dispatch waits
        for what is left of that budget (:meth:`LengthPrediction.ready`), if anything, and sends
        the distribution, or none when the model failed or ran late. Admission never waits.
        """
        if features is None or self.lengths is None or self.lengths.current is None:
            return None
        return LengthPrediction(self.lengths, features, features.max_tokens, self.length_budget_s)

    async def aclose(self) -> None:
        await self.store.aclose()


class LengthPrediction:
    """One request's length prediction, under way in the background."""

    _NONE = LengthDistribution.point(1)
    """The fallback :func:`apredict_with_budget` returns when it has nothing: sent as nothing."""

    def __init__(
        self,
        handle: PredictorHandle,
        features: RequestFeatures,
        max_tokens: int | None,
        budget_s: float = LENGTH_BUDGET_S,
    ) -> None:
        from priority.lengths.serving import apredict_with_budget

        self.max_tokens = max_tokens
        coro = apredict_with_budget(handle, features, budget_s, self._NONE)
        self._task = asyncio.get_running_loop().create_task(coro)

    async def ready(self) -> None:
        """Wait for the prediction: at most what is left of its budget (it runs under
        :data:`LENGTH_BUDGET_S` from admission, overlapping the queue wait)."""
        await asyncio.wait({self._task})

    def now(self) -> LengthDistribution | None:
        """The distribution if it is ready (capped by ``max_tokens``), else None (and the
        prediction is abandoned)."""
        if not self._task.done():
            self._task.cancel()
            return None
        if self._task.cancelled() or self._task.exception() is not None:
            return None
        result = self._task.result()
        if result is self._NONE:
            return None
        return dataclasses.replace(result, max_tokens=self.max_tokens)


def single_sequence(body: ChatBody | CompletionBody) -> bool:
    """Whether the request asks for one output (its completion tokens are one length): only
    such a request makes a length sample."""
    if (body.n or 1) != 1:
        return False
    if isinstance(body, CompletionBody):
        return body.best_of in (None, 1) and len(body.prompt_lengths()) == 1
    return True


def prompt_text(body: ChatBody | CompletionBody) -> str:
    """The prompt's text for the length features (token-id prompts have none: their count
    still goes in ``prompt_tokens``). Hashed into features; stored only where the operator
    turned ``TIERGATE_LENGTHS_STORE_PROMPTS`` on, never logged."""
    if isinstance(body, ChatBody):
        return "\n".join(m.text() for m in body.messages)
    prompt = body.prompt
    if isinstance(prompt, str):
        return prompt
    return "\n".join(p for p in prompt if isinstance(p, str))


def _single_kind(headers: Mapping[str, str], policy: EffectivePolicy) -> str:
    if DEADLINE_HEADER in headers:
        return "deadline"
    if policy.default_kind != "latency" and policy.deadline_ms is None:
        return "latency"  # defensive: the CRUD layer requires the deadline these kinds use
    return policy.default_kind


def _workflow_id(headers: Mapping[str, str]) -> str | None:
    raw = headers.get(WORKFLOW_ID_HEADER)
    if raw is None:
        return None
    if WORKFLOW_ID_PATTERN.fullmatch(raw) is None:
        raise ApiError(
            400,
            f"header {WORKFLOW_ID_HEADER} must be 1 to 128 letters, digits, '.', '_', ':' or "
            f"'-', got {raw[:40]!r}",
            code=INVALID_VALUE,
            param=WORKFLOW_ID_HEADER,
        )
    return raw


def _milliseconds(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and MIN_SLO_MS <= value <= MAX_SLO_MS):
        raise ApiError(
            400,
            f"header {name} must be a number of milliseconds from {MIN_SLO_MS:g} up to "
            f"{MAX_SLO_MS:g} (a day), got {raw[:40]!r}",
            code=INVALID_VALUE,
            param=name,
        )
    return value
