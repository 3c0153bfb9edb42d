"""The length predictor: a quantile regression forest over request features, versioned on disk.

``predict`` gives a request's :class:`~priority.lengths.LengthDistribution` at
:data:`~priority.lengths.DEFAULT_LEVELS` (what the gateway sends to the engines); ``refine``
gives the bound once ``generated`` tokens exist, from the forest's weighted leaf samples
conditioned on ``length > generated`` — exact where the engines, without the forest, interpolate
the quantile vector. Both never go below ``generated + 1``, and an overrun (no training row of
the request's leaves was that long) follows :mod:`priority.lengths.distribution`'s rule.

The forest is ``quantile-forest``'s ``RandomForestQuantileRegressor`` (scikit-learn trees);
what predicting needs of it is packed into arrays (:mod:`priority.lengths.forest`). A saved model
is a folder: ``forest.npz`` (arrays only, loaded without pickle) and ``manifest.json`` (format,
version id, training rows, feature layout, forest parameters, data source, the npz's SHA-256);
:meth:`LengthPredictor.load` checks all of it before using anything.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from priority.lengths.distribution import DEFAULT_LEVELS, OVERRUN_GROWTH, LengthDistribution
from priority.lengths.features import FeatureConfig, Featurizer, RequestFeatures
from priority.lengths.forest import LeafSamples, PackedForest

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ForestParams",
    "LengthPredictor",
    "ModelFormatError",
    "overrun_bound",
]

FORMAT = "tiergate-length-predictor"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ARRAYS = "forest.npz"

Progress = Callable[[int, int], None]
"""``progress(trees_done, trees_total)`` while a forest grows."""


class ModelFormatError(ValueError):
    """A model folder that is not one this code wrote (or was changed since)."""


@dataclass(frozen=True, slots=True)
class ForestParams:
    """Forest hyper-parameters (the manifest records them). Smaller than JITServe's artifact
    (300 trees, depth 150) so one prediction stays far under the 5 ms budget; leaves of at
    least 5 rows give each leaf a distribution rather than a point."""

    n_estimators: int = 100
    min_samples_leaf: int = 5
    max_features: float = 0.33
    max_depth: int | None = None
    random_state: int = 0


def overrun_bound(generated: int, max_tokens: int | None) -> int:
    """:mod:`priority.lengths.distribution`'s overrun rule: ``g + max(1, ⌈OVERRUN_GROWTH·g⌉)``,
    capped by ``max_tokens`` (but never below ``g + 1``)."""
    total = generated + max(1, math.ceil(OVERRUN_GROWTH * generated))
    if max_tokens is not None:
        total = min(total, max(max_tokens, generated + 1))
    return total


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class LengthPredictor:
    """A fitted forest plus the featurizer it was trained with; immutable once built."""

    def __init__(
        self,
        packed: PackedForest,
        leaves: LeafSamples,
        config: FeatureConfig,
        manifest: dict[str, Any],
    ) -> None:
        self.packed = packed
        self.leaves = leaves
        self.config = config
        self.featurizer = Featurizer(config)
        self.manifest = manifest

    @property
    def version(self) -> str:
        """The model's version id (creation time + content hash), e.g. in logs and metrics."""
        return str(self.manifest["version"])

    # -- training --------------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        requests: Sequence[RequestFeatures],
        output_tokens: Sequence[int],
        *,
        config: FeatureConfig | None = None,
        params: ForestParams | None = None,
        data_source: str = "unknown",
        progress: Progress | None = None,
        chunk: int = 10,
    ) -> LengthPredictor:
        """Grow the forest ``chunk`` trees at a time (``warm_start``), reporting ``progress``."""
        if len(requests) != len(output_tokens) or not requests:
            raise ValueError("need one output length per request, and at least one request")
        config = config or FeatureConfig()
        return cls.fit_matrix(
            Featurizer(config).transform(requests),
            output_tokens,
            config=config,
            models=sorted({r.model for r in requests}),
            params=params,
            data_source=data_source,
            progress=progress,
            chunk=chunk,
        )

    @classmethod
    def fit_matrix(
        cls,
        x: NDArray[np.float32],
        output_tokens: Sequence[int] | NDArray[Any],
        *,
        config: FeatureConfig,
        models: Sequence[str],
        params: ForestParams | None = None,
        data_source: str = "unknown",
        progress: Progress | None = None,
        chunk: int = 10,
    ) -> LengthPredictor:
        """:meth:`fit` on rows featurized already (``config``'s layout): the gateway's stored
        samples keep only the hashed vectors, never the prompt text. ``models``: the model
        names the rows cover (recorded in the manifest)."""
        from quantile_forest import RandomForestQuantileRegressor

        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != config.width:
            raise ValueError(f"feature rows must have {config.width} columns")
        if x.shape[0] != len(output_tokens) or x.shape[0] == 0:
            raise ValueError("need one output length per row, and at least one row")
        params = params or ForestParams()
        y = np.maximum(np.asarray(output_tokens, dtype=np.float64), 1.0)
        forest = RandomForestQuantileRegressor(
            n_estimators=min(chunk, params.n_estimators),
            min_samples_leaf=params.min_samples_leaf,
            max_features=params.max_features,
            max_depth=params.max_depth,
            random_state=params.random_state,
            warm_start=True,
        )
        grown = 0
        while grown < params.n_estimators:
            grown = min(grown + chunk, params.n_estimators)
            forest.set_params(n_estimators=grown)
            forest.fit(x, y)
            if progress is not None:
                progress(grown, params.n_estimators)
        packed = PackedForest.from_estimators(list(forest.estimators_))
        leaves = LeafSamples(packed.apply(x), y, packed.width)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "training_rows": int(x.shape[0]),
            "features": config.to_json(),
            "forest": asdict(params),
            "data_source": data_source,
            "models": sorted(set(models)),
            "levels": list(DEFAULT_LEVELS),
        }
        manifest["version"] = (
            "unsaved-"
            + hashlib.sha256(
                json.dumps(manifest, sort_keys=True).encode() + y.tobytes()
            ).hexdigest()[:10]
        )
        return cls(packed, leaves, config, manifest)

    # -- predicting ------------------------------------------------------------------------------

    def _samples(self, requests: Sequence[RequestFeatures]) -> list[Any]:
        leaves = self.packed.apply(self.featurizer.transform_once(requests))
        return [self.leaves.samples(row) for row in leaves]

    def predict(
        self, request: RequestFeatures, levels: tuple[float, ...] = DEFAULT_LEVELS
    ) -> LengthDistribution:
        """The request's total-length quantiles at ``levels`` (what the engines refine)."""
        return self.predict_many([request], levels)[0]

    def predict_many(
        self, requests: Sequence[RequestFeatures], levels: tuple[float, ...] = DEFAULT_LEVELS
    ) -> list[LengthDistribution]:
        """:meth:`predict` for many requests at once (one featurizer and tree walk)."""
        out = []
        for request, samples in zip(requests, self._samples(requests), strict=True):
            values = samples.quantiles(levels)
            assert values is not None  # every training length is >= 1 > 0 generated
            out.append(
                LengthDistribution(
                    levels=tuple(levels),
                    values=tuple(float(v) for v in np.maximum.accumulate(values)),
                    max_tokens=request.max_tokens,
                )
            )
        return out

    def refine(self, request: RequestFeatures, generated: int, q: float) -> int:
        """The ``q``-quantile of the total length given ``generated`` tokens so far.

        The conditional quantile over the weighted leaf samples longer than ``generated``:
        non-decreasing in ``generated`` and ``q``, ``≥ generated + 1``, capped by ``max_tokens``;
        with no sample that long, :func:`overrun_bound`.
        """
        if not 0.0 < q < 1.0:
            raise ValueError("q must be inside (0, 1)")
        if generated < 0:
            raise ValueError("generated must be >= 0")
        samples = self._samples([request])[0]
        values = samples.quantiles((q,), generated)
        if values is None:
            return overrun_bound(generated, request.max_tokens)
        total = max(math.ceil(float(values[0])), generated + 1)
        if request.max_tokens is not None:
            total = min(total, max(request.max_tokens, generated + 1))
        return total

    # -- saving and loading ----------------------------------------------------------------------

    def save(self, folder: Path) -> str:
        """Write ``forest.npz`` then ``manifest.json`` into ``folder``; returns the version id
        (a model is complete only once its manifest exists, so write to a fresh folder and
        point the gateway at it afterwards)."""
        folder.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = dict(self.packed.arrays())
        arrays["train_leaves"] = self.leaves.train_leaves
        arrays["y"] = self.leaves.y
        with (folder / ARRAYS).open("wb") as fh:
            np.savez_compressed(fh, allow_pickle=False, **arrays)
        digest = _sha256(folder / ARRAYS)
        created = datetime.now(UTC)
        manifest = dict(self.manifest)
        manifest["created"] = created.isoformat(timespec="seconds")
        manifest["sha256"] = digest
        manifest["version"] = f"{created:%Y%m%dT%H%M%SZ}-{digest[:10]}"
        tmp = folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        tmp.replace(folder / MANIFEST)
        self.manifest = manifest
        return str(manifest["version"])

    @classmethod
    def load(cls, folder: Path, expect_version: str | None = None) -> LengthPredictor:
        """Load a saved model, checking its manifest: format and format version, the arrays'
        SHA-256, the feature layout, the row count, and ``expect_version`` when given.
        ``ModelFormatError`` on any mismatch."""
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise ModelFormatError(f"no readable {MANIFEST} in {folder}: {exc}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ModelFormatError(f"{folder} is not a {FORMAT} folder")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise ModelFormatError(
                f"model format {manifest.get('format_version')!r}, this code reads {FORMAT_VERSION}"
            )
        if expect_version is not None and manifest.get("version") != expect_version:
            raise ModelFormatError(
                f"model version {manifest.get('version')!r}, expected {expect_version!r}"
            )
        path = folder / ARRAYS
        if not path.is_file() or _sha256(path) != manifest.get("sha256"):
            raise ModelFormatError(f"{path} is missing or does not match the manifest's sha256")
        try:
            config = FeatureConfig.from_json(manifest["features"])
            with np.load(path, allow_pickle=False) as data:
                packed = PackedForest.from_arrays(data)
                train_leaves = np.asarray(data["train_leaves"], dtype=np.int64)
                y = np.asarray(data["y"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFormatError(f"{folder}: {exc}") from None
        if y.shape[0] != manifest.get("training_rows") or train_leaves.shape != (
            y.shape[0],
            packed.trees,
        ):
            raise ModelFormatError(f"{folder}: arrays do not match the manifest's training rows")
        return cls(packed, LeafSamples(train_leaves, y, packed.width), config, manifest)
