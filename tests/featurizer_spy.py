"""Which prompts the length predictor's featurizer hashes: hashing is most of a prediction's
cost, so tests that a request is hashed once, not twice, watch it here."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from priority.lengths.features import Featurizer, RequestFeatures


def record_hashed_prompts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The prompts ``Featurizer.transform`` hashes from now on, in order (the list grows)."""
    hashed: list[str] = []
    plain = Featurizer.transform

    def counting(self: Featurizer, requests: Sequence[RequestFeatures]) -> np.ndarray:
        hashed.extend(r.prompt for r in requests)
        return plain(self, requests)

    monkeypatch.setattr(Featurizer, "transform", counting)
    return hashed
