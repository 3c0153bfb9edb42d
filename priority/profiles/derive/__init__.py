"""Turn public measurements and specifications into profile-table rows.

Build-time only: ``scripts/build_profiles.py`` calls these with paths under ``shared/data``;
nothing at run time imports this subpackage, and the package never needs that data.

- model shapes and their weight / KV-cache arithmetic live in :mod:`priority.models`
  (:mod:`.models` re-exports them for ``scripts/build_profiles.py``).
- :mod:`.engine` — vLLM KV-cache capacity → :class:`~priority.profiles.EngineConfig`.
- :mod:`.aiconfigurator` — compose forward passes from NVIDIA aiconfigurator kernel tables.
- :mod:`.vidur` — Vidur elementwise-op and CPU-overhead profiles used by the composition.
- :mod:`.splitwise` — SplitwiseSim's measured batch prefill / decode times as table rows.
- :mod:`.ascend` — roofline model of Ascend 910B calibrated on vllm-ascend serving results.
"""
