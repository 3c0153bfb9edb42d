"""``--scheduler-cls engine_ascend.scheduler.TiergateScheduler`` for vllm-ascend (vLLM 0.23).

Identical to :class:`engine_cuda.scheduler.TiergateScheduler` but for the default latency profile
(Ascend 910B). The vLLM base class is resolved when vLLM constructs the scheduler, after
vllm-ascend's platform patches have rebound ``vllm.v1.core.sched.scheduler.Scheduler``, so its
patched scheduler is the one extended.
"""

from __future__ import annotations

from typing import ClassVar

from engine_cuda.scheduler import TiergateScheduler as _CudaTiergateScheduler


class TiergateScheduler(_CudaTiergateScheduler):
    default_profile: ClassVar[str] = "910b-qwen2-7b"
