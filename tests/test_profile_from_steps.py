"""A profile from an engine's recorded steps, and the held-out errors the bench reports."""

from __future__ import annotations

import dataclasses

import numpy as np
from typer.testing import CliRunner

from priority.cli import app
from priority.estimator import BatchLatencyEstimator
from priority.profiles import load_profile
from priority.profiles.from_steps import evaluate
from priority.profiles.steps import RecordedStep, append, read_steps, write_header

PRIOR = load_profile("a100-qwen2-7b")
TRUE = dataclasses.replace(
    PRIOR.coefficients,
    a_d=PRIOR.coefficients.a_d * 3,
    b_d=PRIOR.coefficients.b_d * 2,
    t_c=PRIOR.coefficients.t_c * 4,
)


def _steps(n: int, noise: float = 0.02, seed: int = 0) -> list[RecordedStep]:
    rng = np.random.default_rng(seed)
    truth = BatchLatencyEstimator(TRUE)
    steps = []
    for k in range(n):
        decode = tuple(int(v) for v in rng.integers(10, 2000, size=int(rng.integers(1, 32))))
        prefill = ((int(rng.integers(16, 1024)), 0),) if k % 4 == 0 else ()
        real = truth.raw_batch_time(prefill, decode) * float(rng.lognormal(0, noise))
        steps.append(RecordedStep(float(k), real, 0.0, prefill, decode))
    return steps


def test_online_refit_reaches_the_floor_the_profile_misses() -> None:
    errors = evaluate(_steps(600), PRIOR.coefficients, holdout=0.3, every=32)
    assert errors.heldout == 180
    assert errors.profile > 0.4
    assert errors.online < 0.05 and errors.offline < 0.05
    assert errors.floor <= 1.25 * errors.offline  # about the best this form does there
    assert errors.beta > errors.online  # one factor cannot fix terms off by different factors


def test_from_steps_writes_a_profile_that_predicts_the_engine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "steps.csv"
    with open(log, "w", newline="") as out:
        write_header(out)
        for step in _steps(300):
            append(out, step)
    assert len(list(read_steps(log))) == 300
    result = CliRunner().invoke(
        app,
        [
            "profile",
            "from-steps",
            str(log),
            "-o",
            str(tmp_path / "p.json"),
            "--prior",
            "a100-qwen2-7b",
            "--hardware",
            "cpu",
            "--model",
            "tiny",
        ],
    )
    assert result.exit_code == 0, result.output
    profile = load_profile(tmp_path / "p.json")
    assert profile.provenance["kind"] == "recorded-steps"
    assert profile.fit["heldout_mape"] < 0.05 < profile.fit["prior_heldout_mape"]
    fresh = _steps(50, noise=0.0, seed=1)  # other batches of the same engine, noise-free
    predicted = BatchLatencyEstimator(profile.coefficients)
    errors = [abs(predicted.batch_time(s.prefill, s.decode_kv) / s.real_s - 1) for s in fresh]
    assert max(errors) < 0.1


def test_too_few_steps_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "steps.csv"
    with open(log, "w", newline="") as out:
        write_header(out)
    result = CliRunner().invoke(
        app, ["profile", "from-steps", str(log), "-o", str(tmp_path / "p.json")]
    )
    assert result.exit_code == 2 and "at least 2" in result.output
