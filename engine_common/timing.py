"""Real step times from the scheduler's own calls, for the estimator's momentum correction.

vLLM calls ``schedule()`` for a step and later ``update_from_output()`` with that step's output,
in FIFO order. Synchronous scheduling: the step runs between the two calls, so its time is
``t_update - t_schedule``. Asynchronous scheduling: step k+1 is scheduled while step k runs and
starts executing when step k finishes, so its time is ``t_update(k+1) - t_update(k)``. Both are
``t_update - max(t_schedule, t_previous_update)``, which is what :class:`StepTimer` measures. The
measure includes the scheduler's own overhead and the output processing between steps; the
profile's ``t_c`` (per-batch overhead) was fitted on forward passes alone, so beta absorbs that
difference, which is what it is for.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class MeasuredStep(Generic[T]):
    raw_predicted_s: float
    real_s: float
    end_s: float
    payload: T


class StepTimer(Generic[T]):
    def __init__(self) -> None:
        self._pending: deque[tuple[float, float, T]] = deque()
        self._last_done = -math.inf

    def scheduled(self, now: float, raw_predicted_s: float, payload: T) -> None:
        """A non-empty step was scheduled at ``now`` (``raw_predicted_s``: beta-free estimate)."""
        self._pending.append((now, raw_predicted_s, payload))

    def completed(self, now: float) -> MeasuredStep[T] | None:
        """The oldest scheduled step's output arrived at ``now``."""
        if not self._pending:
            return None
        started, raw, payload = self._pending.popleft()
        real = now - max(started, self._last_done)
        self._last_done = now
        return MeasuredStep(raw, real, now, payload)

    def __len__(self) -> int:
        return len(self._pending)
