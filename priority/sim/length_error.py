"""How wrong the simulator's ``--lengths predicted`` bounds are: the predictor's measured error.

A simulated request knows its true length, so a "predicted" distribution is the truth blurred by
an error model. The default, :class:`MeasuredLengthError`, replays the error the real predictor
(:mod:`priority.lengths`, the quantile regression forest) shows on held-out HH-RLHF data, read
from ``data/length_error_hh.csv`` (written by ``scripts/length_error_model.py``; provenance in
that file's header and ``data/README.md``). Per request, with one uniform draw ``u``:

* the median error is ``e = Q(u)``, ``Q`` the empirical quantile function of
  ``log(true / forest median)`` (interpolated, strictly increasing), so the predicted median is
  ``true · exp(−e)``;
* the quantile vector at the forest's levels is ``median · exp(Q(c(l)))``, ``c(l)`` the share of
  held-out rows the forest's ``l``-quantile covered. Then ``true ≤ value(l)`` exactly when
  ``Q(u) ≤ Q(c(l))``, i.e. ``u ≤ c(l)``: the simulated ``l``-quantile covers the truth as often
  as the real one did (its over- or under-coverage included), and its spread is the forest's.
  (Clipping the values to ``[1, cap]`` with ``cap ≥ true`` can only add coverage, for
  one-token answers.)

The forest's widths barely vary from request to request on these data (``log(q0.9 / q0.1)`` is
2.26–2.56 from the 10th to the 90th percentile of rows, the script prints it), which is why one
shape for all requests is a fair stand-in; the CSV's ``forest_shape`` rows (the forest's median
shape) are within 0.07 of the sampled one.
:class:`LognormalLengthError` is the earlier calibrated lognormal stand-in, kept as an explicit
option (``--length-error lognormal:0.6``) to compare against.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist
from typing import Protocol

import numpy as np

from priority.lengths.distribution import DEFAULT_LEVELS, LengthDistribution

__all__ = [
    "DEFAULT_LENGTH_ERROR",
    "DEFAULT_LENGTH_SIGMA",
    "MEASURED_ERROR_PATH",
    "LengthError",
    "LognormalLengthError",
    "MeasuredLengthError",
    "load_measured",
    "parse_length_error",
]

MEASURED_ERROR_PATH = Path(__file__).resolve().parent / "data" / "length_error_hh.csv"
DEFAULT_LENGTH_ERROR = "measured"
"""``--length-error`` default: the committed held-out error of the real predictor."""
DEFAULT_LENGTH_SIGMA = 0.6
"""Log-space std-dev of ``lognormal`` when none is given (about ×1.8 at one sigma)."""
CSV_KINDS = ("log_error", "coverage", "forest_shape")
"""Row kinds of the error CSV: ``(kind, level, value)``; ``#`` lines are provenance."""


class LengthError(Protocol):
    """Turns a request's true length into the distribution a predictor would have sent."""

    @property
    def name(self) -> str: ...

    def sample(self, true_tokens: int, cap: int, rng: np.random.Generator) -> LengthDistribution:
        """One request's predicted distribution (values in ``[1, cap]``)."""
        ...


def _distribution(median: float, log_shape: np.ndarray, cap: int) -> LengthDistribution:
    values = np.clip(median * np.exp(log_shape), 1.0, float(cap))
    return LengthDistribution(
        levels=DEFAULT_LEVELS, values=tuple(float(v) for v in values), max_tokens=cap
    )


@dataclass(frozen=True, slots=True)
class LognormalLengthError:
    """A calibrated predictor with log-error std-dev ``sigma``: median ``true · exp(σZ)``,
    quantiles ``median · exp(σ · Φ⁻¹(l))``, so every ``l``-quantile covers with probability l."""

    sigma: float = DEFAULT_LENGTH_SIGMA

    def __post_init__(self) -> None:
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"lognormal sigma must be a finite number >= 0, got {self.sigma}")

    @property
    def name(self) -> str:
        return f"lognormal:{self.sigma:g}"

    def sample(self, true_tokens: int, cap: int, rng: np.random.Generator) -> LengthDistribution:
        median = true_tokens * math.exp(self.sigma * float(rng.standard_normal()))
        z = np.asarray([NormalDist().inv_cdf(level) for level in DEFAULT_LEVELS])
        return _distribution(median, self.sigma * z, cap)


@dataclass(frozen=True, slots=True)
class MeasuredLengthError:
    """The real predictor's held-out error (see the module doc): ``log_error[i]`` is the
    ``probs[i]``-quantile of ``log(true / forest median)``; ``coverage[j]`` what the forest's
    ``levels[j]``-quantile covered; ``forest_shape[j]`` the forest's median
    ``log(value(l) / median)`` (information only: the sampled shape is ``Q(coverage)``)."""

    probs: tuple[float, ...]
    log_error: tuple[float, ...]
    levels: tuple[float, ...]
    coverage: tuple[float, ...]
    forest_shape: tuple[float, ...]
    source: str = "measured"

    def __post_init__(self) -> None:
        p, q = np.asarray(self.probs), np.asarray(self.log_error)
        if p.size < 2 or p.size != q.size or p[0] != 0.0 or p[-1] != 1.0:
            raise ValueError("log_error needs >= 2 points at probabilities from 0 to 1")
        if np.any(np.diff(p) <= 0) or np.any(np.diff(q) <= 0) or not np.all(np.isfinite(q)):
            raise ValueError("log_error must be finite and strictly increasing in probability")
        if self.levels != DEFAULT_LEVELS:
            raise ValueError(f"coverage levels {self.levels} are not {DEFAULT_LEVELS}")
        c = np.asarray(self.coverage)
        if c.size != len(self.levels) or np.any((c <= 0) | (c >= 1)) or np.any(np.diff(c) < 0):
            raise ValueError("coverage must be one non-decreasing share in (0, 1) per level")
        if len(self.forest_shape) != len(self.levels):
            raise ValueError("forest_shape must have one value per level")

    @property
    def name(self) -> str:
        return self.source

    def quantile(self, u: float | np.ndarray) -> np.ndarray:
        """``Q(u)``: the log-error at probability ``u`` (interpolated between stored points)."""
        return np.asarray(np.interp(u, self.probs, self.log_error))

    @property
    def log_shape(self) -> np.ndarray:
        """``log(value(l) / median)`` of every simulated distribution: ``Q(c(l))``."""
        return self.quantile(np.asarray(self.coverage))

    def sample(self, true_tokens: int, cap: int, rng: np.random.Generator) -> LengthDistribution:
        error = float(self.quantile(float(rng.random())))
        return _distribution(true_tokens * math.exp(-error), self.log_shape, cap)


@lru_cache(maxsize=4)
def load_measured(path: Path = MEASURED_ERROR_PATH) -> MeasuredLengthError:
    """Read an error CSV (``kind,level,value`` rows after ``#`` provenance lines); cached, as
    every simulated workload reads the same file."""
    rows: dict[str, list[tuple[float, float]]] = {kind: [] for kind in CSV_KINDS}
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(line for line in fh if not line.startswith("#"))
        for number, row in enumerate(reader, 2):
            kind = row.get("kind")
            if kind not in rows:
                raise ValueError(f"{path}: row {number}: unknown kind {kind!r}")
            rows[kind].append((float(row["level"]), float(row["value"])))
    for kind, points in rows.items():
        if not points:
            raise ValueError(f"{path}: no {kind!r} rows")
    return MeasuredLengthError(
        probs=tuple(p for p, _ in rows["log_error"]),
        log_error=tuple(v for _, v in rows["log_error"]),
        levels=tuple(level for level, _ in rows["coverage"]),
        coverage=tuple(v for _, v in rows["coverage"]),
        forest_shape=tuple(v for _, v in rows["forest_shape"]),
        source=f"measured:{path.name}",
    )


def parse_length_error(spec: str) -> LengthError:
    """``measured`` (the committed model), ``measured:PATH`` (another CSV from the script) or
    ``lognormal[:SIGMA]``; ``ValueError`` on anything else."""
    kind, _, arg = spec.partition(":")
    if kind == "measured":
        return load_measured(Path(arg)) if arg else load_measured()
    if kind == "lognormal":
        try:
            sigma = float(arg) if arg else DEFAULT_LENGTH_SIGMA
        except ValueError:
            raise ValueError(f"lognormal sigma must be a number, got {arg!r}") from None
        return LognormalLengthError(sigma)
    raise ValueError(f"unknown length error {spec!r}; known: measured[:PATH], lognormal[:SIGMA]")
