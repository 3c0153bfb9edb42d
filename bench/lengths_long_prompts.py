"""Length prediction time against prompt length: does a long prompt still get its prediction?

The gateway predicts beside admission under a 5 ms budget (``gateway/app/kinds.py``); a
prediction later than that is dropped. Featurizing hashes the prompt's text, so its cost grows
with the prompt unless the layout bounds it (``FeatureConfig.max_text_chars``). For each prompt
length this times, one fresh request per call (no cached feature row):

* ``featurize``: ``Featurizer.transform`` of the one request;
* ``predict``: ``apredict_with_budget`` as the gateway awaits it (pool hop, featurize, tree
  walk, quantiles), with a budget long enough never to fall back;

and prints p50 / p90 in ms and the share over the 5 ms budget. Prompts are realistic text: HH-RLHF
prompts (MIT; ``scripts/lengths_dataset.py`` writes them) concatenated to the length. The forest
is trained on ``hh_train.jsonl`` with the layout under test.

    python scripts/lengths_dataset.py --sources hh-rlhf
    python bench/lengths_long_prompts.py --max-text-chars none 4096
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority.lengths.distribution import LengthDistribution  # noqa: E402
from priority.lengths.features import FeatureConfig, Featurizer, RequestFeatures  # noqa: E402
from priority.lengths.model import ForestParams  # noqa: E402
from priority.lengths.serving import PredictorHandle, apredict_with_budget  # noqa: E402
from priority.lengths.train import read_rows, train  # noqa: E402

LENGTHS = (400, 2_000, 8_000, 32_000, 128_000, 512_000)
BUDGET_S = 0.005


def text_of(prompts: list[str], chars: int) -> str:
    """The prompts joined (and repeated if need be) to exactly ``chars`` characters."""
    out: list[str] = []
    size = 0
    while size < chars:
        for p in prompts:
            out.append(p)
            size += len(p) + 1
            if size >= chars:
                break
    return "\n".join(out)[:chars]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def time_predict(handle: PredictorHandle, request: RequestFeatures) -> float:
    """Seconds of one ``apredict_with_budget`` as the gateway awaits it (never falls back)."""
    fallback = LengthDistribution(levels=(0.5,), values=(1.0,), max_tokens=None)
    start = time.perf_counter()
    result = await apredict_with_budget(handle, request, 10.0, fallback)
    elapsed = time.perf_counter() - start
    assert result is not fallback
    return elapsed


def time_featurize(featurizer: Featurizer, request: RequestFeatures) -> float:
    start = time.perf_counter()
    featurizer.transform([request])
    return time.perf_counter() - start


async def measure(
    layouts: dict[str, tuple[Featurizer, PredictorHandle]],
    texts: dict[int, str],
    runs: int,
) -> dict[tuple[str, int], tuple[list[float], list[float]]]:
    """Round-robin over layouts and lengths, one call each per round, so that the machine's
    drift (other jobs) spreads over every cell instead of landing on a few."""
    cells: dict[tuple[str, int], tuple[list[float], list[float]]] = {
        (name, chars): ([], []) for name in layouts for chars in texts
    }
    for i in range(runs + 3):  # the first 3 rounds warm up
        for name, (featurizer, handle) in layouts.items():
            for chars, text in texts.items():
                # a fresh request each call: no feature row kept from an earlier one
                fresh = RequestFeatures(prompt=text, model="hh-rlhf-2022", max_tokens=2048 + i)
                feat = time_featurize(featurizer, fresh)
                fresh = RequestFeatures(prompt=text, model="hh-rlhf-2022", max_tokens=2048 + i)
                pred = await time_predict(handle, fresh)
                if i >= 3:
                    cells[(name, chars)][0].append(feat)
                    cells[(name, chars)][1].append(pred)
    return cells


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "bench" / "out" / "lengths")
    parser.add_argument(
        "--max-text-chars", nargs="+", default=["none"], help="layouts to time ('none': all)"
    )
    parser.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    parser.add_argument("--runs", type=int, default=31)
    parser.add_argument("--trees", type=int, default=ForestParams().n_estimators)
    args = parser.parse_args(argv)
    rows = read_rows(args.data / "hh_train.jsonl")
    prompts = [r.features.prompt for r in rows]
    layouts = {}
    for name in args.max_text_chars:
        config = FeatureConfig(max_text_chars=None if name == "none" else int(name))
        forest = train(rows, config=config, params=ForestParams(n_estimators=args.trees))
        layouts[name] = (Featurizer(config), PredictorHandle(forest))
    texts = {chars: text_of(prompts, chars) for chars in args.lengths}
    load = Path("/proc/loadavg").read_text().split()[:3]
    cells = asyncio.run(measure(layouts, texts, args.runs))
    print(
        f"# {args.runs} calls a cell; load average before {load}, after "
        f"{Path('/proc/loadavg').read_text().split()[:3]}"
    )
    print(
        "| max_text_chars | prompt chars | featurize p50 ms | p90 | predict p50 ms | p90 | > 5 ms |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (name, chars), (feat, pred) in cells.items():
        over = sum(t > BUDGET_S for t in pred) / len(pred)
        print(
            f"| {name} | {chars:,} | {statistics.median(feat) * 1e3:.2f} | "
            f"{percentile(feat, 0.9) * 1e3:.2f} | {statistics.median(pred) * 1e3:.2f} | "
            f"{percentile(pred, 0.9) * 1e3:.2f} | {over:.0%} |"
        )


if __name__ == "__main__":
    main()
