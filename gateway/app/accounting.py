"""What one request earns when it ends: gain, ideal gain, an SLO-attainment sample and usage.

One pure function, :func:`account`, holds the definitions of ``docs/usage.md``, so that the
metrics and the usage table cannot disagree and the rules can be tested without a server:

* Only work an engine **accepted** (answered 200 on the attempt that served it) is accounted.
  A request the gateway refused (400, 404, 429, 503 at admission), one an engine refused (4xx),
  one that failed before any engine accepted it and one cancelled before that earn no gain, no
  ideal gain, no attainment sample and no tokens: they are only counted, by outcome. Otherwise a
  single request with an absurd ``max_tokens`` (refused by the engine) would add an astronomical
  ideal gain to its tier and read every tenant's TDG ratio as 0.
* The TDG ratio is PROSERVE's delivered gain over the ideal gain *of the served work*, so the
  ideal is taken over the tokens the request could really have received: the tokens delivered
  when it finished (``ok``) or when its client left (``cancelled``: the rest was not wanted);
  for one that failed mid-way (``error``), its output budget (``max_tokens``, else the gateway's
  ``default_max_tokens``) and never less than what it got, so a failure costs the tier the
  tokens it lost. An engine refuses a ``max_tokens`` that does not fit the context, so an
  accepted budget is within the context left; it is clamped to :data:`MAX_ACCOUNTED_TOKENS`
  besides, and a gain that is not finite and non-negative (a weight outside its documented
  bounds) is dropped rather than recorded, so totals stay finite for any input.
* An attainment sample exists only for a request that finished (``ok``): a refusal, a failure or
  a cancellation is reported as such, never as an SLO miss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any
from weakref import WeakKeyDictionary

from prometheus_client import Counter, Histogram

from gateway.app.metrics import GatewayMetrics
from gateway.bounds import MAX_OUTPUT_TOKENS
from priority.gain import GainWeights, ideal_tdg, slo_attained, tdg
from priority.request import SLO

MAX_ACCOUNTED_TOKENS = MAX_OUTPUT_TOKENS
"""Most output tokens one request is accounted for (the usage table's INTEGER range): no
engine's context comes near it, so it only bounds what a misbehaving engine could report. With
weights within :data:`~gateway.bounds.MAX_WEIGHT`, one request's ideal gain stays below
``1024 * 2**31`` times the larger token weight."""


class Outcome(StrEnum):
    """How a request ended; the values are the usage table's ``status``."""

    OK = "ok"
    """An engine accepted it and it finished (the answer reached the client)."""
    FAILED = "error"
    """An engine or the gateway failed it: 5xx, a broken stream, no backend could take it."""
    REJECTED = "rejected"
    """Refused: by the gateway at admission (4xx, 429, 503) or by an engine (4xx)."""
    CANCELLED = "cancelled"
    """The client left before the answer was complete."""


@dataclass(frozen=True, slots=True)
class Account:
    """One request's contribution to its tier's and tenant's totals."""

    accepted: bool
    """Whether it counts as work an engine accepted; if not, every other field is zero."""
    gain: float
    """TDG earned by the delivered tokens (PROSERVE Eq. 3)."""
    ideal_gain: float
    """TDG had every accounted token been on time."""
    slo_met: bool | None
    """The attainment sample: ``None`` when the request has none (it did not finish)."""
    prompt_tokens: int
    """Prompt tokens an engine processed for it (0 when no engine accepted it)."""
    completion_tokens: int
    """Output tokens delivered to the client (0 when no engine accepted it)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def usage_fields(self) -> dict[str, Any]:
        """The :class:`~gateway.db.usage.UsageEvent` fields this account fills (a request with no
        attainment sample is stored with ``slo_met`` false; reports count samples of ``ok``
        requests only)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "gain": self.gain,
            "ideal_gain": self.ideal_gain,
            "slo_met": self.slo_met is True,
        }


NOTHING = Account(
    accepted=False, gain=0.0, ideal_gain=0.0, slo_met=None, prompt_tokens=0, completion_tokens=0
)
"""What refused work, and work no engine accepted, contributes."""


def account(
    outcome: Outcome,
    *,
    accepted: bool,
    arrival_s: float,
    slo: SLO | None,
    weight: float,
    token_times: Sequence[float],
    output_budget: int,
    prompt_tokens: int,
    weights: GainWeights,
) -> Account:
    """Account for one request that ended with ``outcome``.

    ``accepted``: an engine answered 200 on the attempt that served it (a rejected request is
    never accepted, whatever this says). ``token_times``: egress time of each output token that
    reached the client, in order. ``output_budget``: the output tokens it asked for
    (``max_tokens``, else the gateway's default). ``prompt_tokens``: the engine's count when it
    reported one, else the gateway's estimate.
    """
    if outcome is Outcome.REJECTED or not accepted or slo is None:
        return NOTHING
    times = token_times[:MAX_ACCOUNTED_TOKENS]
    delivered = len(times)
    accounted = delivered
    if outcome is Outcome.FAILED:  # the tokens it lost count against the tier
        accounted = max(delivered, min(max(output_budget, 0), MAX_ACCOUNTED_TOKENS))
    gain = tdg(arrival_s, slo, weight, times, weights) if delivered else 0.0
    ideal = ideal_tdg(weight, accounted, weights)
    if not (0.0 <= gain < math.inf and 0.0 <= ideal < math.inf):
        gain = ideal = 0.0  # only a weight outside its bounds gets here: record no gain
    met = slo_attained(arrival_s, slo, times, finished=True) if outcome is Outcome.OK else None
    return Account(
        accepted=True,
        gain=gain,
        ideal_gain=ideal,
        slo_met=met,
        prompt_tokens=min(max(prompt_tokens, 0), MAX_ACCOUNTED_TOKENS),
        completion_tokens=delivered,
    )


@dataclass(frozen=True, slots=True)
class TierSeries:
    """One tier's series of the metrics every request ends in, looked up once: ``labels()``
    checks its values and takes a lock on each call, several times per request otherwise."""

    ttft: Histogram
    e2e: Histogram
    gain: Counter
    ideal_gain: Counter
    slo_met: Counter
    slo_missed: Counter


_series: WeakKeyDictionary[GatewayMetrics, dict[str, TierSeries]] = WeakKeyDictionary()


def tier_series(metrics: GatewayMetrics, tier: str) -> TierSeries:
    """``tier``'s :class:`TierSeries` in ``metrics`` (a tier's series are never removed)."""
    by_tier = _series.get(metrics)
    if by_tier is None:
        by_tier = _series.setdefault(metrics, {})
    series = by_tier.get(tier)
    if series is None:
        series = by_tier[tier] = TierSeries(
            ttft=metrics.ttft.labels(tier),
            e2e=metrics.e2e.labels(tier),
            gain=metrics.gain.labels(tier),
            ideal_gain=metrics.ideal_gain.labels(tier),
            slo_met=metrics.slo.labels(tier, "true"),
            slo_missed=metrics.slo.labels(tier, "false"),
        )
    return series


def record_gain(
    metrics: GatewayMetrics, tier: str, result: Account, series: TierSeries | None = None
) -> None:
    """Add an accepted request's gain, ideal gain and attainment sample to its tier's counters;
    refused work leaves them untouched (it is counted in ``tiergate_requests`` by status).
    ``series``: the tier's, where the caller has looked them up already."""
    if not result.accepted:
        return
    if series is None:
        series = tier_series(metrics, tier)
    series.gain.inc(result.gain)
    series.ideal_gain.inc(result.ideal_gain)
    if result.slo_met is not None:
        (series.slo_met if result.slo_met else series.slo_missed).inc()


def record_spend(metrics: GatewayMetrics, tier: str | None, cost: Decimal) -> None:
    """Add a charged request's cost to its tier's ``tiergate_spend_total`` (a float counter:
    the usage records keep the exact amounts)."""
    if cost > 0:
        metrics.spend.labels(tier or "").inc(float(cost))


class MissReason(StrEnum):
    """Why a request missed its SLO, from what the stages knew (the request log's
    ``miss_reason``); the first that applies, in this order."""

    HOPELESS = "hopeless"
    """Shed or declined at admission: its objective could not be met when it arrived."""
    DEMOTED = "demoted"
    """Demoted to best effort at admission or by the engines' planners (overload)."""
    QUEUED = "queued"
    """Waited in the gateway's admission queue longer than its TTFT objective."""
    FAILOVER = "failover"
    """Its first backend failed before the first token; it was served by another."""
    ENGINE_SLOW = "engine_slow"
    """The engine took much longer to the first token than the router predicted, with little
    queueing in the gateway."""
    STALLED = "stalled"
    """Its first token was on time; the tokens after it came slower than its TPOT."""
    UNKNOWN = "unknown"
    """None of the above explains it."""


MISS_WORDS: dict[str, str] = {
    MissReason.HOPELESS: "shed or declined at admission: its objective was out of reach",
    MissReason.DEMOTED: "demoted to best effort under overload",
    MissReason.QUEUED: "waited in the gateway queue beyond its TTFT",
    MissReason.FAILOVER: "failed over to another backend",
    MissReason.ENGINE_SLOW: "the engine was slower than predicted",
    MissReason.STALLED: "stalled mid-stream (time per output token missed)",
    MissReason.UNKNOWN: "no stage explains it",
}
"""Each reason in words, as the dashboard shows it."""

HOPELESS_REASONS = frozenset({"slo_infeasible", "slo_unattainable", "slo_declined"})
"""Admission refusals that say the objective could not be met (the shedder's, the planners')."""
ENGINE_SLOW_FACTOR = 1.5
"""Measured dispatch-to-first-token over the router's prediction that counts as "slower"."""


def miss_reason(
    outcome: Outcome,
    *,
    reject_reason: str | None,
    slo_met: bool | None,
    demoted: bool,
    queue_ms: float | None,
    attempts: int,
    ttft_ms: float | None,
    slo_ttft_ms: float | None,
    tpot_ms: float | None,
    slo_tpot_ms: float | None,
    engine_ttft_ms: float | None,
    predicted_ttft_ms: float | None,
) -> MissReason | None:
    """Why the request missed its SLO, or None when it did not (met, or no sample: failed,
    cancelled, refused for a reason that is not its objective's)."""
    if outcome is Outcome.REJECTED:
        return MissReason.HOPELESS if reject_reason in HOPELESS_REASONS else None
    if outcome is not Outcome.OK or slo_met is not False:
        return None
    if demoted:
        return MissReason.DEMOTED
    ttft_late = ttft_ms is not None and slo_ttft_ms is not None and ttft_ms > slo_ttft_ms
    if ttft_late and queue_ms is not None and slo_ttft_ms is not None and queue_ms > slo_ttft_ms:
        return MissReason.QUEUED
    if attempts > 1:
        return MissReason.FAILOVER
    if (
        ttft_late
        and engine_ttft_ms is not None
        and predicted_ttft_ms is not None
        and engine_ttft_ms > ENGINE_SLOW_FACTOR * predicted_ttft_ms
    ):
        return MissReason.ENGINE_SLOW
    if not ttft_late and tpot_ms is not None and slo_tpot_ms is not None and tpot_ms > slo_tpot_ms:
        return MissReason.STALLED
    return MissReason.UNKNOWN
