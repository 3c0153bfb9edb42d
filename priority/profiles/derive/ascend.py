"""Roofline step-time model of an Ascend 910B deployment, calibrated on public serving results.

There are no per-batch 910B measurements in the public data, only end-to-end vllm-ascend
serving results. So each operator costs ``max(FLOPs / (peak * eff_compute), bytes / (HBM_bw *
eff_memory))``; all-reduces cost ``alpha + 2 (p-1)/p * bytes / (HCCS bus bandwidth)``; every
layer pays a fixed ``layer_overhead_s`` (operator dispatch, small-kernel latency on the NPU)
and every step pays the engine's CPU time (the same affine model as the GPU profiles). Two
numbers are calibrated on measurements instead of assumed:

- ``eff_compute`` from a prefill-bound run (Qwen3-8B, 100 x 32k-token prompts; GPUStack),
- ``layer_overhead_s`` from the TPOT of a decode-bound run (concurrency 1 or 4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from priority.models import BYTES_BF16, ModelShape


@dataclass(frozen=True)
class AscendSpec:
    """Public specification numbers of one Ascend 910B NPU (see provenance for sources)."""

    peak_flops: float = 313e12
    """Dense FP16/BF16 FLOP/s of the 910B3 (the 64 GB part used in Atlas 800T A2)."""
    hbm_bytes_per_s: float = 1.6e12
    memory_bytes: int = 64 * (1 << 30)
    hccs_link_bytes_per_s: float = 56e9
    """One HCCS link, per direction; Atlas 800T A2 connects its 8 NPUs as a full mesh."""
    eff_memory: float = 0.8
    eff_comm: float = 0.7
    allreduce_latency_s: float = 20e-6


@dataclass(frozen=True)
class AscendModel:
    model: ModelShape
    tp: int
    spec: AscendSpec
    eff_compute: float
    layer_overhead_s: float
    cpu_ms: Callable[[int], float]
    """Per-step engine CPU time in ms for a batch of that many sequences."""

    def _op(self, flops: float, nbytes: float) -> float:
        s = self.spec
        return max(
            flops / (s.peak_flops * self.eff_compute), nbytes / (s.hbm_bytes_per_s * s.eff_memory)
        )

    def _gemm(self, m: int, n: int, k: int) -> float:
        return self._op(2.0 * m * n * k, BYTES_BF16 * (n * k + m * (n + k)))

    def breakdown_s(
        self, prefill: Sequence[tuple[int, int]], decode_kv: Sequence[int]
    ) -> dict[str, float]:
        m, tp, s = self.model, self.tp, self.spec
        tokens = sum(q for q, _ in prefill) + len(decode_kv)
        seqs = len(prefill) + len(decode_kv)
        q_local, kv_local = m.q_heads // tp, m.kv_heads // tp
        kv_token_bytes = 2 * kv_local * m.head_dim * BYTES_BF16  # one layer
        linear = (
            self._gemm(tokens, (m.q_dim + 2 * m.kv_dim) // tp, m.hidden)
            + self._gemm(tokens, m.hidden, m.q_dim // tp)
            + self._gemm(tokens, 2 * m.ffn // tp, m.hidden)
            + self._gemm(tokens, m.hidden, m.ffn // tp)
        )
        attn = 0.0
        for l_q, l_kv in prefill:
            ctx = l_kv + (l_q + 1) / 2  # mean keys per causal query
            attn += self._op(4.0 * l_q * ctx * q_local * m.head_dim, (l_kv + l_q) * kv_token_bytes)
        if decode_kv:
            attn += self._op(
                4.0 * sum(decode_kv) * q_local * m.head_dim, sum(decode_kv) * kv_token_bytes
            )
        # Norms, residual adds, RoPE, SwiGLU: read+write of the activations they touch.
        width = 6 * m.hidden + 3 * m.ffn // tp + 2 * (q_local + kv_local) * m.head_dim
        elementwise = self._op(0.0, tokens * width * BYTES_BF16)
        comm = 0.0
        if tp > 1:
            bus = s.eff_comm * s.hccs_link_bytes_per_s * (tp - 1)
            nbytes = tokens * m.hidden * BYTES_BF16
            comm = 2 * (s.allreduce_latency_s + 2 * (tp - 1) / tp * nbytes / bus)
        return {
            "linear": m.layers * linear,
            "attention": m.layers * attn,
            "elementwise": m.layers * elementwise,
            "allreduce": m.layers * comm,
            "layer_overhead": m.layers * self.layer_overhead_s,
            "lm_head": self._gemm(seqs, m.vocab // tp, m.hidden),
            "cpu": self.cpu_ms(seqs) / 1e3,
        }

    def batch_time_s(self, prefill: Sequence[tuple[int, int]], decode_kv: Sequence[int]) -> float:
        return sum(self.breakdown_s(prefill, decode_kv).values())

    def prefill_prompt_s(self, prompt: int, chunk: int) -> float:
        """Whole prompt prefilled alone in chunks of ``chunk`` tokens."""
        total, done = 0.0, 0
        while done < prompt:
            q = min(chunk, prompt - done)
            total += self.batch_time_s([(q, done)], [])
            done += q
        return total


def _bisect(f: Callable[[float], float], lo: float, hi: float, iters: int = 100) -> float:
    """Root of a monotone ``f`` on [lo, hi] (f(lo), f(hi) of opposite signs)."""
    f_lo = f(lo)
    if f_lo * f(hi) > 0:
        raise ValueError("calibration target is outside the model's range")
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if (f(mid) > 0) == (f_lo > 0):
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def calibrate_eff_compute(
    base: AscendModel, *, prompt: int, requests: int, outputs: int, duration_s: float, chunk: int
) -> float:
    """Compute efficiency that makes ``requests`` long prefills + their decodes last ``duration_s``.

    The engine is assumed busy throughout (all requests sent at once): duration = all prompts'
    chunked prefills + each output token's marginal decode cost (its attention over the long
    context and its share of the per-sequence CPU time).
    """

    def predicted(eff: float) -> float:
        mdl = replace(base, eff_compute=eff)
        ctx = prompt + outputs // 2
        decode_marginal = mdl.batch_time_s([], [ctx]) - mdl.batch_time_s([], [])
        return requests * (mdl.prefill_prompt_s(prompt, chunk) + outputs * decode_marginal)

    return _bisect(lambda e: predicted(e) - duration_s, 0.01, 1.0)


def calibrate_layer_overhead(
    base: AscendModel, *, concurrency: int, context: int, tpot_s: float
) -> float:
    """Per-layer fixed time that makes a decode step of ``concurrency`` requests last ``tpot_s``."""
    mdl = replace(base, layer_overhead_s=0.0)
    rest = mdl.batch_time_s([], [context] * concurrency)
    if rest >= tpot_s:
        raise ValueError(f"model without overhead ({rest:.4f}s) already exceeds TPOT {tpot_s}s")
    return (tpot_s - rest) / base.model.layers
