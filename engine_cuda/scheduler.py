"""``vllm serve MODEL --scheduler-cls engine_cuda.scheduler.TiergateScheduler``.

Our engine policy (``TIERGATE_POLICY``, default SlideBatching) inside vLLM's scheduler, with the
CUDA default latency profile (``TIERGATE_PROFILE`` overrides it). The class itself is shared with
the Ascend plugin: :mod:`engine_common.vllm_scheduler`.
"""

from __future__ import annotations

from typing import ClassVar

from engine_common import vllm_scheduler


class TiergateScheduler(vllm_scheduler.TiergateScheduler):
    default_profile: ClassVar[str] = "h100-llama3.1-8b"
