"""``--scheduler-cls engine_ascend.scheduler.TiergateScheduler`` for vllm-ascend (vLLM 0.23).

The CUDA plugin's scheduler (:mod:`engine_common.vllm_scheduler`) with the Ascend 910B default
latency profile. The vLLM base class is resolved when vLLM constructs the scheduler, after
vllm-ascend's platform patches have rebound ``vllm.v1.core.sched.scheduler.Scheduler``, so its
patched scheduler is the one extended.
"""

from __future__ import annotations

from typing import ClassVar

from engine_common import vllm_scheduler


class TiergateScheduler(vllm_scheduler.TiergateScheduler):
    default_profile: ClassVar[str] = "910b-qwen2-7b"
