"""What the engine learns from each measured step: beta, refitted coefficients, a step log.

The driver hands every measured step here (:meth:`StepLearner.learn`). Three consumers, one
sample: the estimator's momentum correction (``beta``), the online coefficient refit
(:mod:`priority.estimator_refit`, every ``TIERGATE_REFIT_EVERY`` steps) whose result the policy's
estimator adopts at once and the stat logger publishes for the gateway's router, and, when
``TIERGATE_STEP_LOG`` is set, one CSV row (:mod:`priority.profiles.steps`) from which
``tiergate profile from-steps`` builds a profile of this engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from priority.estimator import BatchLatencyEstimator
from priority.estimator_refit import CoefficientRefit
from priority.profiles import steps as step_format

logger = logging.getLogger(__name__)

MAX_LOGGED_STEPS = 2_000_000
"""Rows a step log takes at most (~100 MB): the log stops there, with a warning, rather than fill
the disk of an engine left running with it on."""
FLUSH_EVERY = 64


@dataclass(frozen=True, slots=True)
class StepShape:
    """The batch of a scheduled step, in the estimator's terms."""

    prefill: tuple[tuple[int, int], ...]
    decode_kv: tuple[int, ...]


class StepLog:
    """Appends measured steps to a CSV file (header written when the file is new)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._out: IO[str] | None = open(self.path, "a", newline="")  # noqa: SIM115
        if new:
            step_format.write_header(self._out)
        self.rows = 0

    def append(self, step: step_format.RecordedStep) -> None:
        if self._out is None:
            return
        step_format.append(self._out, step)
        self.rows += 1
        if self.rows % FLUSH_EVERY == 0:
            self._out.flush()
        if self.rows >= MAX_LOGGED_STEPS:
            logger.warning("tiergate: step log %s reached %d rows; stopped", self.path, self.rows)
            self.close()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


class StepLearner:
    def __init__(
        self,
        estimator: BatchLatencyEstimator,
        *,
        refit_every: int,
        step_log: str | None = None,
    ) -> None:
        self.estimator = estimator
        self.refit = (
            CoefficientRefit(estimator.coefficients, every=refit_every) if refit_every else None
        )
        self.log = StepLog(step_log) if step_log else None

    def learn(
        self,
        shape: StepShape,
        raw_predicted_s: float,
        real_s: float,
        end_s: float,
    ) -> None:
        """One executed step: its shape, the beta-free prediction made for it, its real time."""
        self.estimator.observe(raw_predicted_s, real_s)
        if self.refit is not None:
            refitted = self.refit.observe(shape.prefill, shape.decode_kv, real_s)
            if refitted is not None:
                self.estimator.adopt(refitted)
        if self.log is not None:
            self.log.append(
                step_format.RecordedStep(
                    end_s, real_s, raw_predicted_s, shape.prefill, shape.decode_kv
                )
            )

    @property
    def refits(self) -> int:
        return 0 if self.refit is None else self.refit.refits
