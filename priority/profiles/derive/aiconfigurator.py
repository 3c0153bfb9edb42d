"""Compose whole-batch forward-pass times from NVIDIA aiconfigurator's per-kernel tables.

aiconfigurator (ai-dynamo/aiconfigurator, Apache-2.0) measured, under vLLM, the GPU time of
single bf16 GEMMs and of FlashAttention prefill ("context") and decode ("generation") calls for
one layer on one GPU. A batch's step time is composed as

    layers x [QKV GEMM + attention + O GEMM + gate_up GEMM + down GEMM
              + elementwise ops (Vidur) + 2 all-reduces (TP > 1, derived, not measured)]
    + LM head GEMM over the batch's sequences + embedding (Vidur) + engine CPU time (Vidur)

Interpolation: GEMMs are linear in each of m, n, k between grid points (GEMM time is affine
in each dimension whether memory- or compute-bound); GEMMs beyond the grid are split into
grid-sized column/row blocks (a valid way to compute them). Attention:

- A prefill chunk of ``l_q`` tokens over ``l_kv`` cached ones does the work of a causal
  prompt of ``l_kv + l_q`` tokens minus that of one of ``l_kv`` tokens, so its time is
  ``ctx(l_kv + l_q) - ctx(l_kv) + ctx(1)`` (batch 1; ``ctx(1)`` keeps one launch's fixed
  cost, which the difference cancels). Beyond the measured 16k, ``ctx`` grows quadratically.
- The decode requests of a batch run as one call over ``S`` sequences at their mean context;
  where ``S`` x context exceeds what was measured, the largest measured batch is scaled
  linearly in ``S`` (decode attention is bandwidth-bound there: time ~ KV bytes read).
- Head counts not in the table (Qwen2-7B's 28 query heads) are interpolated linearly in the
  number of query heads between neighbours with the same KV heads.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.interpolate import RegularGridInterpolator

from priority.models import BYTES_BF16, ModelShape
from priority.profiles.derive.vidur import CpuOverhead, ElementwiseProfile


def _read_parquet(path: Path) -> dict[str, list[Any]]:
    import pyarrow.parquet as pq  # build-time dependency only

    table: dict[str, list[Any]] = pq.read_table(path).to_pydict()
    return table


class GemmTable:
    """bf16 GEMM latency (ms) over the measured (m, n, k) grid."""

    def __init__(self, path: Path) -> None:
        data = _read_parquet(path)
        sums: dict[tuple[int, int, int], list[float]] = defaultdict(list)
        for m, n, k, dtype, lat in zip(
            data["m"], data["n"], data["k"], data["gemm_dtype"], data["latency"], strict=True
        ):
            if dtype == "bfloat16":
                sums[(m, n, k)].append(lat)
        self.m = np.array(sorted({p[0] for p in sums}), dtype=np.float64)
        self.n = np.array(sorted({p[1] for p in sums}), dtype=np.float64)
        self.k = np.array(sorted({p[2] for p in sums}), dtype=np.float64)
        grid = np.full((len(self.m), len(self.n), len(self.k)), np.nan)
        index = [{int(v): i for i, v in enumerate(ax)} for ax in (self.m, self.n, self.k)]
        for (m, n, k), lats in sums.items():
            grid[index[0][m], index[1][n], index[2][k]] = float(np.mean(lats))
        self.device = str(data["device"][0])
        self.version = str(data["version"][0])
        self.kernels = sorted(
            {
                s
                for s, d in zip(data["kernel_source"], data["gemm_dtype"], strict=True)
                if d == "bfloat16"
            }
        )
        self._interp = RegularGridInterpolator((self.m, self.n, self.k), grid)
        # Largest n usable for every k we query without touching the unmeasured corner.
        self._n_max = float(self.n[-2]) if np.isnan(grid[:, -1, -1]).any() else float(self.n[-1])

    def ms(self, m: int, n: int, k: int) -> float:
        """Latency of Y[m,n] = X[m,k] W[n,k]^T, splitting shapes beyond the grid into blocks."""
        if m < 1 or n < 1 or k < 1:
            return 0.0
        if m > self.m[-1]:
            full, rest = divmod(m, int(self.m[-1]))
            return full * self.ms(int(self.m[-1]), n, k) + self.ms(rest, n, k)
        n_max = int(self._n_max if k > self.k[-2] else self.n[-1])
        if n > n_max:
            full, rest = divmod(n, n_max)
            return full * self.ms(m, n_max, k) + self.ms(m, rest, k)
        if k > self.k[-1]:
            full, rest = divmod(k, int(self.k[-1]))
            return full * self.ms(m, n, int(self.k[-1])) + self.ms(m, n, rest)
        point = (max(m, self.m[0]), max(n, self.n[0]), max(k, self.k[0]))
        value = float(self._interp(np.array([point], dtype=np.float64))[0])
        if math.isnan(value):
            raise ValueError(f"GEMM ({m}, {n}, {k}) needs an unmeasured grid point")
        return value


@dataclass
class _Grid2D:
    """Latency (ms) over (batch, length) for one head configuration; sparse at large sizes."""

    points: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def add(self, batch: int, length: int, ms: float) -> None:
        xs, ys = self.points.get(batch, (np.array([]), np.array([])))
        self.points[batch] = (np.append(xs, length), np.append(ys, ms))

    def finish(self) -> None:
        for b, (xs, ys) in self.points.items():
            uniq, inv = np.unique(xs, return_inverse=True)
            self.points[b] = (uniq, np.bincount(inv, ys) / np.bincount(inv))

    def along_length(self, batch: int, length: float) -> float | None:
        """Value at ``length`` for a measured batch, or None if beyond its measured range."""
        xs, ys = self.points[batch]
        if length > xs[-1]:
            return None
        return float(np.interp(length, xs, ys))


class AttentionTable:
    """FlashAttention prefill/decode latency for head_dim 128, bf16 KV, full attention."""

    def __init__(self, context: Path, generation: Path) -> None:
        self.context = self._load(context, "isl")
        self.generation = self._load(generation, "step")
        ctx = _read_parquet(context)
        self.kernels = sorted(set(ctx["kernel_source"]))
        self.device = str(ctx["device"][0])

    @staticmethod
    def _load(path: Path, length_col: str) -> dict[tuple[int, int], _Grid2D]:
        data = _read_parquet(path)
        n = len(data["latency"])
        window = data.get("window_size", [0] * n)
        grids: dict[tuple[int, int], _Grid2D] = defaultdict(_Grid2D)
        for i in range(n):
            if data["head_dim"][i] != 128 or data["kv_cache_dtype"][i] != "bfloat16":
                continue
            if window[i] != 0:
                continue
            key = (data["num_heads"][i], data["num_key_value_heads"][i])
            grids[key].add(data["batch_size"][i], data[length_col][i], data["latency"][i])
        for g in grids.values():
            g.finish()
        return dict(grids)

    def _heads(
        self, table: dict[tuple[int, int], _Grid2D], q: int, kv: int
    ) -> list[tuple[float, _Grid2D]]:
        """Weighted grids interpolating linearly in query heads at fixed KV heads."""
        if (q, kv) in table:
            return [(1.0, table[(q, kv)])]
        qs = sorted(h for h, k in table if k == kv)
        lo = max((h for h in qs if h < q), default=None)
        hi = min((h for h in qs if h > q), default=None)
        if lo is None or hi is None:
            raise ValueError(f"no attention profile brackets {q} query / {kv} KV heads")
        w = (q - lo) / (hi - lo)
        return [(1.0 - w, table[(lo, kv)]), (w, table[(hi, kv)])]

    def prefill_ms(self, q: int, kv: int, l_q: int, l_kv: int) -> float:
        """One prefill chunk (batch 1), from the difference of two causal prompts."""
        total = 0.0
        for w, grid in self._heads(self.context, q, kv):
            total += w * (
                self._causal(grid, l_kv + l_q)
                - self._causal(grid, l_kv)
                + (self._causal(grid, 1) if l_kv else 0.0)
            )
        return total

    @staticmethod
    def _causal(grid: _Grid2D, length: int) -> float:
        if length <= 0:
            return 0.0
        xs, ys = grid.points[1]
        if length > xs[-1]:
            return float(ys[-1] * (length / xs[-1]) ** 2)
        return float(np.interp(length, xs, ys))

    def decode_ms(self, q: int, kv: int, num_seqs: int, mean_kv: float) -> float:
        """One decode attention call over ``num_seqs`` sequences at mean context ``mean_kv``."""
        if num_seqs == 0:
            return 0.0
        total = 0.0
        for w, grid in self._heads(self.generation, q, kv):
            batches = sorted(grid.points)
            usable = [(b, v) for b in batches if (v := grid.along_length(b, mean_kv)) is not None]
            if not usable:
                raise ValueError(f"no decode-attention measurement at context {mean_kv}")
            bs = np.array([b for b, _ in usable], dtype=np.float64)
            vs = np.array([v for _, v in usable])
            if num_seqs <= bs[-1]:
                total += w * float(np.interp(num_seqs, bs, vs))
            else:
                total += w * float(vs[-1] * num_seqs / bs[-1])
        return total


@dataclass(frozen=True)
class AllReduce:
    """Ring all-reduce time model over NVLink: ``alpha + 2 (p-1)/p * bytes / bus_bw``.

    Not measured: aiconfigurator's tables here hold no communication, so this is derived from
    the interconnect's specified bandwidth times an efficiency factor (see provenance).
    """

    latency_s: float
    bus_bytes_per_s: float

    def seconds(self, tp: int, nbytes: int) -> float:
        if tp <= 1:
            return 0.0
        return self.latency_s + 2 * (tp - 1) / tp * nbytes / self.bus_bytes_per_s


@dataclass
class ForwardComposer:
    """Step time (seconds) of a batch for one (GPU, model, TP) from measured kernels."""

    model: ModelShape
    tp: int
    gemm: GemmTable
    attention: AttentionTable
    elementwise: ElementwiseProfile
    cpu: CpuOverhead
    allreduce: AllReduce | None = None

    def __post_init__(self) -> None:
        m, tp = self.model, self.tp
        if m.q_heads % tp or m.kv_heads % tp:
            raise ValueError(f"TP {tp} does not divide the heads of {m.name}")
        self.q_local = m.q_heads // tp
        self.kv_local = m.kv_heads // tp

    def layer_linear_ms(self, tokens: int) -> float:
        m, tp, g = self.model, self.tp, self.gemm
        return (
            g.ms(tokens, (m.q_dim + 2 * m.kv_dim) // tp, m.hidden)
            + g.ms(tokens, m.hidden, m.q_dim // tp)
            + g.ms(tokens, 2 * m.ffn // tp, m.hidden)
            + g.ms(tokens, m.hidden, m.ffn // tp)
        )

    def breakdown_ms(
        self, prefill: Sequence[tuple[int, int]], decode_kv: Sequence[int]
    ) -> dict[str, float]:
        """Per-component milliseconds of one step (for provenance and sanity checks)."""
        m = self.model
        tokens = sum(q for q, _ in prefill) + len(decode_kv)
        seqs = len(prefill) + len(decode_kv)
        attn = sum(
            self.attention.prefill_ms(self.q_local, self.kv_local, q, kv) for q, kv in prefill
        )
        if decode_kv:
            attn += self.attention.decode_ms(
                self.q_local, self.kv_local, len(decode_kv), float(np.mean(decode_kv))
            )
        comm_s = 0.0
        if self.allreduce is not None:
            comm_s = 2 * self.allreduce.seconds(self.tp, tokens * m.hidden * BYTES_BF16)
        return {
            "linear": m.layers * self.layer_linear_ms(tokens),
            "attention": m.layers * attn,
            "elementwise": m.layers * self.elementwise.layer_ms(m, self.tp, tokens),
            "allreduce": m.layers * comm_s * 1e3,
            "lm_head": self.gemm.ms(seqs, m.vocab // self.tp, m.hidden),
            "embedding": self.elementwise.embedding_ms(m, tokens),
            "cpu": self.cpu.ms(seqs),
        }

    def batch_time_s(self, prefill: Sequence[tuple[int, int]], decode_kv: Sequence[int]) -> float:
        return sum(self.breakdown_ms(prefill, decode_kv).values()) / 1e3


def load_tables(root: Path, gpu: str, version: str) -> tuple[GemmTable, AttentionTable]:
    """Tables under ``profiles/aiconfigurator/<gpu>/{gemm,attention}/vllm/<version>/``."""
    gemm = GemmTable(root / gpu / "gemm" / "vllm" / version / "gemm_perf.parquet")
    attn_dir = root / gpu / "attention" / "vllm" / version
    attention = AttentionTable(
        attn_dir / "context_attention_perf.parquet",
        attn_dir / "generation_attention_perf.parquet",
    )
    return gemm, attention
