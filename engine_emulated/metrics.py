"""vLLM's Prometheus metrics, by vLLM's names, so the gateway scrapes an emulated engine as-is.

Each engine gets its own :class:`~prometheus_client.CollectorRegistry`, so several engines in one
process do not clash. Labels follow vLLM V1: ``model_name`` and ``engine`` (the engine-core index,
always ``"0"`` here); ``vllm:request_success_total`` adds ``finished_reason``. Gauges are read from
the engine core when scraped, so stepping costs nothing for them. Latencies are in the engine's
clock (seconds of emulated time; equal to wall seconds unless a time scale is set). Histograms
are :class:`~gateway.histogram.BatchHistogram` (one numpy call per step), shared with the gateway.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from engine_common.exports import COEFFICIENT, CONFIG_INFO, CONFIG_LABELS
from gateway.histogram import ITL_BUCKETS, BatchHistogram
from priority.estimator_refit import COEFFICIENT_NAMES
from priority.policies.base import StepPlan
from priority.sim.engine import EngineCore

_LABELS = ("model_name", "engine")
FINISH_REASONS = ("stop", "length")
"""Reasons a request finishes here (a client abort is not a success and is not counted)."""

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

POLICY_GAUGES = {
    "urgent": ("tiergate:urgent_requests", "Requests the policy ranks URGENT."),
    "normal": ("tiergate:normal_requests", "Requests the policy ranks NORMAL."),
    "budget": ("tiergate:latency_budget_seconds", "The step's latency budget."),
    "beta": ("tiergate:estimator_beta", "Momentum correction of the step-time estimator."),
    "error": ("tiergate:estimator_error_ratio", "|real / predicted - 1| of the latest step time."),
    "deviations": (
        "tiergate:plan_deviations",
        "Steps whose executed batch differed from the policy's plan.",
    ),
    "steps": ("tiergate:policy_steps", "Steps planned by the policy."),
    "hopeless": (
        "tiergate:hopeless_requests",
        "Waiting requests the latest plan judged unable to meet their objective.",
    ),
}
"""The policy's state, by the names and with the ``engine`` label of the vLLM plugin's stat
logger (:mod:`engine_common.stat_logger`), so one dashboard reads emulated and real engines."""


class EngineMetrics:
    """The metric objects of one emulated engine and the ``/metrics`` rendering."""

    def __init__(
        self, model_name: str, core: EngineCore, *, policy: str = "", max_model_len: int = 0
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.core = core
        labels = {"model_name": model_name, "engine": "0"}
        reg = self.registry
        # what the engine is, as the plugin's stat logger states it (engine_common.exports)
        limits = core.profile.engine
        stated = {
            "scheduler": "tiergate-emulated",
            "policy": policy,
            "profile": core.profile.name,
            "max_num_seqs": str(limits.max_num_seqs),
            "max_num_batched_tokens": str(limits.max_num_batched_tokens),
            "max_model_len": str(max_model_len) if max_model_len else "",
            "block_size": str(limits.block_size),
            "num_kv_blocks": str(limits.num_kv_blocks),
        }
        Gauge(
            CONFIG_INFO,
            "The engine's own configuration, as labels.",
            ("engine", *CONFIG_LABELS),
            registry=reg,
        ).labels("0", *(stated[name] for name in CONFIG_LABELS)).set(1.0)
        self._coefficients = Gauge(
            COEFFICIENT,
            "The engine's step-time coefficients (before beta).",
            ("engine", "name"),
            registry=reg,
        )

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, _LABELS, registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> BatchHistogram:
            hist = BatchHistogram(name, doc, buckets, labels)
            reg.register(hist)
            return hist

        self._running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self._waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self._kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.")
        self.running = self._running.labels(**labels)
        self.waiting = self._waiting.labels(**labels)
        self.kv_usage = self._kv.labels(**labels)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Time spent waiting before first scheduled.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.step_lag = histogram(
            "tiergate:engine_sim_step_lag_seconds",
            "How late the emulation delivered each step end (event-loop delay; not vLLM's).",
            LAG_BUCKETS,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", _LABELS, registry=reg
        ).labels(**labels)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed.", _LABELS, registry=reg
        ).labels(**labels)
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative preemptions.", _LABELS, registry=reg
        ).labels(**labels)
        self._success = Counter(
            "vllm:request_success",
            "Successfully finished requests.",
            (*_LABELS, "finished_reason"),
            registry=reg,
        )
        self.policy = {
            key: Gauge(name, doc, ("engine",), registry=reg).labels(engine="0")
            for key, (name, doc) in POLICY_GAUGES.items()
        }
        self.policy["beta"].set(core.policy.estimator.beta)
        self._labels = labels
        self._preemptions_seen = 0
        for reason in FINISH_REASONS:  # exported at 0 from the start, as vLLM does
            self._success.labels(**labels, finished_reason=reason)

    def planned(self, plan: StepPlan) -> None:
        """The policy planned a step (the emulation runs every plan as planned: no deviation).
        Once per step, a few gauge writes: as the vLLM plugin, the state at planning time."""
        core, gauges = self.core, self.policy
        estimator = core.policy.estimator
        queued = core.num_running + core.num_waiting
        gauges["urgent"].set(plan.num_urgent)
        gauges["normal"].set(max(0, queued - plan.num_urgent))
        gauges["budget"].set(plan.time_budget_s or 0.0)
        gauges["beta"].set(estimator.beta)
        gauges["error"].set(estimator.last_ratio_error)
        gauges["steps"].set(core.stats.policy_calls)
        gauges["hopeless"].set(len(plan.hopeless))

    def success(self, finished_reason: str) -> None:
        self._success.labels(**self._labels, finished_reason=finished_reason).inc()

    def render(self) -> bytes:
        """Refresh the gauges from the engine core and render the exposition text."""
        core = self.core
        coefficients = core.policy.estimator.coefficients
        for name in COEFFICIENT_NAMES:
            self._coefficients.labels("0", name).set(getattr(coefficients, name))
        self.running.set(core.num_running)
        self.waiting.set(core.num_waiting)
        self.kv_usage.set(core.kv_usage)
        preemptions = core.stats.preemptions
        if preemptions > self._preemptions_seen:
            self.preemptions.inc(preemptions - self._preemptions_seen)
            self._preemptions_seen = preemptions
        return generate_latest(self.registry)
