"""Vidur's measured elementwise-op and CPU-overhead profiles (microsoft/vidur, MIT).

aiconfigurator times only GEMMs and attention; the per-layer norms, RoPE, SwiGLU activation and
residual add, and the engine's per-iteration CPU work, come from Vidur's profiles instead.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from priority.models import ModelShape

_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add", "emb")


@dataclass(frozen=True)
class ElementwiseProfile:
    """Median ms per call vs ``num_tokens`` for one reference model at TP 1.

    Elementwise work is proportional to tokens x width, so an op of another model is read off
    the reference curve at the *equivalent* token count ``T * width / reference_width``; this
    keeps the measured launch floor at small batches.
    """

    reference: ModelShape
    tokens: np.ndarray
    ms: dict[str, np.ndarray]

    @classmethod
    def load(cls, path: Path, reference: ModelShape) -> ElementwiseProfile:
        with path.open() as f:
            recs = [r for r in csv.DictReader(f) if r["num_tensor_parallel_workers"] == "1"]
        recs.sort(key=lambda r: int(r["num_tokens"]))
        tokens = np.array([int(r["num_tokens"]) for r in recs], dtype=np.float64)
        ms = {op: np.array([float(r[f"time_stats.{op}.median"]) for r in recs]) for op in _OPS}
        # Repeated num_tokens rows: average them so interpolation sees one value per x.
        uniq, inv = np.unique(tokens, return_inverse=True)
        ms = {op: np.bincount(inv, v) / np.bincount(inv) for op, v in ms.items()}
        return cls(reference, uniq, ms)

    def _at(self, op: str, tokens: float) -> float:
        x, y = self.tokens, self.ms[op]
        if tokens <= x[-1]:
            return float(np.interp(tokens, x, y))
        return float(y[-1] * tokens / x[-1])  # linear beyond the largest measured batch

    def layer_ms(self, model: ModelShape, tp: int, tokens: int) -> float:
        """Two RMSNorms, one residual add, RoPE on q/k, SwiGLU activation: one layer, ms."""
        ref = self.reference
        hidden = tokens * model.hidden / ref.hidden
        rope = (
            tokens
            * ((model.q_heads + model.kv_heads) * model.head_dim / tp)
            / ((ref.q_heads + ref.kv_heads) * ref.head_dim)
        )
        act = tokens * (model.ffn / tp) / ref.ffn
        return (
            self._at("input_layernorm", hidden)
            + self._at("post_attention_layernorm", hidden)
            + self._at("add", hidden)
            + self._at("attn_rope", rope)
            + self._at("mlp_act", act)
        )

    def embedding_ms(self, model: ModelShape, tokens: int) -> float:
        return self._at("emb", tokens * model.hidden / self.reference.hidden)


@dataclass(frozen=True)
class CpuOverhead:
    """Per-iteration engine CPU time (ms) as an affine function of the batch's sequences.

    Sum of the medians of ``schedule``, ``prepare_inputs_e2e``, ``process_model_outputs`` and
    ``sampler_e2e`` minus the LM-head GEMM that the profiled vLLM ran inside its sampler
    (so the composition does not count the LM head twice). Ray communication is excluded:
    single-node vLLM no longer uses Ray workers.
    """

    intercept_ms: float
    per_seq_ms: float
    measured: tuple[tuple[int, float], ...]

    @classmethod
    def load(cls, path: Path, lm_head_ms: Callable[[int], float]) -> CpuOverhead:
        """``lm_head_ms(batch)``: the profiled model's LM-head GEMM time at that batch size."""
        with path.open() as f:
            recs = list(csv.DictReader(f))
        points = []
        for r in recs:
            b = int(r["batch_size"])
            sampler = max(0.0, float(r["sampler_e2e_median"]) - lm_head_ms(b))
            total = (
                float(r["schedule_median"])
                + float(r["prepare_inputs_e2e_median"])
                + float(r["process_model_outputs_median"])
                + sampler
            )
            points.append((b, total))
        b_arr = np.array([p[0] for p in points], dtype=np.float64)
        t_arr = np.array([p[1] for p in points])
        slope, intercept = np.polyfit(b_arr, t_arr, 1)
        return cls(float(intercept), float(slope), tuple(points))

    def ms(self, num_seqs: int) -> float:
        return self.intercept_ms + self.per_seq_ms * num_seqs
