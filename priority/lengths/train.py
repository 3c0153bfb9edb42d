"""Training data for the length predictor: JSON lines in, a saved model out.

One JSON object a line: ``prompt`` (string), ``output_tokens`` (integer ≥ 0), ``model``
(string); optional ``prompt_tokens``, ``max_tokens`` (integers ≥ 1) and ``tenant`` (string).
``scripts/lengths_dataset.py`` writes such files from the public length data; the gateway's
periodic trainer will write them from its usage records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from priority.lengths.features import FeatureConfig, RequestFeatures
from priority.lengths.model import ForestParams, LengthPredictor, Progress

__all__ = ["LengthRow", "read_rows", "train"]


@dataclass(frozen=True, slots=True)
class LengthRow:
    """One finished request: what the predictor saw, and how long the output really was."""

    features: RequestFeatures
    output_tokens: int


def _int(obj: dict[str, Any], key: str, minimum: int, where: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: {key!r} must be an integer >= {minimum}")
    return value


def parse_row(obj: Any, where: str) -> LengthRow:
    """One decoded JSON line as a :class:`LengthRow`; ``ValueError`` naming ``where``."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object")
    prompt, model = obj.get("prompt"), obj.get("model")
    if not isinstance(prompt, str) or not isinstance(model, str) or not model:
        raise ValueError(f"{where}: 'prompt' and 'model' must be strings ('model' non-empty)")
    output = _int(obj, "output_tokens", 0, where)
    if output is None:
        raise ValueError(f"{where}: 'output_tokens' is required")
    tenant = obj.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise ValueError(f"{where}: 'tenant' must be a string")
    features = RequestFeatures(
        prompt=prompt,
        model=model,
        prompt_tokens=_int(obj, "prompt_tokens", 1, where),
        max_tokens=_int(obj, "max_tokens", 1, where),
        tenant=tenant,
    )
    return LengthRow(features=features, output_tokens=output)


def iter_rows(path: Path) -> Iterator[LengthRow]:
    """Rows of a JSONL file, skipping blank lines; ``ValueError`` at the first bad line."""
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{number}: not JSON") from None
            yield parse_row(obj, f"{path}:{number}")


def read_rows(path: Path) -> list[LengthRow]:
    """All rows of a JSONL file (see :func:`iter_rows`)."""
    return list(iter_rows(path))


def train(
    rows: list[LengthRow],
    *,
    config: FeatureConfig | None = None,
    params: ForestParams | None = None,
    data_source: str = "unknown",
    progress: Progress | None = None,
) -> LengthPredictor:
    """Fit a predictor on ``rows`` (unsaved; :meth:`LengthPredictor.save` writes it)."""
    if not rows:
        raise ValueError("no training rows")
    return LengthPredictor.fit(
        [r.features for r in rows],
        [r.output_tokens for r in rows],
        config=config,
        params=params,
        data_source=data_source,
        progress=progress,
    )
