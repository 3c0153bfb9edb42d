"""Least predicted TTFT behind an SLO headroom filter: llm-d's predicted-latency scorer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from priority.request import Request
from priority.routing.base import InstanceRole, InstanceView, RouteDecision, Router
from priority.routing.decode import decode_step_s, pick_decode_by_capacity, running_decodes_s
from priority.routing.plugin import RouterPlugin
from priority.routing.prefill_queue import raw_prefill_work
from priority.routing.simple import prefill_candidates


@dataclass(frozen=True, slots=True)
class LeastTtftParams:
    headroom: float = 0.0
    """Fraction of each SLO kept in reserve: an instance qualifies when its predicted TTFT is at
    most ``(1 - headroom)`` of the request's first-token due time and its predicted TPOT at
    most that fraction of the TPOT SLO."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.headroom < 1.0:
            raise ValueError(f"headroom must be in [0, 1), got {self.headroom}")


@dataclass(frozen=True, slots=True)
class LatencyPrediction:
    index: int
    ttft_s: float
    """From now to the request's first token there."""
    tpot_s: float
    """One decode step there with the request added (0 on a PD prefill instance)."""


def predict(instance: InstanceView, request: Request, now: float) -> LatencyPrediction:
    """TTFT and TPOT of ``request`` on ``instance`` by the instance's own (corrected) estimator.

    Every chunk of the queued prompts and of the request's is one batch, carrying the batch
    overhead and one step of each running decode; work queued before the last update is
    lag-compensated (time since then has run some of it). TPOT: one step of the running
    decodes plus the request's own.
    """
    est = instance.estimator
    chunk = instance.profile.engine.max_num_batched_tokens
    totals = instance.prefill_totals
    raw_q, chunks_q = totals.raw_work, totals.chunks
    updated = instance.queue_updated_s
    if instance.external_prefills is not None:
        raw_q += instance.external_prefills.raw_work
        chunks_q += instance.external_prefills.chunks
        updated = max(updated, instance.external_prefills.updated_s)
    raw_r, chunks_r = raw_prefill_work(est.coefficients, chunk, request.prompt_tokens)
    decodes = 0.0 if instance.role is InstanceRole.PREFILL else running_decodes_s(instance)
    per_batch = est.t_c + decodes
    queued = est.beta * raw_q + chunks_q * per_batch
    own = est.beta * raw_r + chunks_r * per_batch
    ttft = max(0.0, queued - max(0.0, now - updated)) + own
    tpot = 0.0
    if instance.role is not InstanceRole.PREFILL:
        tpot = decode_step_s(instance, request.prompt_tokens)
    return LatencyPrediction(instance.index, ttft, tpot)


class LeastTtftRouter(Router):
    """llm-d's predicted-latency scorer: keep the instances predicted to meet the request's SLO
    (TTFT, and TPOT where it decodes), send to the least predicted TTFT among them; when none
    has headroom, to the least loaded (fewest outstanding requests), ties to the lower index.

    The predictor is tiergate's estimator per instance (llm-d trains its own), so differences
    against GoRouting are in the decision, not the prediction. Under PD-disaggregation the
    decode instance is chosen by predicted TPOT with headroom too, as llm-d scores decode pods
    (:func:`~priority.routing.decode.pick_decode_by_capacity`, the choice GoRouting makes).
    """

    name = "least-predicted-ttft"

    def __init__(
        self, instances: Sequence[InstanceView], params: LeastTtftParams | None = None
    ) -> None:
        super().__init__(instances)
        self.params = params if params is not None else LeastTtftParams()

    def route(
        self, request: Request, now: float, *, exclude: frozenset[int] = frozenset()
    ) -> RouteDecision:
        candidates = prefill_candidates(self.instances, exclude)
        keep = 1.0 - self.params.headroom
        ttft_due = keep * request.slo.token_due_s(1)
        tpot_due = math.inf if request.slo.tpot_s is None else keep * request.slo.tpot_s
        predictions = [predict(i, request, now) for i in candidates]
        fits = [p for p in predictions if p.ttft_s <= ttft_due and p.tpot_s <= tpot_due]
        decode = pick_decode_by_capacity(self.instances, request, exclude)
        if fits:
            best = min(fits, key=lambda p: (p.ttft_s, p.index))
            return RouteDecision(best.index, decode, predicted_ttft_s=best.ttft_s)
        chosen = min(candidates, key=lambda i: (i.num_outstanding, i.index))
        ttft = next(p.ttft_s for p in predictions if p.index == chosen.index)
        return RouteDecision(chosen.index, decode, predicted_ttft_s=ttft)


def least_predicted_ttft(instances: Sequence[InstanceView], **params: Any) -> LeastTtftRouter:
    return LeastTtftRouter(instances, LeastTtftParams(**params))


PLUGIN = RouterPlugin(
    LeastTtftRouter.name,
    LeastTtftRouter,
    least_predicted_ttft,
    LeastTtftParams,
    "llm-d's router: predicted-latency scorer with an SLO headroom filter",
)
