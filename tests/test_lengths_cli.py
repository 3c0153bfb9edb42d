"""``tiergate lengths train|eval`` through the core's CLI: the contract's JSON keys, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from priority.cli import app

KEYS = {"rows", "coverage", "pinball", "tightness_median", "predict_p50_ms", "predict_p99_ms"}


def write_rows(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with path.open("w") as fh:
        for _ in range(n):
            short = bool(rng.integers(2))
            prompt = "say hi" if short else "explain everything in detail"
            length = int(rng.integers(1, 20) if short else rng.integers(200, 400))
            fh.write(json.dumps({"prompt": prompt, "output_tokens": length, "model": "m"}) + "\n")


def test_train_then_eval_prints_exactly_the_contract_keys(tmp_path: Path) -> None:
    train, test, out = tmp_path / "train.jsonl", tmp_path / "test.jsonl", tmp_path / "model"
    write_rows(train, 300, seed=0)
    write_rows(test, 100, seed=1)
    runner = CliRunner()
    result = runner.invoke(
        app, ["lengths", "train", "--data", str(train), "--out", str(out), "--trees", "10"]
    )
    assert result.exit_code == 0, result.output
    assert (out / "manifest.json").is_file() and (out / "forest.npz").is_file()
    result = runner.invoke(
        app,
        [
            "lengths",
            "eval",
            "--model",
            str(out),
            "--data",
            str(test),
            "--quantile",
            "0.9",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) == KEYS
    assert report["rows"] == 100
    assert 0.0 <= report["coverage"] <= 1.0 and report["coverage"] >= 0.8
    assert (
        report["tightness_median"] >= 1.0 and report["predict_p99_ms"] >= report["predict_p50_ms"]
    )


def test_bad_input_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "model": "m"}\n')
    runner = CliRunner()
    result = runner.invoke(app, ["lengths", "train", "--data", str(bad), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "output_tokens" in result.output
    result = runner.invoke(
        app, ["lengths", "eval", "--model", str(tmp_path), "--data", str(bad), "--json"]
    )
    assert result.exit_code == 2 and "manifest" in result.output
