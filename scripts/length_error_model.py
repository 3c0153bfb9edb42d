"""Measure the length predictor's held-out error on HH-RLHF and write the simulator's error model.

``tiergate sim --lengths predicted`` draws each request's predicted distribution from the error
this writes (:mod:`priority.sim.length_error`): the empirical quantiles of
``log(true / forest median)`` and the share of rows each of the forest's quantiles covered, on
rows the forest did not train on.

Data: HH-RLHF harmless-base test split only (**MIT**), rows as ``scripts/lengths_dataset.py``
makes them (chosen and rejected answers, ~4-characters-per-token counts, cap 2,048). Never point
this at alpaca_eval (non-commercial): its output is committed. Held-out by *cross-fitting*: the
prompts are cut into ``--folds`` folds by the same SHA-256 hash ``lengths_dataset.py`` splits by
(fold 0 of 5 is exactly its 20% test split, which ``bench/lengths_eval.py`` scores), and every
fold is predicted by a forest (default parameters) trained on the others — so every row is
held-out once and the model rests on all ~4,600 rows rather than 930.

    python scripts/length_error_model.py            # rewrites priority/sim/data/length_error_hh.csv
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lengths_dataset import DATA, HH_FILE, hh_rows, split_of  # noqa: E402

from priority.lengths.distribution import DEFAULT_LEVELS  # noqa: E402
from priority.lengths.model import ForestParams  # noqa: E402
from priority.lengths.train import LengthRow, parse_row, train  # noqa: E402
from priority.sim.length_error import MEASURED_ERROR_PATH, load_measured  # noqa: E402

PROBS = np.linspace(0.0, 1.0, 201)
"""Probabilities at which the log-error's quantiles are stored (every half percent)."""
DECIMALS = 4


def fold_of(prompt: str, folds: int) -> int:
    """The fold of a prompt: ``lengths_dataset.split_of``'s hash cut into ``folds`` equal parts."""
    return next(j for j in range(folds) if split_of(prompt, (j + 1) / folds) == "test")


def held_out(rows: list[LengthRow], folds: int, trees: int) -> tuple[np.ndarray, np.ndarray]:
    """True lengths and forest quantile vectors (rows × levels), each row predicted by a forest
    that never saw its prompt."""
    fold = np.asarray([fold_of(r.features.prompt, folds) for r in rows])
    y = np.maximum(np.asarray([r.output_tokens for r in rows], dtype=np.float64), 1.0)
    values = np.empty((len(rows), len(DEFAULT_LEVELS)))
    for j in range(folds):
        test = np.flatnonzero(fold == j)
        start = time.perf_counter()
        forest = train(
            [r for r, f in zip(rows, fold, strict=True) if f != j],
            params=ForestParams(n_estimators=trees),
            data_source=f"hh-rlhf fold!={j}",
        )
        dists = forest.predict_many([rows[i].features for i in test])
        values[test] = [d.values for d in dists]
        covered = (y[test, None] <= values[test]).mean(axis=0)
        print(
            f"fold {j}: {test.size} held-out rows, {time.perf_counter() - start:.1f} s, "
            f"coverage at {DEFAULT_LEVELS}: {np.round(covered, 3).tolist()}",
            file=sys.stderr,
        )
    return y, values


def strictly_increasing(values: np.ndarray, step: float) -> np.ndarray:
    """``values`` nudged up by at least ``step`` per point where ties (integer lengths) repeat,
    so the sampled error never sits on a plateau that would over-cover."""
    out = values.copy()
    for i in range(1, out.size):
        out[i] = max(out[i], out[i - 1] + step)
    return out


def error_model(y: np.ndarray, values: np.ndarray) -> dict[str, list[tuple[float, float]]]:
    """The CSV's rows by kind: log-error quantiles, coverage and median shape per level."""
    median = values[:, DEFAULT_LEVELS.index(0.5)]
    step = 10.0**-DECIMALS
    log_error = strictly_increasing(
        np.round(np.quantile(np.log(y / median), PROBS), DECIMALS), step
    )
    coverage = (y[:, None] <= values).mean(axis=0)
    shape = np.median(np.log(values / median[:, None]), axis=0)
    return {
        "log_error": list(zip(PROBS.tolist(), log_error.tolist(), strict=True)),
        "coverage": list(zip(DEFAULT_LEVELS, coverage.tolist(), strict=True)),
        "forest_shape": list(zip(DEFAULT_LEVELS, shape.tolist(), strict=True)),
    }


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write(path: Path, model: dict[str, list[tuple[float, float]]], header: list[str]) -> None:
    with path.open("w", encoding="utf-8", newline="") as fh:
        fh.writelines(f"# {line}\n" for line in header)
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["kind", "level", "value"])
        for kind, points in model.items():
            for level, value in points:
                writer.writerow([kind, f"{level:g}", f"{value:.{DECIMALS}f}"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="shared/data/lengths folder")
    parser.add_argument("--out", type=Path, default=MEASURED_ERROR_PATH)
    parser.add_argument("--max-tokens", type=int, default=2048, help="cap of every request")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--trees", type=int, default=ForestParams().n_estimators)
    args = parser.parse_args(argv)
    if args.folds < 2:
        parser.error("--folds must be at least 2")
    rows = [parse_row(r, "hh-rlhf") for r in hh_rows(args.data, args.max_tokens)]
    y, values = held_out(rows, args.folds, args.trees)
    model = error_model(y, values)
    params: dict[str, Any] = asdict(ForestParams(n_estimators=args.trees))
    header = [
        "tiergate simulator length-error model: the length predictor's held-out error",
        f"source: Anthropic/hh-rlhf {HH_FILE} (chosen and rejected answers as rows)",
        "licence: MIT (Anthropic HH-RLHF); no alpaca_eval data",
        f"command: python scripts/length_error_model.py --max-tokens {args.max_tokens} "
        f"--folds {args.folds} --trees {args.trees}",
        f"date: {datetime.now(UTC):%Y-%m-%d} (tiergate {commit()})",
        f"rows: {y.size} held-out by {args.folds}-fold cross-fitting over prompt hashes",
        f"forest: {params}",
        "kinds: log_error = quantile at probability `level` of log(true / forest median);",
        "  coverage = share of rows with true <= the forest's `level`-quantile;",
        "  forest_shape = median over rows of log(forest `level`-quantile / forest median)",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(args.out, model, header)
    load_measured.cache_clear()
    loaded = load_measured(args.out)  # what the simulator will read, checked
    print(f"wrote {args.out}: {y.size} rows")
    for level, cov, shape in zip(loaded.levels, loaded.coverage, loaded.log_shape, strict=True):
        print(f"  level {level:<5} covered {cov:.3f}  sampled log-shape {shape:+.3f}")
    median = values[:, DEFAULT_LEVELS.index(0.5)]
    print(f"  log(true / median): std {float(np.std(np.log(y / median))):.3f}")
    width = np.log(values[:, DEFAULT_LEVELS.index(0.9)] / values[:, DEFAULT_LEVELS.index(0.1)])
    p10, p50, p90 = np.percentile(width, [10, 50, 90])
    print(f"  forest width log(q0.9 / q0.1) over rows: p10 {p10:.2f}, p50 {p50:.2f}, p90 {p90:.2f}")


if __name__ == "__main__":
    main()
