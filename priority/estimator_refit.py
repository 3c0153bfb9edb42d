"""Online refinement of the estimator's coefficients from an engine's real step times.

The momentum correction ``beta`` (:mod:`priority.estimator`) scales the whole profile by one
number, which is right when the profile has the right *shape* and the wrong speed. A profile
fitted on other hardware, another model or the project's own PyTorch model of the architecture
(``profile_batches``) has the wrong shape too: on a real vLLM CPU engine the shipped profiles
were 67% off per step and ``beta`` alone settled near 2.3 while still missing short and long
steps alike. Every step an engine runs is a labelled sample of its own latency model — the batch
shape it ran and the time it took — so the engine refits the coefficients themselves:

    minimise  sum_k ((x_k . c - t_k) / t_k)^2  +  lam * sum_i ((c_i - c0_i) / c0_i)^2,  c >= 0

over a sliding window of recent steps, where ``x_k`` are the step's features in the estimator's
terms (:func:`step_features`), ``t_k`` its measured time and ``c0`` the profile's coefficients.
Relative residuals weigh a 5 ms decode step like a 500 ms prefill (what a TTFT or TPOT error
costs is relative). The prior keeps coefficients the window cannot identify (no long prompt seen
yet: ``a_p`` stays put) at the profile's value instead of letting them drift to 0 or explode;
``lam`` (0.001) is worth a thousandth of one step's error per coefficient, so a few
informative steps outweigh it. A coefficient the profile has at 0 (usually ``d_p``) stays 0: the
profile said the term is absent. Solved as non-negative least squares in units of the prior
(``c_i / c0_i``), which keeps the problem well scaled whatever the hardware.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import fields

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

from priority.estimator import LatencyCoefficients

COEFFICIENT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(LatencyCoefficients))
"""The order of :func:`step_features` and of the refit's vectors: the dataclass's own."""
DEFAULT_WINDOW = 512
"""Steps kept: a few seconds of decode steps on a GPU, long enough to hold prefills of several
sizes as well."""
DEFAULT_EVERY = 64
"""Steps between refits (a refit is one small NNLS solve: well under a millisecond)."""
DEFAULT_PRIOR_WEIGHT = 1e-3
MIN_STEPS = 32
"""No refit before this many steps: the prior would dominate and it would change nothing."""


def step_features(
    prefill: Sequence[tuple[int, int]], decode_kv: Sequence[int]
) -> npt.NDArray[np.float64]:
    """The step's terms of ``raw_batch_time`` (Eq. 7), one per coefficient, so that
    ``step_features(p, d) @ coefficients == estimator.raw_batch_time(p, d)``."""
    x = dict.fromkeys(COEFFICIENT_NAMES, 0.0)
    for l_q, l_kv in prefill:
        x["a_p"] += l_q * l_q
        x["b_p"] += l_q * l_kv
        x["c_p"] += l_q
        x["d_p"] += l_kv
    x["a_d"] = float(sum(decode_kv))
    x["b_d"] = float(len(decode_kv))
    x["t_c"] = 1.0
    return np.array([x[name] for name in COEFFICIENT_NAMES], dtype=np.float64)


def as_vector(coefficients: LatencyCoefficients) -> npt.NDArray[np.float64]:
    return np.array([getattr(coefficients, n) for n in COEFFICIENT_NAMES], dtype=np.float64)


def from_vector(values: npt.NDArray[np.float64]) -> LatencyCoefficients:
    return LatencyCoefficients(
        **{n: float(max(0.0, v)) for n, v in zip(COEFFICIENT_NAMES, values, strict=True)}
    )


def fit_coefficients(
    features: npt.NDArray[np.float64],
    times_s: npt.NDArray[np.float64],
    prior: LatencyCoefficients,
    *,
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
) -> LatencyCoefficients:
    """The coefficients that best explain ``times_s`` (relative error) near ``prior``.

    ``features``: one row of :func:`step_features` per step; ``times_s``: their measured times.
    """
    c0 = as_vector(prior)
    free = c0 > 0  # a term the prior has at 0 stays out of the model
    keep = times_s > 0
    x, t = features[keep][:, free], times_s[keep]
    if len(t) == 0:
        return prior
    scale = c0[free]
    data = (x * scale) / t[:, None]  # unknowns r = c / c0; residual (x.c - t) / t
    root = np.sqrt(prior_weight)
    system = np.vstack([data, root * np.eye(len(scale))])
    target = np.concatenate([np.ones(len(t)), np.full(len(scale), root)])
    ratios, _ = nnls(system, target)
    values = np.zeros_like(c0)
    values[free] = ratios * scale
    return from_vector(values)


class CoefficientRefit:
    """Keeps a window of (features, real time) and refits every ``every`` steps."""

    def __init__(
        self,
        prior: LatencyCoefficients,
        *,
        window: int = DEFAULT_WINDOW,
        every: int = DEFAULT_EVERY,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    ) -> None:
        if window < 1 or every < 1:
            raise ValueError("window and every must be >= 1")
        self.prior = prior
        self.every = every
        self.prior_weight = prior_weight
        self._features: deque[npt.NDArray[np.float64]] = deque(maxlen=window)
        self._times: deque[float] = deque(maxlen=window)
        self._since = 0
        self.refits = 0

    def __len__(self) -> int:
        return len(self._times)

    def observe(
        self, prefill: Sequence[tuple[int, int]], decode_kv: Sequence[int], real_s: float
    ) -> LatencyCoefficients | None:
        """Record one executed step; the refitted coefficients when a refit is due, else None."""
        return self.observe_features(step_features(prefill, decode_kv), real_s)

    def observe_features(
        self, features: npt.NDArray[np.float64], real_s: float
    ) -> LatencyCoefficients | None:
        """:meth:`observe` for a step already in :func:`step_features` form."""
        if not real_s > 0:
            return None
        self._features.append(np.asarray(features, dtype=np.float64))
        self._times.append(real_s)
        self._since += 1
        if self._since < self.every or len(self._times) < MIN_STEPS:
            return None
        self._since = 0
        self.refits += 1
        return self.fit()

    def fit(self) -> LatencyCoefficients:
        """The coefficients that best explain the window (the prior if it is empty)."""
        if not self._times:
            return self.prior
        return fit_coefficients(
            np.vstack(self._features),
            np.fromiter(self._times, dtype=np.float64),
            self.prior,
            prior_weight=self.prior_weight,
        )
