"""A latency profile from an engine's recorded steps, and how well estimators predict them.

The way to make a profile for a new model or card: run vLLM with the plugin and
``TIERGATE_STEP_LOG`` set under ordinary traffic, then ``tiergate profile from-steps LOG``. The
steps are the engine's own (vLLM's scheduler, kernels and overheads), not a model of them, so
the profile predicts *that* engine. The same evaluation backs ``bench/estimator_refit.py``:

* ``profile``: the starting profile's coefficients as they are;
* ``beta``: those, corrected by the momentum ``beta`` only (what engines did before refits);
* ``online``: the engine's own loop replayed — each step predicted by the estimator as it was
  *before* that step was seen (refits every ``every`` steps, beta between them), so the error
  is measured on steps the estimator had not learned from;
* ``offline``: one fit on the steps before the held-out part, judged on the held-out part;
* ``floor``: a fit on the held-out part itself — about the best an estimator of this form does
  on those steps, so it is the noise floor (identical batches on a shared machine vary by tens
  of %).

Errors are mean absolute percentage errors over the held-out part (the last ``holdout`` of the
steps, in time order: a profile is used on the traffic that comes after it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.estimator_refit import (
    DEFAULT_EVERY,
    CoefficientRefit,
    fit_coefficients,
    step_features,
)
from priority.profiles import EngineConfig, Profile
from priority.profiles.steps import RecordedStep


@dataclass(frozen=True, slots=True)
class StepErrors:
    steps: int
    heldout: int
    profile: float
    beta: float
    online: float
    offline: float
    floor: float


def _mape(predicted: Sequence[float], real: Sequence[float]) -> float:
    p, r = np.asarray(predicted), np.asarray(real)
    return float(np.mean(np.abs(p / r - 1.0))) if len(r) else float("nan")


def split(steps: Sequence[RecordedStep], holdout: float) -> int:
    """Index of the first held-out step (at least one step on each side when possible)."""
    if not 0.0 < holdout < 1.0:
        raise ValueError("holdout must be in (0, 1)")
    cut = round(len(steps) * (1.0 - holdout))
    return min(max(cut, 1), max(1, len(steps) - 1))


def fit_steps(steps: Sequence[RecordedStep], prior: LatencyCoefficients) -> LatencyCoefficients:
    """The coefficients that best explain ``steps`` (near ``prior`` where they say nothing)."""
    features = np.vstack([step_features(s.prefill, s.decode_kv) for s in steps])
    times = np.array([s.real_s for s in steps])
    return fit_coefficients(features, times, prior)


def evaluate(
    steps: Sequence[RecordedStep],
    prior: LatencyCoefficients,
    *,
    holdout: float = 0.3,
    every: int = DEFAULT_EVERY,
) -> StepErrors:
    """The four estimators' held-out errors on ``steps`` (module docstring)."""
    cut = split(steps, holdout)
    held = steps[cut:]
    real = [s.real_s for s in held]
    fixed = BatchLatencyEstimator(prior)
    beta_only = BatchLatencyEstimator(prior)
    online = BatchLatencyEstimator(prior)
    refit = CoefficientRefit(prior, every=every)
    beta_predictions, online_predictions = [], []
    for i, step in enumerate(steps):
        if i >= cut:
            beta_predictions.append(beta_only.batch_time(step.prefill, step.decode_kv))
            online_predictions.append(online.batch_time(step.prefill, step.decode_kv))
        beta_only.observe(beta_only.raw_batch_time(step.prefill, step.decode_kv), step.real_s)
        online.observe(online.raw_batch_time(step.prefill, step.decode_kv), step.real_s)
        refitted = refit.observe(step.prefill, step.decode_kv, step.real_s)
        if refitted is not None:
            online.adopt(refitted)
    offline = BatchLatencyEstimator(fit_steps(steps[:cut], prior))
    floor = BatchLatencyEstimator(fit_steps(held, prior))
    return StepErrors(
        steps=len(steps),
        heldout=len(held),
        profile=_mape([fixed.batch_time(s.prefill, s.decode_kv) for s in held], real),
        beta=_mape(beta_predictions, real),
        online=_mape(online_predictions, real),
        offline=_mape([offline.batch_time(s.prefill, s.decode_kv) for s in held], real),
        floor=_mape([floor.batch_time(s.prefill, s.decode_kv) for s in held], real),
    )


def profile_from_steps(
    steps: Sequence[RecordedStep],
    prior: Profile,
    *,
    name: str,
    hardware: str,
    model: str,
    tensor_parallel: int = 1,
    source: str = "",
    holdout: float = 0.3,
) -> Profile:
    """A profile fitted to all of ``steps``, with the held-out error of a fit on the earlier
    part recorded in its ``fit`` block. The engine block is left at its defaults: at run time
    the gateway and the plugin take seats and limits from the engine itself."""
    if len(steps) < 2:
        raise ValueError("need at least 2 recorded steps")
    errors = evaluate(steps, prior.coefficients, holdout=holdout)
    return Profile(
        name=name,
        hardware=hardware,
        model=model,
        tensor_parallel=tensor_parallel,
        coefficients=fit_steps(steps, prior.coefficients),
        engine=EngineConfig(),
        provenance={
            "kind": "recorded-steps",
            "source": source,
            "prior": prior.name,
            "note": "fitted to a running engine's own steps (TIERGATE_STEP_LOG); engine limits "
            "are read from the engine at run time",
        },
        fit={
            "steps": errors.steps,
            "heldout_steps": errors.heldout,
            "heldout_mape": errors.offline,
            "prior_heldout_mape": errors.profile,
        },
    )
