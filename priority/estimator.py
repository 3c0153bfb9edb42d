"""Batch latency estimator (PROSERVE §4.1, Eqs. 4-7) with online momentum correction.

One estimator serves the router (GoRouting's ESTIMATEGAIN/EXEC), every engine policy
(SlideBatching's exec/GETMAXCHUNK, Sarathi's token budget) and the simulator (step times).

    T~_p(l_q, l_kv) = a_p*l_q^2 + b_p*l_q*l_kv + c_p*l_q [+ d_p*l_kv]   prefill chunk
    T~_d(l_kv)      = a_d*l_kv + b_d                                    one decode step
    T(B)            = beta * (sum T~_p + sum T~_d + t_c)

``d_p`` is xLLM's extra prefill ``l_kv`` term; it is 0 unless a profile was fitted with it.
``beta`` is the momentum correction: every ``window`` observed batches,
``beta <- theta*beta + (1-theta)*mean(T_real/T_raw)``, where ``T_raw`` is the uncorrected
prediction. Using the *raw* prediction (not the already-corrected one) makes ``beta`` converge
to the true real/model ratio instead of compounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

DEFAULT_THETA = 0.8
"""Momentum: weight kept on the previous beta at each update (paper leaves it unspecified)."""
DEFAULT_WINDOW = 16
"""Batches per momentum update: long enough to average out per-step noise, short enough to track
drift within a second of decode steps."""


@dataclass(frozen=True, slots=True)
class LatencyCoefficients:
    """Seconds-per-unit coefficients of Eqs. 5-7 (all non-negative)."""

    a_p: float
    b_p: float
    c_p: float
    a_d: float
    b_d: float
    t_c: float
    d_p: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"coefficient {name} must be finite and >= 0, got {value!r}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> LatencyCoefficients:
        return cls(**{k: float(v) for k, v in data.items()})


class BatchLatencyEstimator:
    """Predicts batch step times and answers the inverse queries the policies need."""

    def __init__(
        self,
        coefficients: LatencyCoefficients,
        *,
        theta: float = DEFAULT_THETA,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        if not 0.0 <= theta < 1.0:
            raise ValueError(f"theta must be in [0, 1), got {theta}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.coefficients = coefficients
        self.theta = theta
        self.window = window
        self.beta = 1.0
        self._ratios: list[float] = []
        self.last_ratio_error = 0.0
        """|T_real / T_pred - 1| of the latest observation (exported as estimator error)."""

    # ---- forward model -------------------------------------------------------------------

    @property
    def t_c(self) -> float:
        return self.beta * self.coefficients.t_c

    def prefill_time(self, l_q: float, l_kv: float) -> float:
        """T~_p of one prefill chunk of ``l_q`` new tokens over ``l_kv`` cached ones."""
        c = self.coefficients
        return self.beta * (l_q * (c.a_p * l_q + c.b_p * l_kv + c.c_p) + c.d_p * l_kv)

    def decode_time(self, l_kv: float) -> float:
        """T~_d of one decode step with ``l_kv`` tokens in the cache."""
        c = self.coefficients
        return self.beta * (c.a_d * l_kv + c.b_d)

    def request_time(self, l_q: int, l_kv: int) -> float:
        """T~_pd(r): decode when one token is computed, prefill otherwise (Eq. 4, no t_c)."""
        return self.decode_time(l_kv) if l_q == 1 else self.prefill_time(l_q, l_kv)

    def request_times(
        self, l_q: npt.NDArray[np.int64], l_kv: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        """Vectorized :meth:`request_time` over many requests."""
        c = self.coefficients
        lq = l_q.astype(np.float64)
        lkv = l_kv.astype(np.float64)
        prefill = lq * (c.a_p * lq + c.b_p * lkv + c.c_p) + c.d_p * lkv
        decode = c.a_d * lkv + c.b_d
        return self.beta * np.where(l_q == 1, decode, prefill)

    def raw_batch_time(
        self,
        prefill: Sequence[tuple[int, int]] = (),
        decode_kv: Sequence[int] = (),
    ) -> float:
        """Uncorrected T(B) for prefill chunks ``(l_q, l_kv)`` and decodes with ``l_kv``."""
        c = self.coefficients
        total = c.t_c
        for l_q, l_kv in prefill:
            total += l_q * (c.a_p * l_q + c.b_p * l_kv + c.c_p) + c.d_p * l_kv
        for l_kv in decode_kv:
            total += c.a_d * l_kv + c.b_d
        return total

    def batch_time(
        self,
        prefill: Sequence[tuple[int, int]] = (),
        decode_kv: Sequence[int] = (),
    ) -> float:
        """T(B), Eq. 7, with the momentum correction applied."""
        return self.beta * self.raw_batch_time(prefill, decode_kv)

    # ---- inverse queries -----------------------------------------------------------------

    def max_chunk(self, l_kv: int, budget_s: float, limit: int) -> int:
        """Largest chunk ``l_q <= limit`` over ``l_kv`` cached tokens that fits ``budget_s``.

        The prefill model is a quadratic in ``l_q`` with non-negative coefficients, so the
        answer is the positive root, floored (GETMAXCHUNK in closed form instead of a search).
        """
        if limit <= 0 or budget_s <= 0:
            return 0
        c = self.coefficients
        budget = budget_s / self.beta - c.d_p * l_kv
        if budget <= 0:
            return 0
        a = c.a_p
        b = c.b_p * l_kv + c.c_p
        if a <= 0.0:
            chunk = limit if b <= 0.0 else math.floor(budget / b)
        else:
            chunk = math.floor((-b + math.sqrt(b * b + 4.0 * a * budget)) / (2.0 * a))
        chunk = max(0, min(limit, chunk))
        # Guard the floor against rounding: the returned chunk must really fit.
        while chunk > 0 and self.prefill_time(chunk, l_kv) > budget_s * (1 + 1e-12):
            chunk -= 1
        return chunk

    # ---- online correction ---------------------------------------------------------------

    def observe(self, raw_predicted_s: float, real_s: float) -> None:
        """Feed one executed batch: its uncorrected prediction and its measured time."""
        if raw_predicted_s <= 0 or real_s <= 0:
            return
        ratio = real_s / raw_predicted_s
        self.last_ratio_error = abs(real_s / (self.beta * raw_predicted_s) - 1.0)
        self._ratios.append(ratio)
        if len(self._ratios) >= self.window:
            mean_ratio = sum(self._ratios) / len(self._ratios)
            self.beta = self.theta * self.beta + (1.0 - self.theta) * mean_ratio
            self._ratios.clear()

    def adopt(self, coefficients: LatencyCoefficients, beta: float = 1.0) -> None:
        """Replace the coefficients (an online refit, or an engine's published estimator) and
        restart the momentum correction from ``beta``: refitted coefficients already explain
        the real step times, so the correction starts over from them."""
        if not (beta > 0 and math.isfinite(beta)):
            raise ValueError(f"beta must be finite and > 0, got {beta!r}")
        self.coefficients = coefficients
        self.beta = beta
        self._ratios.clear()

    def copy(self) -> BatchLatencyEstimator:
        """A fresh estimator with the same coefficients and settings (beta reset to 1)."""
        return BatchLatencyEstimator(self.coefficients, theta=self.theta, window=self.window)
