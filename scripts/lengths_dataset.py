"""Turn the public length data into the predictor's JSONL (``prompt``, ``output_tokens``, ...).

Sources (``../shared/data/lengths/``, see its README):

* ``hh-rlhf`` (Anthropic HH-RLHF harmless-base test split, **MIT**): prompt = the transcript up
  to the last ``"\\n\\nAssistant:"``, output = the text after it; both the ``chosen`` and the
  ``rejected`` continuation are rows (two samples of one prompt's length distribution), model
  ``hh-rlhf-2022``.
* ``alpaca_eval`` (**CC BY-NC 4.0: evaluation only**): 805 instructions answered by three models
  of different verbosity; model = the generator's name. Files derived from it are written only
  under the (git-ignored) output folder and must never be committed or shipped.

Token counts use the ~4-characters-per-token stand-in (:func:`priority.lengths.features.
approx_tokens`, the gateway's own rule): no real tokenizer's vocabulary is available offline
here (``tiktoken``/``transformers`` download theirs). Outputs longer than ``--max-tokens`` are
cut to it, as a server with that cap would; every row carries ``max_tokens``.

Rows are split into train/test by a hash of the prompt (the same prompt never lands on both
sides), ``--test-share`` of prompts held out.

    python scripts/lengths_dataset.py --out bench/out/lengths
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority.lengths.features import approx_tokens  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "lengths"
HH_FILE = "hh-rlhf/harmless-base/test.jsonl.gz"
ALPACA_MODELS = ("gpt4_0613", "Mixtral-8x7B-Instruct-v0.1", "Meta-Llama-3-70B-Instruct")
MARKER = "\n\nAssistant:"


def split_of(prompt: str, test_share: float) -> str:
    """``"test"`` for a stable ``test_share`` of prompts (by SHA-256), else ``"train"``."""
    h = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big")
    return "test" if h / 2**64 < test_share else "train"


def row(prompt: str, output: str, model: str, max_tokens: int) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "output_tokens": min(approx_tokens(output.strip()), max_tokens),
        "model": model,
        "prompt_tokens": approx_tokens(prompt),
        "max_tokens": max_tokens,
    }


def hh_rows(data: Path, max_tokens: int) -> Iterator[dict[str, Any]]:
    with gzip.open(data / HH_FILE, "rt", encoding="utf-8") as fh:
        for line in fh:
            obj = json.loads(line)
            for key in ("chosen", "rejected"):
                text = obj[key]
                cut = text.rfind(MARKER)
                if cut < 0:
                    continue
                prompt = text[: cut + len(MARKER)]
                output = text[cut + len(MARKER) :]
                if output.strip():
                    yield row(prompt, output, "hh-rlhf-2022", max_tokens)


def alpaca_rows(data: Path, max_tokens: int) -> Iterator[dict[str, Any]]:
    for model in ALPACA_MODELS:
        items = json.loads((data / "alpaca_eval" / model / "model_outputs.json").read_text())
        for item in items:
            if item["output"].strip():
                yield row(item["instruction"], item["output"], model, max_tokens)


def write(rows: Iterator[dict[str, Any]], out: Path, name: str, test_share: float) -> None:
    files = {s: (out / f"{name}_{s}.jsonl").open("w", encoding="utf-8") for s in ("train", "test")}
    counts = dict.fromkeys(files, 0)
    try:
        for r in rows:
            split = split_of(r["prompt"], test_share)
            files[split].write(json.dumps(r, ensure_ascii=False) + "\n")
            counts[split] += 1
    finally:
        for fh in files.values():
            fh.close()
    print(f"{name}: {counts['train']} train, {counts['test']} test rows in {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="shared/data/lengths folder")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "lengths")
    parser.add_argument("--max-tokens", type=int, default=2048, help="cap of every request")
    parser.add_argument("--test-share", type=float, default=0.2)
    parser.add_argument(
        "--sources", nargs="+", choices=("hh-rlhf", "alpaca_eval"), default=["hh-rlhf"]
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if "hh-rlhf" in args.sources:
        write(hh_rows(args.data, args.max_tokens), args.out, "hh", args.test_share)
    if "alpaca_eval" in args.sources:
        print("alpaca_eval is CC BY-NC 4.0: evaluation only, never commit these files")
        write(alpaca_rows(args.data, args.max_tokens), args.out, "alpaca_eval", args.test_share)


if __name__ == "__main__":
    main()
