"""Output-length bounds: the shared distribution format (and, beside it, the predictor)."""

from __future__ import annotations

from priority.lengths.distribution import DEFAULT_LEVELS, OVERRUN_GROWTH, LengthDistribution

__all__ = ["DEFAULT_LEVELS", "OVERRUN_GROWTH", "LengthDistribution"]
