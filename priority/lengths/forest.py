"""A fitted forest as plain arrays: the leaf each request falls into, and who else is there.

A quantile regression forest (Meinshausen 2006) predicts the distribution of ``y`` for ``x`` as
the training rows that share ``x``'s leaves, each weighted ``1 / (trees · leaf size)``. Those
*weighted leaf samples* give both the quantile vector sent with the request and the refinement
as tokens are generated (the same samples conditioned on ``y > generated``), so one code path
serves both and refinement is exactly monotone.

The trees are packed into padded ``(trees, nodes)`` arrays and walked all at once, one depth
level per numpy step: a single request costs a few hundred microseconds, where scikit-learn's
``apply`` pays a per-tree dispatch. Arrays also save as ``.npz`` without pickle, so loading a
model file can never run code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["LeafSamples", "PackedForest", "WeightedSamples"]


class PackedForest:
    """Decision trees as padded arrays (row = tree, column = node); leaves have ``left == -1``."""

    def __init__(
        self,
        left: NDArray[np.int32],
        right: NDArray[np.int32],
        feature: NDArray[np.int32],
        threshold: NDArray[np.float64],
        depth: int,
    ) -> None:
        self.left, self.right, self.feature, self.threshold = left, right, feature, threshold
        self.depth = depth
        # children as global node indices (tree offset + node), leaves keep -1: one flat gather
        offset = (np.arange(left.shape[0], dtype=np.int64) * left.shape[1])[:, None]
        self._left = np.where(left >= 0, left + offset, -1).ravel()
        self._right = np.where(right >= 0, right + offset, -1).ravel()
        self._feature = feature.ravel().astype(np.int64)
        self._threshold = threshold.ravel()

    @classmethod
    def from_estimators(cls, estimators: list[Any]) -> PackedForest:
        """Pack scikit-learn trees (``estimator.tree_``) of a fitted forest."""
        trees = [e.tree_ for e in estimators]
        width = max(t.node_count for t in trees)
        n = len(trees)
        left = np.full((n, width), -1, dtype=np.int32)
        right = np.full((n, width), -1, dtype=np.int32)
        feature = np.zeros((n, width), dtype=np.int32)
        threshold = np.zeros((n, width), dtype=np.float64)
        for i, t in enumerate(trees):
            k = t.node_count
            left[i, :k] = t.children_left
            right[i, :k] = t.children_right
            feature[i, :k] = np.maximum(t.feature, 0)
            threshold[i, :k] = t.threshold
        depth = max(int(e.get_depth()) for e in estimators)
        return cls(left, right, feature, threshold, depth)

    @property
    def trees(self) -> int:
        return int(self.left.shape[0])

    @property
    def width(self) -> int:
        return int(self.left.shape[1])

    def apply(self, x: NDArray[np.float32]) -> NDArray[np.int64]:
        """Leaf index of each row of ``x`` in each tree: ``(rows, trees)``, as scikit-learn's
        ``apply`` (a row goes left when ``x[feature] <= threshold``, compared in float64 after
        the float32 cast scikit-learn also makes). Only the walks still inside the trees move
        on at each depth, on flat arrays (one gather per step)."""
        x = np.asarray(x, dtype=np.float32)
        rows, cols = x.shape
        flat_x = x.ravel()
        left, right, feature, threshold = self._left, self._right, self._feature, self._threshold
        base = np.tile(np.arange(self.trees, dtype=np.int64) * self.width, rows)
        node = base.copy()  # global node index (tree offset + node) of every (row, tree) walk
        row_base = np.repeat(np.arange(rows, dtype=np.int64) * cols, self.trees)
        active = np.arange(node.size)
        for _ in range(self.depth + 1):
            cur = node[active]
            lft = left[cur]
            inner = lft >= 0
            if not inner.all():
                active, cur, lft = active[inner], cur[inner], lft[inner]
                if active.size == 0:
                    break
            go_left = flat_x[row_base[active] + feature[cur]] <= threshold[cur]
            node[active] = np.where(go_left, lft, right[cur])
        return (node - base).reshape(rows, self.trees)

    def arrays(self) -> dict[str, NDArray[Any]]:
        return {
            "left": self.left,
            "right": self.right,
            "feature": self.feature,
            "threshold": self.threshold,
            "depth": np.asarray(self.depth),
        }

    @classmethod
    def from_arrays(cls, data: Any) -> PackedForest:
        left = np.asarray(data["left"], dtype=np.int32)
        shapes = {data[k].shape for k in ("left", "right", "feature", "threshold")}
        if len(shapes) != 1 or left.ndim != 2:
            raise ValueError("forest arrays disagree in shape")
        return cls(
            left=left,
            right=np.asarray(data["right"], dtype=np.int32),
            feature=np.asarray(data["feature"], dtype=np.int32),
            threshold=np.asarray(data["threshold"], dtype=np.float64),
            depth=int(data["depth"]),
        )


@dataclass(frozen=True, slots=True)
class WeightedSamples:
    """A request's predictive distribution: sorted lengths ``y`` and cumulative weights ``cdf``
    (``cdf[-1] == 1``; ``cdf[i]`` = P(Y ≤ y[i]))."""

    y: NDArray[np.float64]
    cdf: NDArray[np.float64]

    def quantiles(
        self, levels: tuple[float, ...], generated: int = 0
    ) -> NDArray[np.float64] | None:
        """The ``levels``-quantiles of the total length given that it exceeds ``generated``
        (inverted CDF: the smallest sample whose conditional CDF reaches the level). ``None``
        when no sample exceeds ``generated`` (an overrun: the caller applies the overrun rule).

        Conditioning keeps only samples ``> generated`` and renormalises, so every quantile is
        non-decreasing in ``generated`` and in the level, and ``> generated``.
        """
        start = int(np.searchsorted(self.y, generated, side="right"))
        if start >= self.y.size:
            return None
        below = self.cdf[start - 1] if start else 0.0
        mass = self.cdf[-1] - below
        if mass <= 1e-12:
            return None
        cond = (self.cdf[start:] - below) / mass
        idx = np.searchsorted(cond, np.asarray(levels) - 1e-9, side="left")
        idx = np.minimum(idx, cond.size - 1)
        return self.y[start:][idx]


class LeafSamples:
    """For every (tree, leaf): the training lengths that fell there; weights ``1/(T·size)``.

    Built once from the training rows' leaves; stored flat, sorted by global leaf id (tree
    offset + node), with ``starts[g]:starts[g+1]`` the rows of global leaf ``g``.
    """

    def __init__(self, train_leaves: NDArray[np.int64], y: NDArray[np.float64], width: int):
        rows, trees = train_leaves.shape
        if rows != y.shape[0] or rows == 0:
            raise ValueError("need one leaf row per training length, and at least one")
        self.trees = trees
        self.width = width
        self.train_leaves = train_leaves.astype(np.int32)
        self.y = y.astype(np.float64)
        glob = (train_leaves + np.arange(trees) * width).ravel()
        order = np.argsort(glob, kind="stable")
        self._y_sorted = self.y[order // trees]
        self._starts = np.searchsorted(glob[order], np.arange(trees * width + 1)).astype(np.int64)

    def samples(self, leaves: NDArray[np.int64]) -> WeightedSamples:
        """The weighted leaf samples of one request, given its leaf in each tree."""
        glob = leaves + np.arange(self.trees) * self.width
        start = self._starts[glob]
        count = self._starts[glob + 1] - start
        if np.any(count == 0):  # cannot happen for leaves of the training rows' own trees
            keep = count > 0
            start, count = start[keep], count[keep]
        total = int(count.sum())
        offsets = np.cumsum(count) - count
        idx = np.arange(total) - np.repeat(offsets, count) + np.repeat(start, count)
        ys = self._y_sorted[idx]
        ws = np.repeat(1.0 / count, count)
        order = np.argsort(ys, kind="stable")
        ys, ws = ys[order], ws[order]
        cdf = np.cumsum(ws)
        cdf /= cdf[-1]
        return WeightedSamples(y=ys, cdf=cdf)
