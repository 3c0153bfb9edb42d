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
  objective (GMAX: demoted, not dropped);
* ``tiergate:estimator_refits`` and ``tiergate:estimator_coefficient{name}`` — the engine's
  corrected estimator (with ``tiergate:estimator_beta``), refitted from its real steps: the
  gateway's router predicts with exactly it;
* ``tiergate:requests_received{tier,kind,objective}`` — requests received so far by what their
  metadata said (``objective``: ``slo`` or ``best-effort``): whether the gateway's tiers, kinds
  and objectives reach the policy;
* ``tiergate:engine_config_info`` — what the engine *is*, from its own configuration, as labels
  (``scheduler``, ``policy``, ``profile``, ``max_num_seqs``, ``max_num_batched_tokens``,
  ``max_model_len``, ``block_size``, ``num_kv_blocks``), value 1: the gateway takes seats and
  limits from it rather than from a latency profile. Exported by stock vLLM too, whenever this
  package is installed beside it (the plugin loads through its entry point with any scheduler).

All carry the ``engine`` label (vLLM's engine index) and, like vLLM's gauges, report the most
recent value across processes when Prometheus multiprocess mode is on.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Gauge
from vllm.v1.metrics.loggers import StatLoggerBase

from engine_common.exports import (
    BETA,
    COEFFICIENT,
    CONFIG_INFO,
    CONFIG_LABELS,
    RECEIVED,
    REFITS,
)
from engine_common.state import PolicyState, pop_state
from priority.estimator_refit import COEFFICIENT_NAMES

_EXTRA: dict[int, tuple[Gauge, Gauge, Gauge]] = {}

_GAUGES: dict[int, dict[str, Gauge]] = {}
_SPECS = {
    "num_urgent": ("tiergate:urgent_requests", "Requests the policy ranks URGENT."),
    "num_normal": ("tiergate:normal_requests", "Requests the policy ranks NORMAL."),
    "latency_budget_s": ("tiergate:latency_budget_seconds", "The step's latency budget."),
    "beta": (BETA, "Momentum correction of the step-time estimator."),
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
    "refits": (REFITS, "Refits of the estimator's coefficients so far."),
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


def _extra_gauges(registry: CollectorRegistry) -> tuple[Gauge, Gauge, Gauge]:
    """The config info, the coefficients and the requests received: one set per registry,
    like :func:`_gauges`."""
    pair = _EXTRA.get(id(registry))
    if pair is None:
        info = Gauge(
            CONFIG_INFO,
            "The engine's own configuration (seats, limits, policy), as labels.",
            labelnames=["engine", *CONFIG_LABELS],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        coefficient = Gauge(
            COEFFICIENT,
            "The engine's refitted step-time coefficients (seconds per unit, before beta).",
            labelnames=["engine", "name"],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        received = Gauge(
            RECEIVED,
            "Requests received so far, by the tier, kind and objective their metadata said.",
            labelnames=["engine", "tier", "kind", "objective"],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        pair = _EXTRA[id(registry)] = (info, coefficient, received)
    return pair


def engine_config(vllm_config: Any, env: dict[str, str] | None = None) -> dict[str, str]:
    """The :data:`CONFIG_LABELS` of an engine, read from its ``VllmConfig`` (and, for our
    scheduler, the plugin's settings in the environment); ``""`` where a value is unknown."""
    env = dict(os.environ) if env is None else env
    sched = getattr(vllm_config, "scheduler_config", None)
    model = getattr(vllm_config, "model_config", None)
    cache = getattr(vllm_config, "cache_config", None)
    scheduler_cls = getattr(sched, "scheduler_cls", None)
    name = (
        scheduler_cls if isinstance(scheduler_cls, str) else getattr(scheduler_cls, "__name__", "")
    )
    if "tiergate" in str(name).lower():
        policy = env.get("TIERGATE_POLICY", "slide")
        profile = env.get("TIERGATE_PROFILE", "")
    else:  # vLLM's own scheduler: its --scheduling-policy (fcfs or priority)
        policy, profile = f"vllm-{getattr(sched, 'policy', 'fcfs')}", ""

    def text(value: Any) -> str:
        return "" if value is None else str(value)

    return {
        "scheduler": text(name) or "vllm",
        "policy": policy,
        "profile": profile,
        "max_num_seqs": text(getattr(sched, "max_num_seqs", None)),
        "max_num_batched_tokens": text(getattr(sched, "max_num_batched_tokens", None)),
        "max_model_len": text(getattr(model, "max_model_len", None)),
        "block_size": text(getattr(cache, "block_size", None)),
        "num_kv_blocks": text(getattr(cache, "num_gpu_blocks", None)),
    }


class TiergateStatLogger(StatLoggerBase):
    def __init__(
        self, vllm_config: Any, engine_index: int = 0, registry: CollectorRegistry = REGISTRY
    ) -> None:
        self.engine_index = engine_index
        self.vllm_config = vllm_config
        self.gauges = _gauges(registry)
        self.config_info, self.coefficients, self.received = _extra_gauges(registry)
        self.last_state: PolicyState | None = None
        self._config: dict[str, str] | None = None
        self.log_engine_initialized()

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
        for name, value in zip(COEFFICIENT_NAMES, state.coefficients, strict=False):
            self.coefficients.labels(engine=engine, name=name).set(value)
        for key, count in state.received:
            tier, kind, objective = [*key.split("|"), "", "", ""][:3]
            self.received.labels(engine, tier, kind, objective).set(count)

    def log_engine_initialized(self) -> None:
        """(Re-)export the engine's configuration; vLLM calls this once the KV cache is sized
        (``num_kv_blocks`` is known only then)."""
        config = engine_config(self.vllm_config)
        if config == self._config:
            return
        engine = str(self.engine_index)
        if self._config is not None:
            self.config_info.remove(engine, *self._config.values())
        self.config_info.labels(engine, *config.values()).set(1.0)
        self._config = config

    def log(self) -> None:
        pass
