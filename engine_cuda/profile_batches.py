"""Time real forward passes on a CUDA GPU (or the CPU) and write a profile table.

    python -m engine_cuda.profile_batches --model qwen2-7b --device cuda -o qwen2-7b.csv
    python -m engine_cuda.profile_batches --model config.json --device cpu --grid small -o t.csv
    python -m priority.cli profile fit qwen2-7b.csv -o my-profile.json --hardware h100

The model, the batch grid, the timing and the CSV are :mod:`engine_common.profiling`'s (shared
with ``engine_ascend.profile_batches_npu``); this entry point picks torch's CUDA device (bf16,
synchronised wall time) when there is one, else the CPU (fp32).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_common.profiling import (
    Batch,
    Decoder,
    Device,
    Timer,
    batch_grid,
    cuda_or_cpu,
    profile,
    time_batch,
    wall_timer,
)
from engine_common.profiling import main as _profile_main

SOURCE = "engine_cuda.profile_batches"


def main(argv: Sequence[str] | None = None) -> None:
    _profile_main(
        argv,
        resolve_device=cuda_or_cpu,
        device_help="cuda or cpu (default: cuda if available)",
        source=SOURCE,
        description=(__doc__ or "").split("\n\n")[0],
    )


__all__ = [
    "SOURCE",
    "Batch",
    "Decoder",
    "Device",
    "Timer",
    "batch_grid",
    "cuda_or_cpu",
    "main",
    "profile",
    "time_batch",
    "wall_timer",
]

if __name__ == "__main__":
    main()
