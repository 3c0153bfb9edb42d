"""Summary metrics of a simulation run, computed only through :mod:`priority.gain`.

Conventions: every *submitted* request counts in the denominators — unfinished and rejected
requests keep their ideal TDG and count as SLO misses. TTFT percentiles cover requests that
produced at least one token, TPOT percentiles (per-request mean TPOT) those with at least two.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from priority.gain import (
    GainWeights,
    WorkflowCall,
    ideal_tdg,
    jain_index,
    kind_attained,
    kind_goodput,
    mean_tpot_s,
    request_tdg,
    slo_attained,
    token_goodput,
    ttft_s,
    workflow_goodput,
)
from priority.request import REQUEST_KINDS, Request


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
        "multistage_attainment": multistage_attainment(requests, attained),
        **kind_metrics(requests, getattr(workload, "workflow_calls", None) or {}),
    }


def multistage_attainment(
    requests: Sequence[Request], attained: Sequence[bool] | npt.NDArray[np.bool_]
) -> float:
    """Share of multi-stage requests that attained every stage (SLOs-Serve's rule).

    A workflow's calls (``workflow_id``: a conversation or agent loop whose continuation — a new
    prompt turn after a tool call — is a stage with its own TTFT and TPOT) form one request; a
    call without a workflow is a one-stage request. ``attained`` is each call's own verdict
    (strict TTFT and TPOT, :func:`priority.gain.slo_attained`)."""
    groups: dict[str, bool] = {}
    for k, r in enumerate(requests):
        key = r.workflow_id if r.workflow_id is not None else f"\0{r.request_id}"
        groups[key] = groups.get(key, True) and bool(attained[k])
    return _ratio(sum(groups.values()), len(groups))


def kind_metrics(requests: Sequence[Request], calls: Mapping[str, Any]) -> dict[str, Any]:
    """``per_kind`` and ``jain_tenant``.

    Per kind: ``submitted`` requests; ``goodput_requests`` — requests judged on time by their
    kind's rule (:func:`priority.gain.kind_attained`; a compound call counts iff its whole
    workflow finished by the workflow deadline, :func:`priority.gain.workflow_goodput`);
    ``attained`` = goodput_requests / submitted; ``goodput_tokens`` — JITServe token goodput
    (output tokens, :func:`priority.gain.kind_goodput` / ``workflow_goodput``).
    ``jain_tenant``: Jain's index over tenants of goodput_requests / submitted.
    """
    on_time = np.zeros(len(requests), dtype=bool)
    tokens = np.zeros(len(requests))
    workflows: dict[str, list[int]] = {}
    for k, r in enumerate(requests):
        if r.kind == "compound" and r.workflow_id is not None:
            workflows.setdefault(r.workflow_id, []).append(k)
            continue
        if r.token_times:
            on_time[k] = kind_attained(
                r.kind, r.arrival_s, r.slo, r.token_times, finished=r.is_finished
            )
            tokens[k] = kind_goodput(
                r.kind, r.arrival_s, r.slo, r.prompt_tokens, r.token_times, finished=r.is_finished
            )
    for members in workflows.values():
        first = min(members, key=lambda k: requests[k].stage)
        call = calls.get(requests[first].request_id)
        deadline = getattr(call, "deadline_s", None) or requests[first].slo.deadline_s
        wf_calls = [
            WorkflowCall(
                requests[k].prompt_tokens,
                requests[k].num_output_tokens,
                requests[k].finished_s if requests[k].is_finished else None,
            )
            for k in members
        ]
        value = workflow_goodput(requests[first].arrival_s, float(deadline or 0.0), wf_calls)
        if value > 0:
            on_time[members] = True
            for k in members:
                tokens[k] = requests[k].num_output_tokens
    kinds = [r.kind for r in requests]
    per_kind: dict[str, dict[str, float | int]] = {}
    for kind in REQUEST_KINDS:
        mask = np.fromiter((x == kind for x in kinds), dtype=bool, count=len(kinds))
        if not mask.any():
            continue
        per_kind[kind] = {
            "submitted": int(mask.sum()),
            "attained": _ratio(on_time[mask].sum(), mask.sum()),
            "goodput_requests": int(on_time[mask].sum()),
            "goodput_tokens": float(tokens[mask].sum()),
        }
    served: dict[str, list[int]] = {}
    for k, r in enumerate(requests):
        served.setdefault(r.tenant, []).append(k)
    shares = [float(on_time[idx].sum()) / len(idx) for idx in served.values()]
    return {"per_kind": per_kind, "jain_tenant": jain_index(shares)}


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den > 0 else math.nan


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan
