"""vLLM plugin for NVIDIA GPUs: entry points only, the logic is shared in :mod:`engine_common`.

``scheduler.TiergateScheduler`` (``--scheduler-cls``, default profile ``h100-llama3.1-8b``),
``metrics.TiergateStatLogger`` (vLLM's stat-logger entry point) and ``profile_batches`` (the
CUDA/CPU batch-latency profiler, needs torch).
"""
