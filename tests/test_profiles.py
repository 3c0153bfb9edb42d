"""Shipped latency profiles: load, carry provenance and fit info, and have sane magnitudes."""

from __future__ import annotations

from pathlib import Path

import pytest

from priority.profiles import available_profiles, load_profile

EXPECTED = {
    "a100-qwen2-7b",
    "a100-qwen3-32b-tp4",
    "910b-qwen2-7b",
    "910b-qwen3-32b-tp4",
    "h100-llama3.1-8b",
    "h100-llama3.1-8b-measured",
}


def test_expected_profiles_are_shipped() -> None:
    assert set(available_profiles()) >= EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_is_sane(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    assert p.tensor_parallel == (4 if name.endswith("tp4") else 1)
    # Provenance: says how it was made and from which sources / numbers.
    assert p.provenance.get("kind")
    assert p.provenance.get("model_shape", {}).get("layers", 0) > 0
    assert "kv_capacity" in p.provenance
    # Fit info: held-out MAPE on rows the coefficients were not fitted to.
    assert p.fit["heldout_rows"] > 0
    assert 0.0 < p.fit["heldout_mape"] < 0.15
    assert p.fit["train_rows"] + p.fit["heldout_rows"] == p.fit["rows"]
    assert "measured_validation" in p.fit
    est = p.estimator()
    decode = est.batch_time(decode_kv=[128])
    assert 0.002 < decode < 0.1
    # More context and more requests cost more; a big prefill costs more than a decode step.
    assert est.batch_time(decode_kv=[4096] * 32) > decode
    assert decode < est.batch_time(prefill=[(1024, 0)]) < 2.0
    assert p.zero_load_ttft_s(1024) == pytest.approx(est.batch_time(prefill=[(1024, 0)]))
    assert p.engine.num_kv_blocks * p.engine.block_size >= 1024
    assert p.engine.block_size == (128 if name.startswith("910b") else 16)


def test_unknown_profile_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match=r"unknown profile 'nope'.*a100-qwen2-7b"):
        load_profile("nope")


def test_cli_fit_and_list(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from priority.cli.profile import profile_app
    from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
    from priority.profiles.table import BatchRow, write_rows

    truth = LatencyCoefficients(a_p=1e-9, b_p=1e-9, c_p=5e-5, a_d=3e-8, b_d=1e-4, t_c=0.008)
    est = BatchLatencyEstimator(truth)
    rows = [
        BatchRow(((q, kv),), (), est.raw_batch_time([(q, kv)], []))
        for q in (64, 512, 2048)
        for kv in (0, 1024)
    ]
    rows += [
        BatchRow((), (kv,) * b, est.raw_batch_time([], [kv] * b))
        for b in (1, 8, 64)
        for kv in (128, 2048)
    ]
    table = tmp_path / "t.csv"
    write_rows(table, rows)
    out = tmp_path / "p.json"
    runner = CliRunner()
    result = runner.invoke(
        profile_app, ["fit", str(table), "-o", str(out), "--hardware", "X", "--tp", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "held-out MAPE" in result.output
    prof = load_profile(out)
    assert (prof.name, prof.hardware, prof.tensor_parallel) == ("t", "X", 2)
    assert prof.coefficients.t_c == pytest.approx(truth.t_c, rel=1e-4)

    listed = runner.invoke(profile_app, ["list"], env={"COLUMNS": "250"})
    assert listed.exit_code == 0, listed.output
    for name in EXPECTED:
        assert name in listed.output


MEASURED_TABLES = Path(__file__).resolve().parents[1] / "docs" / "data" / "h100-llama3.1-8b"


def test_measured_h100_profile_is_rebuilt_from_its_committed_tables() -> None:
    """The shipped measured profile is exactly what its tables and build script give."""
    from tests.scripts_loader import load_script

    rebuilt = load_script("scripts/build_measured_profile.py").build(MEASURED_TABLES)
    shipped = load_profile("h100-llama3.1-8b-measured")
    assert rebuilt.coefficients == shipped.coefficients
    assert rebuilt.fit["heldout_mape"] == pytest.approx(shipped.fit["heldout_mape"])
    # The held-out table was never fitted: its rows are not in the training tables.
    from priority.profiles.table import read_rows

    train = {(r.prefill, r.decode_kv) for r in read_rows(MEASURED_TABLES / "full.csv")}
    train |= {(r.prefill, r.decode_kv) for r in read_rows(MEASURED_TABLES / "random.csv")}
    held = read_rows(MEASURED_TABLES / "heldout.csv")
    assert not any((r.prefill, r.decode_kv) in train for r in held)
    assert all(r.meta["device"] == "NVIDIA H100 80GB HBM3" for r in held)


def test_cli_eval_reports_a_profile_against_a_measured_table() -> None:
    import json

    from typer.testing import CliRunner

    from priority.cli.profile import profile_app
    from priority.profiles.fit import mape
    from priority.profiles.table import read_rows

    table = MEASURED_TABLES / "heldout.csv"
    result = CliRunner().invoke(profile_app, ["eval", "h100-llama3.1-8b", str(table), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    composed = load_profile("h100-llama3.1-8b")
    assert report["rows"] == len(read_rows(table))
    assert report["mape"] == pytest.approx(mape(composed.coefficients, read_rows(table)))
    assert set(report["mape_by_kind"]) == {"prefill_only", "decode_only", "mixed"}
    bad = CliRunner().invoke(profile_app, ["eval", "no-such-profile", str(table)])
    assert bad.exit_code == 2 and "unknown profile" in bad.output
