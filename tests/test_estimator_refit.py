"""The online coefficient refit: it learns an engine's own latency model from its steps."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.estimator_refit import (
    MIN_STEPS,
    CoefficientRefit,
    fit_coefficients,
    step_features,
)
from priority.profiles import load_profile
from priority.profiles.steps import RecordedStep, format_row, parse_row

PRIOR = load_profile("a100-qwen2-7b").coefficients
TRUE = dataclasses.replace(
    PRIOR, a_p=PRIOR.a_p * 1.6, c_p=PRIOR.c_p * 0.5, a_d=PRIOR.a_d * 2.5, t_c=PRIOR.t_c * 3.0
)


def _steps(rng: np.random.Generator, n: int) -> list[tuple[list[tuple[int, int]], list[int]]]:
    """Batches of the kinds an engine runs: decode-only, prefill-only, mixed."""
    steps = []
    for k in range(n):
        decodes = [int(v) for v in rng.integers(50, 3000, size=int(rng.integers(0, 64)))]
        prefill = []
        if k % 3 != 0 or not decodes:
            prefill = [(int(rng.integers(16, 2048)), int(rng.integers(0, 1024)))]
        steps.append((prefill, decodes))
    return steps


def _mape(coefficients: LatencyCoefficients, steps, times) -> float:
    est = BatchLatencyEstimator(coefficients)
    predicted = np.array([est.raw_batch_time(p, d) for p, d in steps])
    return float(np.mean(np.abs(predicted / times - 1)))


def test_features_are_the_estimators_terms() -> None:
    prefill, decode = [(100, 20), (7, 0)], [30, 400, 5]
    est = BatchLatencyEstimator(PRIOR)
    coefs = np.array([getattr(PRIOR, f.name) for f in dataclasses.fields(PRIOR)])
    expected = est.raw_batch_time(prefill, decode)
    assert step_features(prefill, decode) @ coefs == pytest.approx(expected)


def test_fit_recovers_another_engines_model_from_noisy_steps() -> None:
    rng = np.random.default_rng(0)
    steps = _steps(rng, 400)
    truth = BatchLatencyEstimator(TRUE)
    times = np.array([truth.raw_batch_time(p, d) for p, d in steps])
    times *= rng.lognormal(0.0, 0.03, size=len(times))  # 3% step-to-step noise
    train, test = slice(0, 300), slice(300, None)
    features = np.vstack([step_features(p, d) for p, d in steps])
    fitted = fit_coefficients(features[train], times[train], PRIOR)
    before = _mape(PRIOR, steps[test], times[test])
    after = _mape(fitted, steps[test], times[test])
    assert before > 0.3
    assert after < 0.05


def test_unseen_terms_keep_the_prior() -> None:
    """Decode-only steps say nothing of the prefill terms: they stay where the profile had them."""
    rng = np.random.default_rng(1)
    steps = [([], [int(v) for v in rng.integers(50, 3000, size=16)]) for _ in range(200)]
    truth = BatchLatencyEstimator(TRUE)
    times = np.array([truth.raw_batch_time(p, d) for p, d in steps])
    fitted = fit_coefficients(np.vstack([step_features(p, d) for p, d in steps]), times, PRIOR)
    assert fitted.a_p == pytest.approx(PRIOR.a_p, rel=1e-6)
    assert fitted.c_p == pytest.approx(PRIOR.c_p, rel=1e-6)
    assert _mape(fitted, steps, times) < 0.02


def test_a_term_the_profile_lacks_stays_out() -> None:
    assert PRIOR.d_p == 0.0
    rng = np.random.default_rng(2)
    steps = _steps(rng, 100)
    truth = BatchLatencyEstimator(dataclasses.replace(TRUE, d_p=1e-5))
    times = np.array([truth.raw_batch_time(p, d) for p, d in steps])
    fitted = fit_coefficients(np.vstack([step_features(p, d) for p, d in steps]), times, PRIOR)
    assert fitted.d_p == 0.0


def test_refit_is_due_every_n_steps_once_enough_are_seen() -> None:
    refit = CoefficientRefit(PRIOR, every=8)
    truth = BatchLatencyEstimator(TRUE)
    results = []
    for prefill, decode in _steps(np.random.default_rng(3), MIN_STEPS + 16):
        results.append(refit.observe(prefill, decode, truth.raw_batch_time(prefill, decode)))
    due = [i for i, r in enumerate(results) if r is not None]
    assert due and due[0] >= MIN_STEPS - 1
    assert all(b - a == 8 for a, b in itertools.pairwise(due))
    assert refit.refits == len(due)
    assert refit.observe([(10, 0)], [], 0.0) is None  # an unmeasured step is no sample


def test_adopt_restarts_the_momentum_correction() -> None:
    est = BatchLatencyEstimator(PRIOR, window=1)
    est.observe(1.0, 2.0)
    assert est.beta != 1.0
    est.adopt(TRUE)
    assert est.beta == 1.0 and est.coefficients == TRUE
    with pytest.raises(ValueError):
        est.adopt(TRUE, beta=0.0)


def test_step_rows_round_trip() -> None:
    step = RecordedStep(1.5, 0.0123, 0.01, ((512, 0), (3, 100)), (10, 20))
    assert parse_row(format_row(step)) == step
    empty = RecordedStep(2.0, 0.001, 0.001, (), (5,))
    assert parse_row(format_row(empty)) == empty
