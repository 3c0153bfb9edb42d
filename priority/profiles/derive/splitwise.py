"""SplitwiseSim's measured batch latencies (Mutinifni/splitwise-sim ``data/perf_model.csv``, MIT).

Each configuration (model, hardware, TP, prompt size, batch size, output size) was run several
times; repeats are collapsed to their median *before* any train/held-out split so one
configuration cannot sit on both sides. Two rows per configuration:

- prefill: ``batch_size`` whole prompts of ``prompt_size`` tokens, no cache, ``prompt_time``;
- decode: ``batch_size`` requests at the mean context of the generation phase,
  ``prompt_size + token_size // 2`` (``token_time`` is the mean decode iteration).
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

from priority.profiles.table import BatchRow

Config = tuple[int, int, int]  # prompt_size, batch_size, token_size


def load_medians(
    path: Path, *, model: str, hardware: str, tp: int
) -> dict[Config, tuple[float, float]]:
    """Median (prompt_time_s, token_time_s) per configuration."""
    runs: dict[Config, list[tuple[float, float]]] = defaultdict(list)
    with path.open() as f:
        for r in csv.DictReader(f):
            if (r["model"], r["hardware"], int(r["tensor_parallel"])) != (model, hardware, tp):
                continue
            key = (int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"]))
            runs[key].append((float(r["prompt_time"]) / 1e3, float(r["token_time"]) / 1e3))
    if not runs:
        raise ValueError(f"no Splitwise rows for {model} on {hardware} TP{tp}")
    return {
        k: (statistics.median(p for p, _ in v), statistics.median(t for _, t in v))
        for k, v in sorted(runs.items())
    }


def rows(path: Path, *, model: str, hardware: str, tp: int) -> list[BatchRow]:
    """Prefill and decode rows of one (model, hardware, TP), one per distinct batch.

    Configurations that differ only in output size share their prefill batch, and ones whose
    mean decode context coincides share their decode batch: those are merged (median) too.
    """
    prefill: dict[tuple[int, int], list[float]] = defaultdict(list)
    decode: dict[tuple[int, int], list[float]] = defaultdict(list)
    for (prompt, batch, tokens), (prompt_s, token_s) in load_medians(
        path, model=model, hardware=hardware, tp=tp
    ).items():
        prefill[(prompt, batch)].append(prompt_s)
        decode[(prompt + tokens // 2, batch)].append(token_s)
    source = f"splitwise:{model}:{hardware}:tp{tp}"
    out = [
        BatchRow(((prompt, 0),) * batch, (), statistics.median(v), meta={"source": source})
        for (prompt, batch), v in sorted(prefill.items())
    ]
    out += [
        BatchRow((), (ctx,) * batch, statistics.median(v), meta={"source": source})
        for (ctx, batch), v in sorted(decode.items())
    ]
    return out
