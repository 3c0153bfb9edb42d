"""What the forest must beat: ``max_tokens``, a per-group empirical quantile, and linear
quantile regression on the same features.

Each gives a :data:`~priority.lengths.evaluate.Bounder` at one quantile ``q``, so
:func:`~priority.lengths.evaluate.evaluate` scores all of them the same way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from priority.lengths.distribution import DEFAULT_LEVELS, LengthDistribution
from priority.lengths.evaluate import Bounder
from priority.lengths.features import FeatureConfig, Featurizer, RequestFeatures
from priority.lengths.train import LengthRow

__all__ = ["GroupQuantileBaseline", "LinearQuantileBaseline", "max_tokens_bounder"]


def max_tokens_bounder(default_max_tokens: int) -> Bounder:
    """The bound every scheduler has without a predictor: the request's ``max_tokens`` (or the
    serving default when the client sent none)."""
    return lambda features: features.max_tokens or default_max_tokens


def _quantiles(y: Sequence[float], levels: tuple[float, ...]) -> tuple[float, ...]:
    values = np.quantile(
        np.maximum(np.asarray(y, dtype=np.float64), 1.0), levels, method="inverted_cdf"
    )
    return tuple(float(v) for v in np.maximum.accumulate(values))


class GroupQuantileBaseline:
    """Empirical quantiles of the training lengths per tenant (or per model), one distribution
    per group; groups unseen in training get the global one."""

    def __init__(self, rows: Sequence[LengthRow], key: str = "tenant") -> None:
        if key not in ("tenant", "model"):
            raise ValueError("key must be 'tenant' or 'model'")
        if not rows:
            raise ValueError("no training rows")
        self.key = key
        groups: dict[str | None, list[float]] = defaultdict(list)
        for row in rows:
            groups[getattr(row.features, key)].append(row.output_tokens)
        self.overall = _quantiles([r.output_tokens for r in rows], DEFAULT_LEVELS)
        self.by_group = {g: _quantiles(y, DEFAULT_LEVELS) for g, y in groups.items()}

    def predict(self, features: RequestFeatures) -> LengthDistribution:
        values = self.by_group.get(getattr(features, self.key), self.overall)
        return LengthDistribution(DEFAULT_LEVELS, values, max_tokens=features.max_tokens)

    def bounder(self, q: float) -> Bounder:
        return lambda features: self.predict(features).bound(q)


class LinearQuantileBaseline:
    """scikit-learn's ``QuantileRegressor`` (an exact linear program, ``highs``) at one ``q`` on
    the forest's features, fitted to ``log1p(length)`` (quantiles commute with monotone maps)
    on at most ``max_rows`` rows (the LP grows with the rows)."""

    def __init__(
        self,
        rows: Sequence[LengthRow],
        q: float,
        config: FeatureConfig | None = None,
        max_rows: int = 2000,
        seed: int = 0,
    ) -> None:
        from sklearn.linear_model import QuantileRegressor

        if not rows:
            raise ValueError("no training rows")
        if len(rows) > max_rows:
            pick = np.random.default_rng(seed).choice(len(rows), size=max_rows, replace=False)
            rows = [rows[int(i)] for i in sorted(pick)]
        self.featurizer = Featurizer(config)
        x = self.featurizer.transform([r.features for r in rows])
        y = np.log1p(np.maximum([r.output_tokens for r in rows], 1))
        self.model = QuantileRegressor(quantile=q, alpha=0.0, solver="highs").fit(x, y)

    def bound(self, features: RequestFeatures) -> int:
        x = self.featurizer.transform([features])
        value = math.expm1(min(float(self.model.predict(x)[0]), 30.0))  # no inf
        bound = max(1, math.ceil(value))
        return min(bound, features.max_tokens) if features.max_tokens else bound
