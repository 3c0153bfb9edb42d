"""Emulated vLLM-compatible engines, so the gateway runs and is tested without accelerators.

Each engine is the simulator's :class:`~priority.sim.engine.EngineCore` (continuous batching,
chunked prefill, KV blocks, the chosen engine policy, step times from a latency profile) driven
by the wall clock, behind vLLM's OpenAI API and vLLM's ``vllm:*`` Prometheus metrics.

Modules, one job each:

* :mod:`~gateway.engine_sim.mapping` — OpenAI request to core ``Request``: output lengths, and
  SLO/weight from ``vllm_xargs`` and ``priority`` through the one protocol parser
  (:mod:`engine_common.protocol`; token counts: :mod:`gateway.tokens`);
* :mod:`~gateway.engine_sim.loop` — the wall-clock loop and per-request token streams;
* :mod:`~gateway.engine_sim.metrics` — vLLM's metric names on a per-engine registry;
* :mod:`~gateway.engine_sim.schemas` / :mod:`~gateway.engine_sim.filler` — bodies and text;
* :mod:`~gateway.engine_sim.app` — the FastAPI app (:func:`create_engine_app`);
* :mod:`~gateway.engine_sim.faults` — fault injection for tests and drills (off by default):
  hang, freeze, stall, garbage, crash;
* :mod:`~gateway.engine_sim.serve` — several engines in one process on free ports;
* :mod:`~gateway.engine_sim.cli` — ``tiergate engine-sim``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real names for type checkers; at run time, __getattr__ below
    from gateway.engine_sim.app import EngineSim, build_engine_sim, create_engine_app
    from gateway.engine_sim.serve import (
        EngineSpec,
        EngineThread,
        RunningEngine,
        serve_engine,
        serve_engines,
        stop_engines,
    )

_EXPORTS = {
    "EngineSim": "app",
    "build_engine_sim": "app",
    "create_engine_app": "app",
    "EngineSpec": "serve",
    "EngineThread": "serve",
    "RunningEngine": "serve",
    "serve_engine": "serve",
    "serve_engines": "serve",
    "stop_engines": "serve",
}
__all__ = [
    "EngineSim",
    "EngineSpec",
    "EngineThread",
    "RunningEngine",
    "build_engine_sim",
    "create_engine_app",
    "serve_engine",
    "serve_engines",
    "stop_engines",
]


def __getattr__(name: str) -> Any:
    """Import on first use: the app runs beside vLLM (the protocol tests), where the server
    module's uvicorn is not installed."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
