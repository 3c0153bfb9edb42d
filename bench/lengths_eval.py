"""The length predictor against its baselines on held-out data (length bounds).

Trains the quantile regression forest on ``<name>_train.jsonl`` and scores it and three
baselines on ``<name>_test.jsonl`` (files from ``scripts/lengths_dataset.py``) at each ``q``:

* ``max-tokens``: the request's cap (what a scheduler without a predictor must assume);
* ``per-model`` (or ``per-tenant`` when rows carry tenants): empirical quantiles per group;
* ``linear-qr``: scikit-learn's ``QuantileRegressor`` at ``q`` on the forest's own features;
* ``forest``: :class:`priority.lengths.LengthPredictor`, read as the engines read it
  (``predict(...).bound(q)``).

Coverage, pinball loss, median tightness, and per-request prediction time p50/p99 (one call per
request, features included). Targets: coverage within 2 points of q, forest p99 ≤ 5 ms.

``--max-text-chars`` picks the feature layout's text bound (``none``: hash whole prompts, the
layout of models saved before the bound existed); ``--by-length`` adds the forest's numbers per
prompt-length bucket (characters), where a bound changes features only above it.

    python scripts/lengths_dataset.py --sources hh-rlhf alpaca_eval
    python bench/lengths_eval.py --datasets hh alpaca_eval

alpaca_eval is CC BY-NC 4.0: its numbers go into docs/results.md as text only; the files and
models derived from it stay under the git-ignored ``bench/out/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority.lengths.baselines import (  # noqa: E402
    GroupQuantileBaseline,
    LinearQuantileBaseline,
    max_tokens_bounder,
)
from priority.lengths.evaluate import evaluate, predictor_bounder  # noqa: E402
from priority.lengths.features import FeatureConfig  # noqa: E402
from priority.lengths.model import ForestParams  # noqa: E402
from priority.lengths.train import read_rows, train  # noqa: E402

DEFAULT_MAX_TOKENS = 2048
BUCKETS = (0, 1024, 2048, 4096)
"""Lower edges (characters) of the ``--by-length`` prompt buckets."""


def bucket_of(chars: int, edges: tuple[int, ...] = BUCKETS) -> str:
    """``"lo-hi"`` (or ``"lo+"`` for the last) of the bucket holding ``chars``."""
    lo = max(e for e in edges if e <= chars)
    later = [e for e in edges if e > lo]
    return f"{lo}-{later[0]}" if later else f"{lo}+"


def run(
    folder: Path,
    name: str,
    quantiles: list[float],
    trees: int,
    config: FeatureConfig | None = None,
    by_length: bool = False,
) -> list[dict[str, Any]]:
    """Every (method, q) result on one dataset, as JSON-able dicts (with ``by_length``, also
    the forest's per prompt-length bucket, method ``forest[lo-hi]``)."""
    config = config or FeatureConfig()
    train_rows = read_rows(folder / f"{name}_train.jsonl")
    test_rows = read_rows(folder / f"{name}_test.jsonl")
    start = time.perf_counter()
    forest = train(
        train_rows, config=config, params=ForestParams(n_estimators=trees), data_source=name
    )
    print(f"{name}: forest trained in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    key = "tenant" if any(r.features.tenant for r in train_rows) else "model"
    group = GroupQuantileBaseline(train_rows, key=key)
    results = []
    for q in quantiles:
        linear = LinearQuantileBaseline(train_rows, q, config=config)
        methods = {
            "max-tokens": max_tokens_bounder(DEFAULT_MAX_TOKENS),
            f"per-{key}": group.bounder(q),
            "linear-qr": linear.bound,
            "forest": predictor_bounder(forest, q),
        }
        for method, bounder in methods.items():
            result = evaluate(bounder, test_rows, q).to_json()
            results.append({"dataset": name, "q": q, "method": method, **result})
            print(json.dumps(results[-1]), file=sys.stderr)
        if by_length:
            buckets: dict[str, list[Any]] = {}
            for row in test_rows:
                buckets.setdefault(bucket_of(len(row.features.prompt)), []).append(row)
            for label in sorted(buckets, key=lambda b: int(b.split("-")[0].rstrip("+"))):
                result = evaluate(predictor_bounder(forest, q), buckets[label], q).to_json()
                method = f"forest[{label}]"
                results.append({"dataset": name, "q": q, "method": method, **result})
    return results


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table for docs/results.md."""
    lines = [
        "| data | q | method | rows | coverage | pinball (tokens) | tightness (median) | "
        "p50 ms | p99 ms |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['dataset']} | {r['q']} | {r['method']} | {r['rows']} | {r['coverage']:.3f} | "
            f"{r['pinball']:.1f} | {r['tightness_median']:.2f} | {r['predict_p50_ms']:.3f} | "
            f"{r['predict_p99_ms']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "bench" / "out" / "lengths")
    parser.add_argument("--datasets", nargs="+", default=["hh"])
    parser.add_argument("--quantiles", nargs="+", type=float, default=[0.9, 0.95])
    parser.add_argument("--trees", type=int, default=ForestParams().n_estimators)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "lengths_eval.json")
    parser.add_argument(
        "--max-text-chars",
        default=str(FeatureConfig().max_text_chars),
        help="prompt characters the n-grams see ('none': all; default: the new layouts')",
    )
    parser.add_argument("--by-length", action="store_true", help="forest per prompt length")
    args = parser.parse_args(argv)
    limit = None if args.max_text_chars == "none" else int(args.max_text_chars)
    config = FeatureConfig(max_text_chars=limit)
    results = [
        r
        for name in args.datasets
        for r in run(args.data, name, args.quantiles, args.trees, config, args.by_length)
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
