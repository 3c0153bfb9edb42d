"""The simulated engine learns its estimator as the vLLM plugin does: beta, and with
``refit_every`` the coefficients themselves, from the steps it runs (fast-forwarded ones too)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from priority.estimator import BatchLatencyEstimator
from priority.policies.vllm import VllmV1Policy
from priority.sim.engine import EngineCore
from tests.test_sim_engine import drive, make_profile, staggered_requests

PROFILED = make_profile()
TRUE = dataclasses.replace(
    PROFILED,
    coefficients=dataclasses.replace(
        PROFILED.coefficients,
        a_d=PROFILED.coefficients.a_d * 3,
        b_d=PROFILED.coefficients.b_d * 3,
        t_c=PROFILED.coefficients.t_c * 1.5,
        c_p=PROFILED.coefficients.c_p * 0.5,
    ),
)
"""A true engine whose decode terms are 3x the profile's, its overhead 1.5x, its prefill half:
no single factor (beta) fits it."""


def _engine(refit_every: int, fast_forward: bool = True) -> EngineCore:
    return EngineCore(
        TRUE,
        VllmV1Policy(PROFILED.estimator()),
        rng=np.random.default_rng(0),
        fast_forward=fast_forward,
        refit_every=refit_every,
    )


def _error(engine: EngineCore) -> float:
    """The estimator's error on the true engine's steps of several shapes."""
    est, truth = engine.policy.estimator, BatchLatencyEstimator(TRUE.coefficients)
    shapes = [([], [500] * 8), ([], [100] * 2), ([(512, 0)], [300] * 4), ([(64, 0)], [])]
    return max(abs(est.batch_time(p, d) / truth.raw_batch_time(p, d) - 1) for p, d in shapes)


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_refitting_engine_learns_a_shape_beta_cannot(fast_forward: bool) -> None:
    beta_only, refitting = _engine(0, fast_forward), _engine(32, fast_forward)
    for engine in (beta_only, refitting):
        drive(engine, staggered_requests(40, seed=3))
    assert refitting.refit is not None and refitting.refit.refits >= 2
    assert _error(refitting) < 0.05
    assert _error(beta_only) > 2 * _error(refitting)
    assert beta_only.policy.estimator.coefficients == PROFILED.coefficients  # beta only


def test_no_refit_by_default() -> None:
    engine = EngineCore(PROFILED, VllmV1Policy(PROFILED.estimator()))
    assert engine.refit is None
