"""``vllm serve MODEL --scheduler-cls engine_cuda.scheduler.TiergateScheduler``.

Our engine policy (``TIERGATE_POLICY``, default SlideBatching) inside vLLM's scheduler, with the
CUDA default latency profile (``TIERGATE_PROFILE`` overrides it). How the plan is executed and
where vLLM may deviate from it: :mod:`engine_common.scheduler`; the settings:
:mod:`engine_common.settings`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from engine_common.scheduler import build_scheduler, scheduler_class


class TiergateScheduler:
    """A factory in the shape vLLM expects of a scheduler class.

    vLLM calls ``TiergateScheduler(vllm_config=..., kv_cache_config=..., ...)``; the object it
    gets is an instance of a subclass of vLLM's ``AsyncScheduler`` (asynchronous scheduling on)
    or ``Scheduler`` (off), chosen at that moment.
    """

    default_profile: ClassVar[str] = "h100-llama3.1-8b"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return build_scheduler(cls.default_profile, cls.__name__, *args, **kwargs)

    @classmethod
    def over(cls, base: type) -> type:
        """The class this factory builds over vLLM's scheduler class ``base`` (a subclass of it),
        for code that must name the class itself, e.g. vLLM's own tests."""
        return scheduler_class(cls.default_profile, cls.__name__, base)
