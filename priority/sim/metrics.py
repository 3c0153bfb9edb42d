"""Summary metrics of a simulation run, computed only through :mod:`priority.gain`.

Conventions: every *submitted* request counts in the denominators — unfinished and rejected
requests keep their ideal TDG and count as SLO misses. TTFT percentiles cover requests that
produced at least one token, TPOT percentiles (per-request mean TPOT) those with at least two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from priority.gain import (
    GainWeights,
    ideal_tdg,
    mean_tpot_s,
    request_tdg,
    slo_attained,
    token_goodput,
    ttft_s,
)
from priority.request import Request


class ResultLike(Protocol):
    @property
    def requests(self) -> list[Request]: ...


class WorkloadLike(Protocol):
    @property
    def gain_weights(self) -> GainWeights: ...

    @property
    def tier_weights(self) -> dict[str, float]: ...


def summarize(
    result: ResultLike, workload: WorkloadLike, *, first_token_buffered: bool = True
) -> dict[str, Any]:
    """Headline metrics (TDG ratio, SLO attainment, goodput, latency percentiles) and per tier."""
    requests = result.requests
    weights = workload.gain_weights
    n = len(requests)
    gain = np.empty(n)
    ideal = np.empty(n)
    attained = np.zeros(n, dtype=bool)
    goodput = np.zeros(n)
    ttfts: list[float] = []
    tpots: list[float] = []
    for k, r in enumerate(requests):
        times = r.token_times
        gain[k] = request_tdg(r, weights, first_token_buffered=first_token_buffered)
        ideal[k] = ideal_tdg(r.weight, r.target_output_tokens, weights)
        if times:
            finished = r.is_finished
            attained[k] = slo_attained(r.arrival_s, r.slo, times, finished=finished)
            goodput[k] = token_goodput(
                r.arrival_s, r.slo, r.prompt_tokens, times, finished=finished
            )
            ttfts.append(ttft_s(r.arrival_s, times))
            if len(times) >= 2:
                tpots.append(mean_tpot_s(times))

    tier_names = [r.tier for r in requests]
    per_tier: dict[str, dict[str, float | int]] = {}
    tier_weights = workload.tier_weights
    for tier in dict.fromkeys(tier_names):
        mask = np.fromiter((t == tier for t in tier_names), dtype=bool, count=n)
        per_tier[tier] = {
            "weight": tier_weights.get(tier, math.nan),
            "tdg_ratio": _ratio(gain[mask].sum(), ideal[mask].sum()),
            "slo_attainment": _ratio(attained[mask].sum(), mask.sum()),
            "submitted": int(mask.sum()),
        }
    return {
        "submitted": n,
        "finished": sum(1 for r in requests if r.is_finished),
        "tdg_ratio": _ratio(gain.sum(), ideal.sum()),
        "slo_attainment": _ratio(attained.sum(), n),
        "goodput_tokens": float(goodput.sum()),
        "goodput_requests": int(attained.sum()),
        "ttft_p50_s": _percentile(ttfts, 50),
        "ttft_p99_s": _percentile(ttfts, 99),
        "tpot_p50_s": _percentile(tpots, 50),
        "tpot_p99_s": _percentile(tpots, 99),
        "per_tier": per_tier,
    }


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den > 0 else math.nan


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan
