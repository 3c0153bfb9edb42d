"""The package's model catalogue: decoder shapes and the size arithmetic they imply.

One :class:`ModelShape` serves both the profile derivations (weight / KV-cache bytes,
GEMM FLOPs) and the random-weight decoder that ``engine_cuda.profile_batches`` times, so
a model is described once. Presets copy the models' public Hugging Face ``config.json``
files (named in ``source``); every model is served in bf16 (2 bytes per weight and per
KV element).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

BYTES_BF16 = 2

# Fields that change what a forward pass computes but not its size or cost; left out of
# :meth:`ModelShape.describe`, which records the shape behind a latency profile.
_NUMERICS_ONLY = frozenset({"rope_theta", "rms_eps"})
# Keys every Llama/Qwen ``config.json`` has; the others have transformers defaults.
_HF_REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


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
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    source: str = ""

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], *, name: str = "") -> ModelShape:
        """Parse a Hugging Face ``config.json`` dict (Llama / Qwen2 / Qwen3 keys).

        Missing optional keys take the transformers defaults: ``num_key_value_heads`` =
        ``num_attention_heads`` (no GQA), ``head_dim`` = hidden / heads, Qwen2 has a QKV
        bias unless ``attention_bias`` says otherwise.
        """
        missing = [k for k in _HF_REQUIRED if k not in cfg]
        if missing:
            raise ValueError(f"not a decoder config.json: missing {', '.join(missing)}")
        heads = int(cfg["num_attention_heads"])
        return cls(
            name=name,
            hidden=int(cfg["hidden_size"]),
            layers=int(cfg["num_hidden_layers"]),
            q_heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            ffn=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        )

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
        """The sizing fields and parameter count, as recorded beside a latency profile."""
        data: dict[str, Any] = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NUMERICS_ONLY
        }
        data["params"] = self.params()
        return data


def _hf(name: str, repo: str, **shape: Any) -> ModelShape:
    return ModelShape(name, source=f"huggingface.co/{repo} config.json", **shape)


QWEN2_7B = _hf(
    "Qwen2-7B", "Qwen/Qwen2-7B",
    hidden=3584, layers=28, q_heads=28, kv_heads=4, head_dim=128, ffn=18944, vocab=152064,
    qkv_bias=True, rope_theta=1e6,
)  # fmt: skip
QWEN3_8B = _hf(
    "Qwen3-8B", "Qwen/Qwen3-8B",
    hidden=4096, layers=36, q_heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936,
    rope_theta=1e6,
)  # fmt: skip
QWEN3_32B = _hf(
    "Qwen3-32B", "Qwen/Qwen3-32B",
    hidden=5120, layers=64, q_heads=64, kv_heads=8, head_dim=128, ffn=25600, vocab=151936,
    rope_theta=1e6,
)  # fmt: skip
LLAMA31_8B = _hf(
    "Llama-3.1-8B", "meta-llama/Llama-3.1-8B",
    hidden=4096, layers=32, q_heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256,
    rope_theta=5e5, rms_eps=1e-5,
)  # fmt: skip
LLAMA2_70B = _hf(
    "Llama-2-70B", "meta-llama/Llama-2-70b-hf",
    hidden=8192, layers=80, q_heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=32000,
    rms_eps=1e-5,
)  # fmt: skip
# A few-KB model for tests and CPU smoke runs of the profiler.
TINY = ModelShape(
    "tiny", hidden=64, layers=2, q_heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256
)

PRESETS: dict[str, ModelShape] = {
    "tiny": TINY,
    "qwen2-7b": QWEN2_7B,
    "qwen3-8b": QWEN3_8B,
    "qwen3-32b": QWEN3_32B,
    "llama3.1-8b": LLAMA31_8B,
    "llama2-70b": LLAMA2_70B,
}


def load_model_shape(name_or_path: str | Path) -> ModelShape:
    """A preset by key (see :data:`PRESETS`) or a ``config.json`` file.

    The file is either a Hugging Face config or this class's own fields as JSON; the shape
    is named after the file unless the JSON names it (``_name_or_path`` / ``name``). Raises
    ``ValueError`` naming the presets when ``name_or_path`` is neither, or when the file
    cannot be parsed.
    """
    key = str(name_or_path)
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"unknown model {key!r}: not a preset ({', '.join(PRESETS)}) nor a config.json file"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    try:
        if "hidden_size" in data:
            return ModelShape.from_hf_config(data, name=str(data.get("_name_or_path") or path))
        return ModelShape(**{"name": str(path), **data})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
