"""vLLM engine limits of a deployment: KV-cache capacity from device memory and model shape."""

from __future__ import annotations

from typing import Any

from priority.models import ModelShape
from priority.profiles import EngineConfig

GIB = 1 << 30
GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``--gpu-memory-utilization``."""


def engine_config(
    model: ModelShape,
    *,
    tp: int,
    device_memory_bytes: int,
    block_size: int,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
) -> tuple[EngineConfig, dict[str, Any]]:
    """Engine limits and the arithmetic behind ``num_kv_blocks`` (for the provenance).

    KV bytes = memory * 0.9 - weights on one device. vLLM additionally reserves the peak
    activation memory it sees in its start-up profiling run (typically 1-3 GB), so a real
    deployment has somewhat fewer blocks than this upper bound.
    """
    budget = int(device_memory_bytes * GPU_MEMORY_UTILIZATION)
    weights = model.weight_bytes_per_device(tp)
    kv_bytes = budget - weights
    if kv_bytes <= 0:
        raise ValueError(f"{model.name} TP{tp} does not fit in {device_memory_bytes} bytes")
    per_token = model.kv_bytes_per_token(tp)
    tokens = kv_bytes // per_token
    blocks = tokens // block_size
    arithmetic = {
        "device_memory_bytes": device_memory_bytes,
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "weights_bytes_per_device": weights,
        "kv_cache_bytes": kv_bytes,
        "kv_bytes_per_token": per_token,
        "kv_tokens": tokens,
        "formula": (
            f"floor(({device_memory_bytes} * {GPU_MEMORY_UTILIZATION} - {weights}) / "
            f"(2*{model.layers}*{model.kv_heads}*{model.head_dim}*2/{tp} = {per_token} B/token))"
            f" = {tokens} tokens = {blocks} blocks of {block_size}"
        ),
        "caveat": "upper bound: vLLM also reserves its start-up peak activation memory",
    }
    config = EngineConfig(
        block_size=block_size,
        num_kv_blocks=blocks,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
    )
    return config, arithmetic
