"""Profile one model on a CUDA device in one process: the full grid, two seeded random grids
(one to fit, one held out) and a repeat of part of the full grid (run-to-run noise), each CSV
written as soon as it is timed.

    python3 scripts/profile_h100.py --model llama3.1-8b --out DIR

One process builds the model once (an 8B model's random weights take a minute to make); the
per-grid CLI is ``python -m engine_cuda.profile_batches``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from engine_common.profiling import Decoder, batch_grid, cuda_or_cpu, time_batch
from priority.models import load_model_shape
from priority.profiles.table import BatchRow, write_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--random-count", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cuda-graphs", action="store_true", help="time CUDA-graph replays")
    args = parser.parse_args()

    import torch

    dev = cuda_or_cpu(None)
    cfg = load_model_shape(args.model)
    t0 = time.perf_counter()
    model = Decoder(cfg, dev.spec, torch.bfloat16)
    print(f"built {args.model} on {dev.name} in {time.perf_counter() - t0:.0f}s", flush=True)
    meta = {
        "source": "engine_cuda.profile_batches",
        "device": dev.name,
        "dtype": "bfloat16",
        "model": args.model,
        "torch": torch.__version__,
    }
    full = batch_grid("full")
    grids = {
        "full": full,
        "random": batch_grid("random", count=args.random_count, seed=1),
        "heldout": batch_grid("random", count=args.random_count, seed=2),
        "repeat": full[::4],
    }
    stem = args.model.replace("/", "_")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, grid in grids.items():
        t0 = time.perf_counter()
        rows = [
            BatchRow(
                b[0],
                b[1],
                time_batch(
                    model,
                    b,
                    warmup=args.warmup,
                    repeats=args.repeats,
                    timer=dev.timer,
                    cuda_graph=args.cuda_graphs,
                ),
                meta={**meta, "grid": name, "cuda_graphs": str(args.cuda_graphs).lower()},
            )
            for b in grid
        ]
        write_rows(args.out / f"{stem}-{name}.csv", rows)
        print(f"{name}: {len(rows)} rows in {time.perf_counter() - t0:.0f}s", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
