"""Re-export of :mod:`priority.models` for build scripts that import shapes from here.

The shapes live in :mod:`priority.models` (one catalogue for the derivations and the
CUDA profiler); import from there in new code.
"""

from priority.models import (
    BYTES_BF16,
    LLAMA2_70B,
    LLAMA31_8B,
    QWEN2_7B,
    QWEN3_8B,
    QWEN3_32B,
    ModelShape,
)

__all__ = [
    "BYTES_BF16",
    "LLAMA2_70B",
    "LLAMA31_8B",
    "QWEN2_7B",
    "QWEN3_8B",
    "QWEN3_32B",
    "ModelShape",
]
