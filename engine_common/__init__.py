"""What the vLLM (CUDA) and vllm-ascend engine plugins share: our policies inside vLLM's scheduler.

``engine_cuda`` and ``engine_ascend`` are thin: each names its default latency profile and
re-exports the scheduler and the stat logger built here. The modules, pure ones first (they
import nothing from vLLM: the main install and its tests load them without it):

* :mod:`~engine_common.protocol` — the gateway→engine protocol: the ``tiergate_*`` keys of
  ``vllm_xargs``, their bounds and defaults, the one writer and the one reader (no web import
  either: the gateway and the emulated engine load it too);
* :mod:`~engine_common.slo` — the engine side's reader (``parse_meta``), counting and logging the
  values it had to ignore;
* :mod:`~engine_common.settings` — the plugin's ``TIERGATE_*`` environment, checked at start-up;
* :mod:`~engine_common.state` — the policy state's trip to the stat logger inside
  ``SchedulerStats``;
* :mod:`~engine_common.timing` — real step times for the estimator's momentum correction;
* :mod:`~engine_common.profiling` — the profilers' model, batch grid and CSV (torch, lazily).

The vLLM side, imported only where vLLM runs:

* :mod:`~engine_common.scheduler` — the adapter (``PolicyDriver``) and the hooks around vLLM's
  ``schedule()`` (vLLM is imported when a scheduler is built);
* :mod:`~engine_common.vllm_scheduler` — the ``--scheduler-cls`` class both plugins subclass;
* :mod:`~engine_common.compat` — what differs between vLLM 0.33 and 0.23 (imports it lazily);
* :mod:`~engine_common.queue` — vLLM's waiting queue in the policy's order;
* :mod:`~engine_common.stat_logger` — the policy's gauges as a vLLM stat-logger plugin.

The replays that check all this on a virtual clock are test harness, in :mod:`engine_harness`.
"""
