"""The scheduler class vLLM's ``--scheduler-cls`` names, shared by both engine plugins.

``engine_cuda.scheduler.TiergateScheduler`` and ``engine_ascend.scheduler.TiergateScheduler``
subclass it and set only :attr:`TiergateScheduler.default_profile`; how the plan is executed and
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
    or ``Scheduler`` (off), chosen at that moment, since a platform plugin (vllm-ascend) may
    rebind vLLM's scheduler class after this module is imported.
    """

    default_profile: ClassVar[str]
    """The latency profile used when ``TIERGATE_PROFILE`` is unset; each plugin names its own."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return build_scheduler(cls._profile(), cls.__name__, *args, **kwargs)

    @classmethod
    def over(cls, base: type) -> type:
        """The class this factory builds over vLLM's scheduler class ``base`` (a subclass of it),
        for code that must name the class itself, e.g. vLLM's own tests."""
        return scheduler_class(cls._profile(), cls.__name__, base)

    @classmethod
    def _profile(cls) -> str:
        profile = getattr(cls, "default_profile", None)
        if profile is None:
            raise TypeError(
                f"{cls.__module__}.{cls.__qualname__} has no default_profile: name a plugin's "
                "class (engine_cuda.scheduler.TiergateScheduler, engine_ascend.scheduler...)"
            )
        return str(profile)
