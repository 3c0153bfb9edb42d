"""What the vLLM (CUDA) and vllm-ascend engine plugins share: our policies inside vLLM's scheduler.

``engine_cuda`` and ``engine_ascend`` are thin: each names its default latency profile and
re-exports the scheduler and the stat logger built here. The pure parts (settings, SLO metadata,
the policy-state codec, step timing) import nothing from vLLM; :mod:`engine_common.compat`,
:mod:`engine_common.queue` and :mod:`engine_common.scheduler` do, lazily, so the main install
stays light.
"""
