"""Emulated vLLM-compatible engines, so the gateway runs and is tested without accelerators.

Each engine is the simulator's :class:`~priority.sim.engine.EngineCore` (continuous batching,
chunked prefill, KV blocks, the chosen engine policy, step times from a latency profile) driven
by the wall clock, behind vLLM's OpenAI API and vLLM's ``vllm:*`` Prometheus metrics.

Modules, one job each:

* :mod:`~engine_emulated.mapping` — OpenAI request to core ``Request``: output lengths, and
  SLO/weight from ``vllm_xargs`` and ``priority`` through the one protocol parser
  (:mod:`engine_common.protocol`; token counts: :mod:`gateway.tokens`);
* :mod:`~engine_emulated.loop` — the wall-clock loop and per-request token streams;
* :mod:`~engine_emulated.metrics` — vLLM's metric names on a per-engine registry;
* :mod:`~engine_emulated.schemas` / :mod:`~engine_emulated.filler` — bodies and text;
* :mod:`~engine_emulated.app` — the FastAPI app (:func:`create_engine_app`);
* :mod:`~engine_emulated.faults` — fault injection for tests and drills (off by default):
  hang, freeze, stall, garbage, crash;
* :mod:`~engine_emulated.serve` — several engines in one process on free ports;
* :mod:`~engine_emulated.cli` — ``tiergate engine-sim``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real names for type checkers; at run time, __getattr__ below
    from engine_emulated.app import EngineSim, build_engine_sim, create_engine_app
    from engine_emulated.serve import (
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
