"""Run several policies over one identical workload and summarize each run.

Shared by ``tiergate sim`` and the benchmarks, so both wire policies and routers the same way:
gain-aware components (SlideBatching, GoRouting) get the workload's gain weights, the one
definition of value the metrics also use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from priority.routing import router_plugin
from priority.sim.cluster import ClusterConfig, simulate
from priority.sim.metrics import summarize
from priority.sim.workload import Workload

GAIN_AWARE_POLICIES = frozenset({"slide"})
GAIN_AWARE_ROUTERS = frozenset({"goroute"})

Progress = Callable[[str, float], None]
"""Called with (policy name, fraction of requests done)."""


def configure(config: ClusterConfig, policy: str, workload: Workload) -> ClusterConfig:
    """``config`` running ``policy``, with gain weights wired into gain-aware components."""
    policy_params = dict(config.policy_params)
    router_params = dict(config.router_params)
    if policy in GAIN_AWARE_POLICIES:
        policy_params.setdefault("gain_weights", workload.gain_weights)
    if isinstance(config.router, str):
        plugin = router_plugin(config.router)
        if config.router in GAIN_AWARE_ROUTERS or plugin.accepts("weights"):
            router_params.setdefault("weights", workload.gain_weights)
        if plugin.accepts("seed"):  # routers that draw at random: seeded, so a run reproduces
            router_params.setdefault("seed", config.seed)
    return replace(config, policy=policy, policy_params=policy_params, router_params=router_params)


def compare_policies(
    workload: Workload,
    config: ClusterConfig,
    policies: Sequence[str],
    *,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """One summary dict per policy (the ``tiergate sim --json`` result schema)."""
    results: list[dict[str, Any]] = []
    router_name = config.router if isinstance(config.router, str) else "custom"
    for name in policies:
        callback = None if progress is None else (lambda f, n=name: progress(n, f))
        run = simulate(workload, configure(config, name, workload), progress=callback)
        summary = summarize(run, workload)
        results.append(
            {"policy": name, "router": router_name, **summary, "sim_wall_s": round(run.wall_s, 3)}
        )
    return results
