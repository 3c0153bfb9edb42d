"""Service-gain functions: the one definition used by scheduling, metrics and evaluation.

* **TDG** — PROSERVE's Token-level Deadline-aware Gain (Eq. 3): token i of request r earns
  ``w_r(i) = w_p * w_tier`` (i = 1) or ``w_d * w_tier`` (i > 1) if it is emitted strictly before
  ``deadline_{r,i} = arrival + TTFT_SLO + (i - 1) * TPOT_SLO``. With ``first_token_buffered=False``
  the footnote-2 variant applies: ``deadline_{r,i} = arrival + min(TTFT_r, TTFT_SLO) +
  (i - 1) * TPOT_SLO`` (an early first token pulls every later deadline forward).
* **Goodput** — JITServe/Tempo: a latency-sensitive request earns one unit per output token
  emitted by its due time; a deadline-sensitive one earns ``w_in * L_in + w_out * L_out`` only if
  it finishes by its deadline. Tempo's graded decay ``min(1, (SLO / actual) ** alpha)`` replaces
  the all-or-nothing rule when ``decay_alpha`` is given.
* **SLO attainment** — strict: TTFT < TTFT_SLO and mean TPOT < TPOT_SLO (and finish < deadline).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from priority.request import SLO, Request

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class GainWeights:
    """First-token vs decode-token weights (w_p, w_d in PROSERVE Eq. 3).

    PROSERVE sets ``w_p : w_d`` to the dataset's mean input:output length ratio;
    :meth:`from_lengths` does that.
    """

    first_token: float = 1.0
    decode_token: float = 1.0

    @classmethod
    def from_lengths(cls, mean_prompt_tokens: float, mean_output_tokens: float) -> GainWeights:
        if mean_prompt_tokens <= 0 or mean_output_tokens <= 0:
            raise ValueError("mean lengths must be positive")
        return cls(first_token=mean_prompt_tokens / mean_output_tokens, decode_token=1.0)

    def token_value(self, tier_weight: float, index: int) -> float:
        """w_r(i) for the ``index``-th (1-based) output token."""
        return tier_weight * (self.first_token if index == 1 else self.decode_token)


def token_deadlines(
    arrival_s: float,
    slo: SLO,
    num_tokens: int,
    *,
    first_token_buffered: bool = True,
    first_token_s: float | None = None,
) -> FloatArray:
    """Absolute due times of output tokens 1..num_tokens."""
    index = np.arange(num_tokens, dtype=np.float64)  # i - 1
    due = np.full(num_tokens, math.inf)
    if slo.ttft_s is not None and slo.tpot_s is not None:
        ttft = slo.ttft_s
        if not first_token_buffered and first_token_s is not None:
            ttft = min(first_token_s - arrival_s, slo.ttft_s)
        due = ttft + index * slo.tpot_s
    if slo.deadline_s is not None:
        due = np.minimum(due, slo.deadline_s)
    return arrival_s + due


def ideal_tdg(tier_weight: float, num_tokens: int, weights: GainWeights) -> float:
    """Gain if every one of ``num_tokens`` output tokens is on time."""
    if num_tokens <= 0:
        return 0.0
    return tier_weight * (weights.first_token + (num_tokens - 1) * weights.decode_token)


def tdg(
    arrival_s: float,
    slo: SLO,
    tier_weight: float,
    token_times: Sequence[float] | FloatArray,
    weights: GainWeights,
    *,
    first_token_buffered: bool = True,
) -> float:
    """PROSERVE's f_TDG(r) for the tokens emitted at ``token_times`` (strict ``<``)."""
    if len(token_times) == 0:
        return 0.0
    if len(token_times) <= SCALAR_TOKENS:
        first, decode = _on_time_scalar(arrival_s, slo, token_times, first_token_buffered)
    else:
        first, decode = _on_time_vector(arrival_s, slo, token_times, first_token_buffered)
    return tier_weight * (weights.first_token * float(first) + weights.decode_token * decode)


SCALAR_TOKENS = 64
"""Up to this many tokens :func:`tdg` counts in plain Python: the gateway scores every request
it finishes, most are short, and numpy's fixed cost per call (several calls, ~10 µs) is more
than the loop. Both counts are the same arithmetic in the same order, so the same floats
(a test compares them)."""


def _on_time_vector(
    arrival_s: float,
    slo: SLO,
    token_times: Sequence[float] | FloatArray,
    first_token_buffered: bool,
) -> tuple[bool, int]:
    """Whether the first token was on time, and how many of the others were (numpy)."""
    times = np.asarray(token_times, dtype=np.float64)
    due = token_deadlines(
        arrival_s,
        slo,
        times.size,
        first_token_buffered=first_token_buffered,
        first_token_s=float(times[0]),
    )
    on_time = times < due
    return bool(on_time[0]), int(np.count_nonzero(on_time[1:]))


def _on_time_scalar(
    arrival_s: float,
    slo: SLO,
    token_times: Sequence[float] | FloatArray,
    first_token_buffered: bool,
) -> tuple[bool, int]:
    """:func:`_on_time_vector` in plain Python, for a few tokens."""
    times = token_times.tolist() if isinstance(token_times, np.ndarray) else token_times
    ttft, tpot, deadline = slo.ttft_s, slo.tpot_s, slo.deadline_s
    if ttft is None or tpot is None:  # no pace: every token is due at infinity (or the deadline)
        ttft, tpot = math.inf, 0.0
    elif not first_token_buffered:
        ttft = min(float(times[0]) - arrival_s, ttft)
    first, decode = False, 0
    for i, t in enumerate(times):
        due = ttft + i * tpot
        if deadline is not None:
            due = min(due, deadline)
        if t < arrival_s + due:
            if i:
                decode += 1
            else:
                first = True
    return first, decode


def ttft_s(arrival_s: float, token_times: Sequence[float] | FloatArray) -> float:
    return float(token_times[0]) - arrival_s if len(token_times) else math.inf


def mean_tpot_s(token_times: Sequence[float] | FloatArray) -> float:
    """Mean time per output token after the first; 0 for single-token responses."""
    n = len(token_times)
    if n < 2:
        return 0.0
    return (float(token_times[-1]) - float(token_times[0])) / (n - 1)


def slo_attained(
    arrival_s: float, slo: SLO, token_times: Sequence[float] | FloatArray, *, finished: bool = True
) -> bool:
    """Strict SLO attainment: TTFT and mean TPOT below their SLOs, finish before the deadline."""
    if not finished or len(token_times) == 0:
        return False
    if slo.ttft_s is not None and not ttft_s(arrival_s, token_times) < slo.ttft_s:
        return False
    if slo.tpot_s is not None and not mean_tpot_s(token_times) < slo.tpot_s:
        return False
    return not (
        slo.deadline_s is not None and not float(token_times[-1]) - arrival_s < slo.deadline_s
    )


@dataclass(frozen=True, slots=True)
class GoodputWeights:
    """JITServe's ``R(k) = w_in * L_in + w_out * L_out`` (Tempo uses 1:2, its artifact 1:8)."""

    input_token: float = 0.0
    output_token: float = 1.0


def token_goodput(
    arrival_s: float,
    slo: SLO,
    prompt_tokens: int,
    token_times: Sequence[float] | FloatArray,
    *,
    finished: bool = True,
    weights: GoodputWeights = GoodputWeights(),
    decay_alpha: float | None = None,
) -> float:
    """JITServe token goodput of one request.

    Latency-sensitive (streaming SLO): each output token emitted by its due time counts
    ``weights.output_token`` (and the prompt counts ``weights.input_token`` once the first token
    is on time). Deadline-sensitive: the whole ``R(k)`` counts if the request finished by its
    deadline; with ``decay_alpha`` it is scaled by Tempo's ``min(1, (SLO/actual) ** alpha)``.
    """
    times = np.asarray(token_times, dtype=np.float64)
    if times.size == 0:
        return 0.0
    if slo.is_streaming:
        due = token_deadlines(arrival_s, slo, times.size)
        on_time = times <= due
        value = weights.output_token * float(np.count_nonzero(on_time))
        if on_time[0]:
            value += weights.input_token * prompt_tokens
        return value
    assert slo.deadline_s is not None
    if not finished:
        return 0.0
    full = weights.input_token * prompt_tokens + weights.output_token * times.size
    latency = float(times[-1]) - arrival_s
    if decay_alpha is None:
        return full if latency <= slo.deadline_s else 0.0
    return full * min(1.0, (slo.deadline_s / max(latency, 1e-12)) ** decay_alpha)


def request_tdg(
    request: Request, weights: GainWeights, *, first_token_buffered: bool = True
) -> float:
    """TDG of a request from its recorded token times."""
    return tdg(
        request.arrival_s,
        request.slo,
        request.weight,
        request.token_times,
        weights,
        first_token_buffered=first_token_buffered,
    )


# ---- request kinds: one goodput rule per kind, built on token_goodput ---------------

DEFAULT_BEST_EFFORT_DEADLINE_S = 120.0
"""End-to-end deadline of a best-effort request that names none: long enough not to compete with
real deadlines, finite so a scheduler that ranks by deadline never starves it."""


def kind_slo(kind: str, slo: SLO, *, best_effort_deadline_s: float | None = None) -> SLO:
    """The SLO a request of ``kind`` is judged by.

    * ``latency`` — its own SLO (TTFT + TPOT per token; a deadline-only one is judged end to end);
    * ``deadline`` / ``compound`` — end to end only: every token counts iff the request (for a
      compound call: its sub-deadline, the workflow is judged by :func:`workflow_goodput`)
      finishes by ``slo.deadline_s`` (one without a deadline is judged as a latency request);
    * ``best-effort`` — end to end by its deadline, else :data:`DEFAULT_BEST_EFFORT_DEADLINE_S`.
    """
    if kind == "best-effort":
        deadline = slo.deadline_s
        if deadline is None:
            deadline = best_effort_deadline_s or DEFAULT_BEST_EFFORT_DEADLINE_S
        return SLO(deadline_s=deadline)
    if kind in ("deadline", "compound") and slo.deadline_s is not None:
        return SLO(deadline_s=slo.deadline_s) if slo.is_streaming else slo
    return slo


def kind_goodput(
    kind: str,
    arrival_s: float,
    slo: SLO,
    prompt_tokens: int,
    token_times: Sequence[float] | FloatArray,
    *,
    finished: bool = True,
    weights: GoodputWeights = GoodputWeights(),
    decay_alpha: float | None = None,
) -> float:
    """JITServe token goodput of one request judged as ``kind`` (:func:`kind_slo`); Tempo's
    graded decay with ``decay_alpha``. A compound call's value counts per workflow, see
    :func:`workflow_goodput`; this is the call judged alone against its sub-deadline."""
    return token_goodput(
        arrival_s,
        kind_slo(kind, slo),
        prompt_tokens,
        token_times,
        finished=finished,
        weights=weights,
        decay_alpha=decay_alpha,
    )


def kind_attained(
    kind: str,
    arrival_s: float,
    slo: SLO,
    token_times: Sequence[float] | FloatArray,
    *,
    finished: bool = True,
) -> bool:
    """Request goodput (0/1) of one request judged as ``kind``: strict SLO attainment."""
    return slo_attained(arrival_s, kind_slo(kind, slo), token_times, finished=finished)


@dataclass(frozen=True, slots=True)
class WorkflowCall:
    """One finished-or-not call of a compound workflow, as the metrics see it."""

    prompt_tokens: int
    output_tokens: int
    finished_s: float | None
    """Absolute finish time; None if the call never finished (or never ran)."""


def workflow_goodput(
    start_s: float,
    deadline_s: float,
    calls: Sequence[WorkflowCall],
    *,
    weights: GoodputWeights = GoodputWeights(),
    decay_alpha: float | None = None,
) -> float:
    """JITServe compound goodput: every token of every call counts iff all calls finished and
    the last finished by ``start_s + deadline_s`` (stage 0's arrival plus the workflow
    deadline); with ``decay_alpha``, Tempo's ``min(1, (D / actual) ** alpha)`` instead."""
    if not calls or any(c.finished_s is None for c in calls):
        return 0.0
    full = sum(
        weights.input_token * c.prompt_tokens + weights.output_token * c.output_tokens
        for c in calls
    )
    latency = max(float(c.finished_s) for c in calls if c.finished_s is not None) - start_s
    if decay_alpha is None:
        return full if latency <= deadline_s else 0.0
    return full * min(1.0, (deadline_s / max(latency, 1e-12)) ** decay_alpha)


def jain_index(values: Sequence[float] | FloatArray) -> float:
    """Jain's fairness index ``(Σx)² / (n·Σx²)``: 1 when all equal, 1/n when one takes all
    (1.0 for an empty or all-zero input: nobody is treated worse than anybody else)."""
    x = np.asarray(values, dtype=np.float64)
    square = float((x * x).sum())
    if x.size == 0 or square == 0.0:
        return 1.0
    return float(x.sum()) ** 2 / (x.size * square)
