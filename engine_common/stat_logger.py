"""vLLM stat-logger plugin: the policy's state as Prometheus gauges (imports vLLM).

Registered under vLLM's ``vllm.stat_logger_plugins`` entry-point group as
``engine_cuda.metrics:TiergateStatLogger`` (both plugins re-export this class; or passed as
``AsyncLLM(stat_loggers=[TiergateStatLogger])``). vLLM constructs it once per engine in the
API-server process and calls :meth:`record` with every ``SchedulerStats`` it receives; the
scheduler packs its :class:`~engine_common.state.PolicyState` into those stats
(:mod:`engine_common.state` explains the channel), and :meth:`record` unpacks it — removing it,
so vLLM's own loggers see exactly the stats they would without us — into the gauges:

* ``tiergate:urgent_requests``, ``tiergate:normal_requests`` — SlideBatching's URGENT/NORMAL split;
* ``tiergate:latency_budget_seconds`` — the step's latency budget;
* ``tiergate:estimator_beta`` — the step-time momentum correction;
* ``tiergate:estimator_error_ratio`` — |T_real / T_predicted - 1| of the latest step;
* ``tiergate:plan_deviations`` / ``tiergate:policy_steps`` — steps where vLLM ran a batch other
  than the plan, out of steps planned;
* ``tiergate:hopeless_requests`` — waiting requests the latest plan judged unable to meet their
  objective (GMAX: demoted, not dropped).

All carry the ``engine`` label (vLLM's engine index) and, like vLLM's gauges, report the most
recent value across processes when Prometheus multiprocess mode is on.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Gauge
from vllm.v1.metrics.loggers import StatLoggerBase

from engine_common.state import PolicyState, pop_state

_GAUGES: dict[int, dict[str, Gauge]] = {}
_SPECS = {
    "num_urgent": ("tiergate:urgent_requests", "Requests the policy ranks URGENT."),
    "num_normal": ("tiergate:normal_requests", "Requests the policy ranks NORMAL."),
    "latency_budget_s": ("tiergate:latency_budget_seconds", "The step's latency budget."),
    "beta": ("tiergate:estimator_beta", "Momentum correction of the step-time estimator."),
    "estimator_error": (
        "tiergate:estimator_error_ratio",
        "|real / predicted - 1| of the latest step time.",
    ),
    "plan_deviations": (
        "tiergate:plan_deviations",
        "Steps whose executed batch differed from the policy's plan.",
    ),
    "steps": ("tiergate:policy_steps", "Steps planned by the policy."),
    "num_hopeless": (
        "tiergate:hopeless_requests",
        "Waiting requests the latest plan judged unable to meet their objective.",
    ),
}


def _gauges(registry: CollectorRegistry) -> dict[str, Gauge]:
    """One set of gauges per registry (vLLM may build several loggers in one process)."""
    gauges = _GAUGES.get(id(registry))
    if gauges is None:
        gauges = {
            field: Gauge(
                name,
                doc,
                labelnames=["engine"],
                registry=registry,
                multiprocess_mode="mostrecent",
            )
            for field, (name, doc) in _SPECS.items()
        }
        _GAUGES[id(registry)] = gauges
    return gauges


class TiergateStatLogger(StatLoggerBase):
    def __init__(
        self, vllm_config: Any, engine_index: int = 0, registry: CollectorRegistry = REGISTRY
    ) -> None:
        self.engine_index = engine_index
        self.gauges = _gauges(registry)
        self.last_state: PolicyState | None = None

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is None:
            return
        state = pop_state(scheduler_stats.running_lora_adapters)
        if state is None:
            return
        self.last_state = state
        engine = str(engine_idx)
        for field, gauge in self.gauges.items():
            gauge.labels(engine=engine).set(getattr(state, field))

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass
