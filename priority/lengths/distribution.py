"""A request's output length as a compact distribution: the one format every layer shares.

The gateway's predictor (a quantile regression forest, :mod:`priority.lengths`) produces it; the
gateway sends it to the engines in ``vllm_xargs``; the simulator, the emulated engines and the
vLLM plugins refine it as tokens are generated — *without* the forest, which lives only in the
gateway. So it is data plus arithmetic: a monotone quantile vector of the total output length.

Refinement is the conditional quantile of the total length given that ``generated`` tokens exist
already: with ``F`` the CDF interpolated between the stored quantiles,
``bound(q, g) = F⁻¹(F(g) + q · (1 − F(g)))``, never below ``g + 1`` while the request runs.

**Overrun rule** (the request outlived every stored quantile, ``g ≥`` the largest value): the
distribution says nothing any more, so the bound grows geometrically with what was generated,
``g + max(1, ⌈OVERRUN_GROWTH · g⌉)`` — a request that runs long is assumed to run somewhat
longer again (never "one more token", which would make a policy treat it as nearly done forever),
and never beyond ``max_tokens`` when that cap is known.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_LEVELS", "OVERRUN_GROWTH", "LengthDistribution"]

DEFAULT_LEVELS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
"""Quantile levels sent by default: seven numbers, enough to refine a 0.95 bound smoothly."""

OVERRUN_GROWTH = 0.5
"""Past the last stored quantile, the bound is ``g`` plus this share of ``g`` (at least 1)."""


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """Quantiles ``values[i]`` (tokens) of the total output length at ``levels[i]`` (0 < l < 1).

    Invariants (checked): same length, at least one level, levels strictly increasing in (0, 1),
    values finite, ≥ 1 and non-decreasing. Below the first level the CDF is interpolated from
    (0 tokens, level 0); above the last, the overrun rule applies.
    """

    levels: tuple[float, ...]
    values: tuple[float, ...]
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.levels or len(self.levels) != len(self.values):
            raise ValueError("levels and values must be non-empty and of the same length")
        if any(not 0.0 < q < 1.0 for q in self.levels) or any(
            b <= a for a, b in zip(self.levels, self.levels[1:], strict=False)
        ):
            raise ValueError("levels must be strictly increasing inside (0, 1)")
        if any(not (math.isfinite(v) and v >= 1.0) for v in self.values) or any(
            b < a for a, b in zip(self.values, self.values[1:], strict=False)
        ):
            raise ValueError("values must be finite, >= 1 and non-decreasing")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    @classmethod
    def point(cls, tokens: float, max_tokens: int | None = None) -> LengthDistribution:
        """A known length (an oracle, or a fallback such as ``max_tokens``) as a distribution."""
        value = max(1.0, float(tokens))
        return cls(levels=(0.5,), values=(value,), max_tokens=max_tokens)

    # -- the CDF and its inverse, piecewise linear through (0, 0) and the stored points ----------

    def cdf(self, tokens: float) -> float:
        """P(total length ≤ tokens), interpolated; 1.0 at or beyond the last stored value."""
        if tokens <= 0:
            return 0.0
        xs, qs = self.values, self.levels
        if tokens >= xs[-1]:
            return 1.0
        i = bisect.bisect_right(xs, tokens)
        x0, q0 = (0.0, 0.0) if i == 0 else (xs[i - 1], qs[i - 1])
        x1, q1 = xs[i], qs[i]
        if x1 <= x0:
            return q1
        return q0 + (q1 - q0) * (tokens - x0) / (x1 - x0)

    def quantile(self, q: float) -> float:
        """The unconditional ``q``-quantile of the total length (tokens, not rounded)."""
        if not 0.0 < q < 1.0:
            raise ValueError("q must be inside (0, 1)")
        xs, qs = self.values, self.levels
        if q >= qs[-1]:
            return xs[-1]
        i = bisect.bisect_left(qs, q)
        x0, q0 = (0.0, 0.0) if i == 0 else (xs[i - 1], qs[i - 1])
        x1, q1 = xs[i], qs[i]
        return x0 + (x1 - x0) * (q - q0) / (q1 - q0)

    def bound(self, q: float, generated: int = 0) -> int:
        """The ``q``-quantile of the total length given ``generated`` tokens so far (tokens).

        Monotone in ``generated`` and in ``q``; ≥ ``generated + 1`` (a running request has at
        least one token to come); capped by ``max_tokens`` when known.
        """
        if not 0.0 < q < 1.0:
            raise ValueError("q must be inside (0, 1)")
        if generated < 0:
            raise ValueError("generated must be >= 0")
        if generated >= self.values[-1]:
            total = generated + max(1, math.ceil(OVERRUN_GROWTH * generated))
        else:
            f = self.cdf(generated)
            total = math.ceil(self._inverse(f + q * (1.0 - f)))
            total = max(total, generated + 1)
        if self.max_tokens is not None:
            total = min(total, max(self.max_tokens, generated + 1))
        return int(total)

    def _inverse(self, p: float) -> float:
        """F⁻¹(p) for p in [0, 1]; the last stored value for p at or past the last level."""
        if p >= self.levels[-1]:
            return self.values[-1]
        return self.quantile(max(p, 1e-12))

    # -- the wire: a flat list of numbers in vllm_xargs ------------------------------------------

    def to_wire(self) -> list[float]:
        """``[l1, v1, l2, v2, …]``: a list of numbers, which vLLM's ``vllm_xargs`` accepts."""
        return [x for pair in zip(self.levels, self.values, strict=True) for x in pair]

    @classmethod
    def from_wire(cls, flat: Sequence[float], max_tokens: int | None = None) -> LengthDistribution:
        """The inverse of :meth:`to_wire`; ``ValueError`` on anything malformed (the reader
        falls back to its default, as :func:`engine_common.protocol.parse` does)."""
        if len(flat) % 2 or not flat:
            raise ValueError("a length distribution is an even, non-empty list of numbers")
        numbers = [float(x) for x in flat]
        return cls(levels=tuple(numbers[0::2]), values=tuple(numbers[1::2]), max_tokens=max_tokens)
