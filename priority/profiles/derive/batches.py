"""The grid of batch compositions every derived profile is evaluated on.

Pure prefill (whole prompts and chunks over a cached prefix, one to four per batch), pure
decode (uniform and mixed context lengths) and mixed chunked-prefill + decode batches, within
the engine's token budget and sequence limit: the shapes a vLLM scheduler actually runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from priority.profiles.table import BatchRow

Batch = tuple[tuple[tuple[int, int], ...], tuple[int, ...]]
"""(prefill chunks (l_q, l_kv), decode l_kv) of one batch."""

_LQ = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_LKV = (0, 512, 2048, 4096, 8192)
_DEC_B = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_DEC_KV = (128, 512, 1024, 2048, 4096, 8192)


def batch_grid(
    *,
    max_tokens: int = 8192,
    max_seqs: int = 256,
    max_kv: int = 8192,
    random_batches: int = 200,
    seed: int = 0,
) -> list[Batch]:
    """Structured sweep plus ``random_batches`` random heterogeneous batches (seeded)."""
    grid: list[Batch] = []
    for l_q in _LQ:
        for l_kv in _LKV:
            if l_q <= max_tokens and l_kv <= max_kv:
                grid.append((((l_q, l_kv),), ()))
    for b in _DEC_B:
        for kv in _DEC_KV:
            if b <= max_seqs and kv <= max_kv:
                grid.append(((), (kv,) * b))
    rng = np.random.default_rng(seed)
    for _ in range(random_batches):
        kind = int(rng.integers(3))
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        if kind != 1:  # some prefill
            for _ in range(int(rng.integers(1, 5))):
                prefill.append((int(rng.choice(_LQ[:-1])), int(rng.choice(_LKV))))
        if kind != 0:  # some decodes
            n = int(rng.choice(_DEC_B))
            decode = [int(v) for v in rng.integers(16, max_kv, size=n)]
        budget = max_tokens - len(decode)
        while prefill and sum(q for q, _ in prefill) > budget:
            prefill.pop()
        decode = decode[: max_seqs - len(prefill)]
        if prefill or decode:
            grid.append((tuple(prefill), tuple(decode)))
    return grid


def rows_from(
    batch_time_s: Callable[[Sequence[tuple[int, int]], Sequence[int]], float],
    grid: Sequence[Batch],
    *,
    source: str,
) -> list[BatchRow]:
    """Time every batch of ``grid`` with a composed/derived model and tag the rows."""
    return [
        BatchRow(prefill, decode, batch_time_s(prefill, decode), meta={"source": source})
        for prefill, decode in grid
    ]
