"""``--lengths predicted``'s error model: the committed measurement loads, the simulated
quantiles cover as often as the real predictor's did held-out, draws are seeded."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_sim_engine import make_profile  # the shared test profile
from typer.testing import CliRunner

from priority.cli import app
from priority.lengths.distribution import DEFAULT_LEVELS
from priority.sim import build_workload
from priority.sim.length_error import (
    MEASURED_ERROR_PATH,
    LognormalLengthError,
    MeasuredLengthError,
    load_measured,
    parse_length_error,
)
from priority.sim.workflows import length_for

DRAWS = 4000
CAP = 4096


def _draws(
    error: MeasuredLengthError | LognormalLengthError, seed: int, cap: int = CAP
) -> tuple[np.ndarray, ...]:
    """``DRAWS`` true lengths (20..2,000 tokens), their sampled distributions' bounds at every
    level and their medians."""
    rng = np.random.default_rng(seed)
    true = rng.integers(20, 2000, size=DRAWS)
    dists = [error.sample(int(t), cap, rng) for t in true]
    bounds = np.asarray([[d.bound(level) for level in DEFAULT_LEVELS] for d in dists])
    medians = np.asarray([d.quantile(0.5) for d in dists])
    return true, bounds, medians


def test_the_committed_model_loads_with_its_provenance() -> None:
    model = load_measured()
    assert model.levels == DEFAULT_LEVELS
    assert model.probs[0] == 0.0 and model.probs[-1] == 1.0 and len(model.probs) > 100
    # roughly calibrated, as bench/lengths_eval.py finds the forest (coverage within 5 points)
    assert all(abs(c - level) < 0.05 for c, level in zip(model.coverage, model.levels, strict=True))
    # the sampled shape is close to the forest's own median shape (the module doc's claim)
    assert np.allclose(model.log_shape, model.forest_shape, atol=0.15)
    header = [line for line in MEASURED_ERROR_PATH.read_text().splitlines() if line[0] == "#"]
    for key in ("source:", "licence: MIT", "command:", "date:", "rows:"):
        assert any(line.startswith(f"# {key}") for line in header), key
    assert parse_length_error("measured") is model  # cached: one read per process


def _overconfident() -> MeasuredLengthError:
    """A made-up predictor far from calibrated (its 0.95-quantile covers 70%), so the coverage
    test cannot pass merely because the real forest is close to nominal."""
    probs = tuple(np.linspace(0.0, 1.0, 11).tolist())
    return MeasuredLengthError(
        probs=probs,
        log_error=tuple(np.linspace(-2.0, 2.5, 11).tolist()),
        levels=DEFAULT_LEVELS,
        coverage=(0.3, 0.35, 0.45, 0.55, 0.65, 0.7, 0.8),
        forest_shape=(0.0,) * len(DEFAULT_LEVELS),
    )


@pytest.mark.parametrize("make", [load_measured, _overconfident])
def test_sampled_coverage_matches_the_measured_calibration(
    make: Callable[[], MeasuredLengthError],
) -> None:
    model = make()
    true, bounds, _ = _draws(model, seed=7)
    covered = (true[:, None] <= bounds).mean(axis=0)
    for level, got, want in zip(DEFAULT_LEVELS, covered, model.coverage, strict=True):
        tolerance = 4 * np.sqrt(want * (1 - want) / DRAWS) + 0.005
        assert abs(got - want) < tolerance, (level, got, want)


def test_the_median_error_follows_the_measured_distribution() -> None:
    model = load_measured()
    # the median's error follows the measured empirical distribution, not a lognormal guess
    # (a cap far away: clipping at 4,096 would hide the long-median tail)
    true, _, medians = _draws(model, seed=7, cap=10**6)
    error = np.log(true / medians) + model.log_shape[DEFAULT_LEVELS.index(0.5)]
    for p in (0.1, 0.5, 0.9):
        assert abs(np.quantile(error, p) - float(model.quantile(p))) < 0.08, p


def test_lognormal_stays_an_explicit_calibrated_option() -> None:
    error = parse_length_error("lognormal:0.6")
    assert error == LognormalLengthError(0.6) and error.name == "lognormal:0.6"
    true, bounds, _ = _draws(error, seed=7)
    covered = (true[:, None] <= bounds).mean(axis=0)
    assert np.all(np.abs(covered - np.asarray(DEFAULT_LEVELS)) < 0.03)
    # and it differs from the measured one (the forest is wider: σ ≈ 0.9 in log space)
    _, measured_bounds, _ = _draws(load_measured(), seed=7)
    width = np.median(np.log(measured_bounds[:, 4] / measured_bounds[:, 0]))
    assert width > np.median(np.log(bounds[:, 4] / bounds[:, 0])) + 0.5


def test_draws_are_seeded() -> None:
    model = load_measured()
    first = [length_for("predicted", 300, CAP, np.random.default_rng(5), model) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    other = length_for("predicted", 300, CAP, np.random.default_rng(6), model)
    assert other != first[0]
    profile = make_profile()
    a, b, c = (
        build_workload("azure_conv_20min", reference_profile=profile, lengths="predicted", seed=s)
        for s in (1, 1, 2)
    )
    assert [s.length for s in a.specs] == [s.length for s in b.specs]
    assert [s.length for s in a.specs] != [s.length for s in c.specs]


def test_values_stay_inside_one_token_and_the_cap() -> None:
    model = load_measured()
    rng = np.random.default_rng(0)
    for true in (1, 2, 4000):
        for _ in range(200):
            dist = model.sample(true, CAP, rng)
            assert dist.values[0] >= 1.0 and dist.values[-1] <= CAP and dist.max_tokens == CAP


def test_a_bad_spec_or_file_is_a_clear_error(tmp_path: Path) -> None:
    for spec in ("oracle", "lognormal:x", "lognormal:-1"):
        with pytest.raises(ValueError):
            parse_length_error(spec)
    bad = tmp_path / "bad.csv"
    bad.write_text("# provenance\nkind,level,value\nlog_error,0,-1\nlog_error,1,1\n")
    with pytest.raises(ValueError, match="no 'coverage' rows"):
        load_measured(bad)
    shuffled = MEASURED_ERROR_PATH.read_text().replace("log_error,1,", "log_error,0.9999,")
    (tmp_path / "short.csv").write_text(shuffled)
    with pytest.raises(ValueError, match="probabilities from 0 to 1"):
        parse_length_error(f"measured:{tmp_path / 'short.csv'}")


def test_the_cli_takes_the_error_model() -> None:
    base = ["sim", "--trace", "azure_conv_20min", "--profile", "a100-qwen2-7b", "--rps", "1"]
    result = CliRunner().invoke(app, [*base, "--length-error", "gaussian"])
    assert result.exit_code == 2
    assert "unknown length error" in " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
