"""How good a length bound is: coverage, pinball loss, tightness, and its cost per request.

Definitions: *coverage* is the share of rows whose true output is ≤ the predicted
q-quantile (a calibrated predictor covers ≈ q); *pinball loss* is the quantile loss
``mean(max(q·(y−b), (q−1)·(y−b)))`` in tokens (lower is better; it rewards coverage and
tightness together); *tightness* is bound ÷ true length (its median; 1 is perfect, a
``max_tokens`` bound is far above); prediction times are per single request, one call each,
as the gateway makes them (features included).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from priority.lengths.features import RequestFeatures
from priority.lengths.model import LengthPredictor
from priority.lengths.train import LengthRow

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["Bounder", "EvalResult", "evaluate", "pinball_loss", "predictor_bounder"]

Bounder = Callable[[RequestFeatures], int]
"""A request's q-quantile length bound before any token is generated."""


@dataclass(frozen=True, slots=True)
class EvalResult:
    """The numbers ``tiergate lengths eval --json`` prints (exactly these keys)."""

    rows: int
    coverage: float
    pinball: float
    tightness_median: float
    predict_p50_ms: float
    predict_p99_ms: float

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)


def pinball_loss(
    y: Sequence[float] | NDArray[Any], bound: Sequence[float] | NDArray[Any], q: float
) -> float:
    """Mean quantile (pinball) loss of ``bound`` as the ``q``-quantile of ``y``, in tokens."""
    diff = np.asarray(y, dtype=np.float64) - np.asarray(bound, dtype=np.float64)
    return float(np.mean(np.maximum(q * diff, (q - 1.0) * diff)))


def predictor_bounder(predictor: LengthPredictor, q: float) -> Bounder:
    """The forest as the gateway uses it: predict the distribution, read its q-bound."""
    return lambda features: predictor.predict(features).bound(q)


def evaluate(bounder: Bounder, rows: Sequence[LengthRow], q: float) -> EvalResult:
    """Score ``bounder`` on ``rows`` at quantile ``q``, timing each single prediction."""
    if not rows:
        raise ValueError("no rows to evaluate")
    if not 0.0 < q < 1.0:
        raise ValueError("q must be inside (0, 1)")
    bounds = np.empty(len(rows), dtype=np.float64)
    times = np.empty(len(rows), dtype=np.float64)
    for i, row in enumerate(rows):
        # a fresh copy: without its feature row, kept on the request by an earlier call (the
        # same rows scored at another q), this call would time the tree walk alone
        features = replace(row.features)
        start = time.perf_counter()
        bounds[i] = bounder(features)
        times[i] = time.perf_counter() - start
    y = np.maximum(np.asarray([r.output_tokens for r in rows], dtype=np.float64), 1.0)
    p50, p99 = np.percentile(times, [50, 99]) * 1e3
    return EvalResult(
        rows=len(rows),
        coverage=float(np.mean(y <= bounds)),
        pinball=pinball_loss(y, bounds, q),
        tightness_median=float(np.median(bounds / y)),
        predict_p50_ms=float(p50),
        predict_p99_ms=float(p99),
    )
