"""vllm-ascend side: the same scheduler on vLLM 0.23 internals, with the Ascend 910B profiles.

``vllm serve MODEL --scheduler-cls engine_ascend.scheduler.TiergateScheduler`` (with
vllm-ascend's own schedulers off in ``additional_config``, so the user class passes through).
The logic is shared with ``engine_cuda`` through :mod:`engine_common`.
"""
