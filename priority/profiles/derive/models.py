"""Decoder-only transformer shapes and the arithmetic every derivation shares.

Shapes are copied from the models' public Hugging Face ``config.json`` files (named in
:data:`MODELS`); all models are served in bf16 (2 bytes per weight and per KV element).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

BYTES_BF16 = 2


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Llama/Qwen-style decoder: RMSNorm, RoPE, GQA attention, SwiGLU MLP, untied LM head."""

    name: str
    hidden: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    qkv_bias: bool = False
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Weights of one decoder layer (projections, MLP, norms, QKV bias if any)."""
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return attn + bias + 3 * self.hidden * self.ffn + 2 * self.hidden

    def params(self) -> int:
        """All weights: layers + input embedding + LM head (untied) + final norm."""
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden + self.hidden

    def weight_bytes_per_device(self, tp: int) -> int:
        """bf16 weight bytes on one device under tensor parallelism (norms replicated)."""
        return BYTES_BF16 * self.params() // tp

    def kv_bytes_per_token(self, tp: int) -> int:
        """KV-cache bytes per token on one device: 2 (K and V) * layers * kv_heads * d * 2 / TP."""
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES_BF16 // tp

    def linear_flops_per_token(self) -> int:
        """FLOPs of the per-layer GEMMs for one token, all layers (2 FLOPs per MAC)."""
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        return 2 * self.layers * (attn + 3 * self.hidden * self.ffn)

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["params"] = self.params()
        return data


QWEN2_7B = ModelShape(
    "Qwen2-7B",
    hidden=3584,
    layers=28,
    q_heads=28,
    kv_heads=4,
    head_dim=128,
    ffn=18944,
    vocab=152064,
    qkv_bias=True,
    source="huggingface.co/Qwen/Qwen2-7B config.json",
)
QWEN3_32B = ModelShape(
    "Qwen3-32B",
    hidden=5120,
    layers=64,
    q_heads=64,
    kv_heads=8,
    head_dim=128,
    ffn=25600,
    vocab=151936,
    source="huggingface.co/Qwen/Qwen3-32B config.json",
)
QWEN3_8B = ModelShape(
    "Qwen3-8B",
    hidden=4096,
    layers=36,
    q_heads=32,
    kv_heads=8,
    head_dim=128,
    ffn=12288,
    vocab=151936,
    source="huggingface.co/Qwen/Qwen3-8B config.json",
)
LLAMA31_8B = ModelShape(
    "Llama-3.1-8B",
    hidden=4096,
    layers=32,
    q_heads=32,
    kv_heads=8,
    head_dim=128,
    ffn=14336,
    vocab=128256,
    source="huggingface.co/meta-llama/Llama-3.1-8B config.json",
)
LLAMA2_70B = ModelShape(
    "Llama-2-70B",
    hidden=8192,
    layers=80,
    q_heads=64,
    kv_heads=8,
    head_dim=128,
    ffn=28672,
    vocab=32000,
    source="huggingface.co/meta-llama/Llama-2-70b-hf config.json",
)

MODELS = {m.name: m for m in (QWEN2_7B, QWEN3_32B, QWEN3_8B, LLAMA31_8B, LLAMA2_70B)}
