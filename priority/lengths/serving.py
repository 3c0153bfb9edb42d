"""Predicting off the request path: a hot-swappable model and a time budget with a fallback.

Admission must never wait for the forest. The gateway holds one :class:`PredictorHandle`; a
trainer (periodic, or an operator) loads a new model *beside* the serving one and swaps it in
with one reference assignment, so a request sees either the old model or the new one, never a
half-loaded one. :func:`predict_with_budget` runs the prediction in a small thread pool and
returns the caller's fallback (a tier default or ``max_tokens`` as a distribution) when the
model is missing, fails, or does not answer within the budget.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path

from priority.lengths.distribution import LengthDistribution
from priority.lengths.features import RequestFeatures
from priority.lengths.model import LengthPredictor

__all__ = ["PredictorHandle", "apredict_with_budget", "predict_with_budget"]

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="lengths")
"""Two workers: numpy releases the GIL in the tree walk; more would only queue behind it."""


class PredictorHandle:
    """The current model, replaced atomically; ``None`` until the first model is loaded."""

    def __init__(self, predictor: LengthPredictor | None = None) -> None:
        self._predictor = predictor
        self._lock = threading.Lock()

    @property
    def current(self) -> LengthPredictor | None:
        """The model to use now (read once per request: a swap may happen at any time)."""
        return self._predictor

    @property
    def version(self) -> str | None:
        p = self._predictor
        return None if p is None else p.version

    def swap(self, predictor: LengthPredictor | None) -> LengthPredictor | None:
        """Serve ``predictor`` from now on; returns the model it replaces."""
        with self._lock:
            old, self._predictor = self._predictor, predictor
        return old

    def load(self, folder: Path) -> str:
        """Load and check the model in ``folder`` (slow part, outside the lock), then swap it
        in; returns its version. A bad folder raises and leaves the serving model in place."""
        predictor = LengthPredictor.load(folder)
        self.swap(predictor)
        return predictor.version


def _predict(handle: PredictorHandle, features: RequestFeatures) -> LengthDistribution | None:
    predictor = handle.current
    return None if predictor is None else predictor.predict(features)


def predict_with_budget(
    handle: PredictorHandle,
    features: RequestFeatures,
    budget_s: float,
    fallback: LengthDistribution,
) -> LengthDistribution:
    """The model's distribution for ``features`` if it comes within ``budget_s`` seconds, else
    ``fallback`` (also when no model is loaded or predicting raises). Blocks at most
    ``budget_s``; a late prediction finishes in the pool and is discarded."""
    if handle.current is None:
        return fallback
    future = _POOL.submit(_predict, handle, features)
    try:
        result = future.result(timeout=budget_s)
    except concurrent.futures.TimeoutError:
        future.cancel()  # still queued: never runs; already running: finishes unused
        return fallback
    except Exception:  # a broken model must not fail the request
        return fallback
    return fallback if result is None else result


async def apredict_with_budget(
    handle: PredictorHandle,
    features: RequestFeatures,
    budget_s: float,
    fallback: LengthDistribution,
) -> LengthDistribution:
    """:func:`predict_with_budget` for an event loop: awaits the pool, never blocks the loop."""
    if handle.current is None:
        return fallback
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_POOL, _predict, handle, features)
    try:
        result = await asyncio.wait_for(future, timeout=budget_s)
    except TimeoutError:
        return fallback
    except Exception:
        return fallback
    return fallback if result is None else result
