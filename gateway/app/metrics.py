"""The gateway's Prometheus metrics, on a registry of its own (several apps fit in one process).

Names follow the conventions users know (request counters, TTFT / inter-token / end-to-end
histograms, a separate gateway-overhead histogram) under the ``tiergate_`` prefix. Series are
labelled by tier; tenant names (who the customers are, and how much each sends) appear only
where the operator turns tenant labels on (``TIERGATE_METRICS_TENANT_LABELS``), and then
bounded: the first ``max_tenants`` tenants seen are labelled by name, later ones share
``other``. The exposition is served on the operator listener (:mod:`gateway.app.operator`),
never on the API port. Inter-token gaps are observed once per request with numpy (one call,
not one per token), through :class:`~gateway.histogram.BatchHistogram`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from gateway.app.kinds import DEGRADED_OUTCOMES
from gateway.app.multiproc import multiprocess_dir, observe_many
from gateway.histogram import ITL_BUCKETS, BatchHistogram
from priority.gain import mean_tpot_s, ttft_s
from priority.request import SLO

OTHER_TENANT = "other"
OBJECTIVES = ("ttft", "tpot", "deadline")
"""Values of ``objective`` in ``tiergate_slo_objective_requests_total``."""
LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0,
)  # fmt: skip
RATIO_BUCKETS = (0.25, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 2.5, 4.0)
"""Buckets of measured/predicted ratios: finest around 1, where a good estimator lives."""
OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip

LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class TenantLabels:
    """Bounded tenant label values: first-seen tenants by name, then ``other``."""

    def __init__(self, max_tenants: int) -> None:
        self.max_tenants = max_tenants
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, tenant: str) -> str:
        if tenant in self._known:
            return tenant
        with self._lock:
            if len(self._known) < self.max_tenants:
                self._known.add(tenant)
                return tenant
        return OTHER_TENANT


GaugeMode = Literal["livesum", "livemax", "livemin", "livemostrecent", "liveall"]
"""How a gauge combines over the workers of ``tiergate serve --workers N`` (prometheus_client's
``multiprocess_mode``, live workers only): ``livesum`` for a count each worker holds part of
(its queue, its requests in flight), ``livemax`` / ``livemin`` for one quantity every worker
estimates (the worst view wins), ``livemostrecent`` for a value read from elsewhere (the last
scrape of an engine), ``liveall`` to keep one series per worker (a ``pid`` label)."""


def gauge(
    name: str,
    documentation: str,
    labels: Sequence[str] = (),
    *,
    registry: CollectorRegistry | None,
    mode: GaugeMode,
) -> Gauge:
    """A gauge that says how it combines across workers: every gateway gauge is made here (a
    plain ``Gauge`` would be exported once per worker process, with a ``pid`` label)."""
    return Gauge(name, documentation, labels, registry=registry, multiprocess_mode=mode)


def objectives_met(
    arrival_s: float, slo: SLO, token_times: Sequence[float]
) -> list[tuple[str, bool]]:
    """Each objective ``slo`` sets, and whether a finished request met it: the parts of
    :func:`priority.gain.slo_attained` (met only when all are), so that an alert can say which
    one a tier misses. No token delivered: every objective missed."""
    if not token_times:
        return [(name, False) for name, value in _objective_values(slo) if value is not None]
    met: list[tuple[str, bool]] = []
    if slo.ttft_s is not None:
        met.append(("ttft", ttft_s(arrival_s, token_times) < slo.ttft_s))
    if slo.tpot_s is not None:
        met.append(("tpot", mean_tpot_s(token_times) < slo.tpot_s))
    if slo.deadline_s is not None:
        met.append(("deadline", float(token_times[-1]) - arrival_s < slo.deadline_s))
    return met


def _objective_values(slo: SLO) -> tuple[tuple[str, float | None], ...]:
    return (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("deadline", slo.deadline_s))


MAX_CACHED_CHILDREN = 4096
"""Most label children a :class:`TenantCounter` keeps looked up (tenants past
``metrics_max_tenants`` are ``other``; tiers, statuses and reasons are few)."""


def _no_tenant(_: str) -> str:
    """The tenant label function when tenant labels are off: nothing about the tenant kept."""
    return ""


class TenantCounter:
    """A counter labelled by tenant only where tenant labels are enabled.

    ``labels(tenant, *values)`` is the one call for both shapes, so the request path never
    reads the setting; without tenant labels the tenant is dropped here, before it reaches the
    registry and so the exposition.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        *,
        by_tenant: bool,
    ) -> None:
        self.by_tenant = by_tenant
        names = ("tenant", *labelnames) if by_tenant else tuple(labelnames)
        self._counter = Counter(name, documentation, names, registry=registry)
        self._children: dict[tuple[str, ...], Counter] = {}
        """Children by label values: ``Counter.labels`` validates its values and takes a lock
        on every call, and every request ends in one or two of these."""

    def labels(self, tenant: str, *values: str) -> Counter:
        key = (tenant, *values) if self.by_tenant else values
        child = self._children.get(key)
        if child is None:
            if len(self._children) >= MAX_CACHED_CHILDREN:  # label values are bounded; still
                self._children.clear()
            child = self._children[key] = self._counter.labels(*key)
        return child


class RequestCounter(TenantCounter):
    """``tiergate_requests_total``: by tier and status, and by tenant only where enabled."""

    def __init__(self, registry: CollectorRegistry, *, by_tenant: bool) -> None:
        super().__init__(
            "tiergate_requests",
            "Requests answered, by tier and HTTP status (and tenant, where enabled).",
            ("tier", "status"),
            registry,
            by_tenant=by_tenant,
        )

    def labels(self, tenant: str, tier: str, status: str) -> Counter:  # type: ignore[override]
        return super().labels(tenant, tier, status)


class GatewayMetrics:
    """Every metric the gateway exports; ``render()`` is the ``/metrics`` body."""

    def __init__(self, *, max_tenants: int = 50, tenant_labels: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.tenant_label: Callable[[str], str] = (
            TenantLabels(max_tenants) if tenant_labels else _no_tenant
        )
        self.requests = RequestCounter(reg, by_tenant=tenant_labels)
        self.rejections = TenantCounter(
            "tiergate_rejections",
            "Requests refused by admission control, by reason (and tenant, where enabled).",
            ("tier", "reason"),
            reg,
            by_tenant=tenant_labels,
        )
        self.tokens = TenantCounter(
            "tiergate_tokens",
            "Tokens of accepted requests by kind: prompt (processed by an engine) and "
            "completion (delivered to the client); by tier (and tenant, where enabled).",
            ("tier", "kind"),
            reg,
            by_tenant=tenant_labels,
        )
        self.objectives = TenantCounter(
            "tiergate_slo_objective_requests",
            "Finished requests by SLO objective (ttft, tpot, deadline: each that the request "
            "had) and whether it was met; by tier (and tenant, where enabled).",
            ("tier", "objective", "attained"),
            reg,
            by_tenant=tenant_labels,
        )
        # children of the per-request counters, by label values: bounded by tenants (at most
        # max_tenants + 1) x tiers x backends, like the series themselves
        self._token_children: dict[tuple[str, str], tuple[Counter, Counter]] = {}
        self._objective_children: dict[tuple[str, str, str, bool], Counter] = {}
        self._routed_children: dict[tuple[str, str], Counter] = {}
        self._ttft_prediction_children: dict[str, Histogram] = {}
        self.routed = Counter(
            "tiergate_routed_requests",
            "Attempts the router sent to each backend, by tier (a failover counts again, on "
            "the backend it moved to).",
            ("backend", "tier"),
            registry=reg,
        )
        self.ttft = Histogram(
            "tiergate_time_to_first_token_seconds",
            "TTFT at the gateway's egress.",
            ("tier",),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "tiergate_request_duration_seconds",
            "Arrival to last byte, by tier.",
            ("tier",),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self._itl: dict[str, BatchHistogram] = {}
        self._itl_lock = threading.Lock()
        self._itl_shared: Histogram | None = None
        if multiprocess_dir() is not None:  # numpy counts in memory would not merge: see render
            self._itl_shared = Histogram(
                "tiergate_inter_token_latency_seconds",
                "Gaps between streamed chunks at the gateway's egress, by tier.",
                ("tier",),
                buckets=ITL_BUCKETS,
                registry=reg,
            )
        self.gain = Counter(
            "tiergate_gain",
            "Token-level deadline-aware gain (TDG) earned, by tier.",
            ("tier",),
            registry=reg,
        )
        self.ideal_gain = Counter(
            "tiergate_ideal_gain",
            "TDG had every token been on time; gain / ideal = TDG ratio.",
            ("tier",),
            registry=reg,
        )
        self.spend = Counter(
            "tiergate_spend",
            "What requests cost at their model's price (the currency of the prices), by tier: "
            "counted when each usage record is charged.",
            ("tier",),
            registry=reg,
        )
        self.budget_rejections = Counter(
            "tiergate_budget_rejections",
            "Requests refused because a budget was spent (429 budget_exceeded), by scope "
            "(tenant, key) and period.",
            ("scope", "period"),
            registry=reg,
        )
        self.budget_soft = Counter(
            "tiergate_budget_soft_crossings",
            "Budgets whose spend crossed their soft threshold in a period, by scope and period "
            "(once per budget and period, per process that saw it).",
            ("scope", "period"),
            registry=reg,
        )
        self.slo = Counter(
            "tiergate_slo_requests",
            "Finished requests by tier and whether they met their SLO.",
            ("tier", "attained"),
            registry=reg,
        )
        # overload: refusals on SLO grounds are tiergate_rejections_total{reason=
        # "slo_unattainable"|"slo_infeasible"}; demotions are served, so counted apart
        self.demotions = Counter(
            "tiergate_demotions",
            "Requests demoted to best effort because their TTFT objective became unattainable "
            "(served at the lowest priority), by tier and reason.",
            ("tier", "reason"),
            registry=reg,
        )
        # SLOs-Serve's admission across engines (gateway.app.slo_admission): one decision per
        # request whose model has an engine running the planner; refusals and demotions are
        # also in tiergate_rejections_total / tiergate_demotions_total, reason "slo_declined"
        self.slo_admission = Counter(
            "tiergate_slo_admission",
            "Requests the engines' admission planners decided, by tier and outcome: admitted "
            "(by the first engine asked), rerouted (by another, after a decline), demoted (to "
            "best effort: every planner declined), shed (503 slo_declined).",
            ("tier", "outcome"),
            registry=reg,
        )
        self.slo_declines = Counter(
            "tiergate_slo_declines",
            "Requests an engine's admission planner declined (the gateway then asked the next "
            "engine), by backend.",
            ("backend",),
            registry=reg,
        )
        self.slo_planner_time = Histogram(
            "tiergate_slo_planner_seconds",
            "Time to ask the engines' admission planners for one request (all engines tried).",
            buckets=OVERHEAD_BUCKETS,
            registry=reg,
        )
        # multi-stage requests (gateway.app.stages): a conversation attains its SLO only if
        # every stage does; attainment = 1 - missed / conversations (per worker)
        self.multistage_stages = Counter(
            "tiergate_multistage_stages",
            "Served stages of tool-calling conversations (each with its own TTFT), by tier and "
            "whether the stage met its SLO.",
            ("tier", "attained"),
            registry=reg,
        )
        self.multistage_conversations = Counter(
            "tiergate_multistage_conversations",
            "Tool-calling conversations seen (at their first served stage), by tier.",
            ("tier",),
            registry=reg,
        )
        self.multistage_missed = Counter(
            "tiergate_multistage_missed",
            "Tool-calling conversations with a stage that missed its SLO (counted once), by tier.",
            ("tier",),
            registry=reg,
        )
        self.queue_service_rate = gauge(
            "tiergate_queue_service_rate",
            "Dispatch slots released per second while requests waited (the admission queue's "
            "measured service rate; 0 until measured). Workers: the sum.",
            registry=reg,
            mode="livesum",
        )
        self.queue_depth = gauge(
            "tiergate_queue_depth",
            "Requests waiting in the admission queue.",
            registry=reg,
            mode="livesum",
        )
        self.in_flight = gauge(
            "tiergate_in_flight", "Requests holding a dispatch slot.", registry=reg, mode="livesum"
        )
        self.backend_healthy = gauge(
            "tiergate_backend_healthy",
            "1 if the backend takes requests (breaker closed; with several workers: in all).",
            ("backend",),
            registry=reg,
            mode="livemin",
        )
        self.backend_breaker = gauge(
            "tiergate_backend_breaker_state",
            "The backend's circuit breaker: 0 closed, 1 half-open (open, past its cooldown: "
            "routed to again), 2 open (out of routing). With several workers: the worst.",
            ("backend",),
            registry=reg,
            mode="livemax",
        )
        self.backend_prefills = gauge(
            "tiergate_backend_prefill_queue",
            "Dispatched requests awaiting their first token.",
            ("backend",),
            registry=reg,
            mode="livesum",
        )
        self.backend_prefills_others = gauge(
            "tiergate_backend_prefill_queue_others",
            "The other workers' dispatched requests awaiting their first token, as this "
            "worker's router sees them (shared table; 0 with one worker). Several workers: the "
            "largest.",
            ("backend",),
            registry=reg,
            mode="livemax",
        )
        self.backend_decoding = gauge(
            "tiergate_backend_decoding",
            "Requests decoding on the backend (reconciled; with several workers: the largest "
            "worker's view).",
            ("backend",),
            registry=reg,
            mode="livemax",
        )
        self.backend_running = gauge(
            "tiergate_backend_running",
            "vllm:num_requests_running at the last scrape.",
            ("backend",),
            registry=reg,
            mode="livemostrecent",
        )
        self.backend_waiting = gauge(
            "tiergate_backend_waiting",
            "vllm:num_requests_waiting at the last scrape.",
            ("backend",),
            registry=reg,
            mode="livemostrecent",
        )
        self.backend_kv = gauge(
            "tiergate_backend_kv_cache_usage",
            "vllm:kv_cache_usage_perc at the last scrape.",
            ("backend",),
            registry=reg,
            mode="livemostrecent",
        )
        self.backend_seats = gauge(
            "tiergate_backend_seats",
            "Requests the backend runs at once (max_num_seqs): the engine's, else the profile's.",
            ("backend",),
            registry=reg,
            mode="livemostrecent",
        )
        self.backend_config_mismatch = gauge(
            "tiergate_backend_config_mismatch",
            "1 where the backend's profile disagrees with what the engine says it is (the "
            "engine's value is used).",
            ("backend", "field"),
            registry=reg,
            mode="livemax",
        )
        self.upstream_failures = Counter(
            "tiergate_upstream_failures",
            "Failed upstream attempts (connect, 5xx, broken stream).",
            ("backend",),
            registry=reg,
        )
        # engine faults: what the timeouts and the breaker did
        self.upstream_timeouts = Counter(
            "tiergate_upstream_timeouts",
            "Upstream attempts abandoned for time: phase first_token, response (non-streamed) "
            "or stall (after the first token).",
            ("backend", "phase"),
            registry=reg,
        )
        self.slow_probes = Counter(
            "tiergate_slow_probes",
            "Liveness probes that timed out while the backend's streams kept delivering: busy, "
            "not dead, so the breaker stays as it is.",
            ("backend",),
            registry=reg,
        )
        self.breaker_opens = Counter(
            "tiergate_breaker_opens",
            "Times a backend's breaker opened, by reason (unreachable, unresponsive).",
            ("backend", "reason"),
            registry=reg,
        )
        self.failovers = Counter(
            "tiergate_failovers",
            "Attempts retried on another backend after failing before their first token.",
            ("tier",),
            registry=reg,
        )
        # database outages: the usage writer's records and the auth cache's stale
        # serving, copied from their counters every second (gateway.app.durability)
        self.usage_records = Counter(
            "tiergate_usage_records",
            "Usage records by outcome: written, duplicate (found stored already: not written "
            "twice), spilled (to the disk spool), replayed (from it), dropped (lost).",
            ("outcome",),
            registry=reg,
        )
        self.usage_buffered = gauge(
            "tiergate_usage_buffered_records",
            "Usage records in memory not yet in the database. Workers: the sum.",
            registry=reg,
            mode="livesum",
        )
        self.usage_spooled = gauge(
            "tiergate_usage_spooled_records",
            "Usage records spooled to disk and not yet replayed. Workers: the sum.",
            registry=reg,
            mode="livesum",
        )
        self.usage_spool_bytes = gauge(
            "tiergate_usage_spool_bytes",
            "Bytes in the usage spool directory (shared by the workers: the largest view).",
            registry=reg,
            mode="livemax",
        )
        self.database_unavailable = gauge(
            "tiergate_database_unavailable",
            "1 while the database fails the gateway (usage writes kept for retry, or API keys "
            "served from the cache). Workers: the max.",
            registry=reg,
            mode="livemax",
        )
        self.auth_stale = Counter(
            "tiergate_auth_stale",
            "Requests authenticated from a key's last-good identity while the database could "
            "not answer.",
            registry=reg,
        )
        self.ttft_prediction = Histogram(
            "tiergate_ttft_prediction_ratio",
            "Measured dispatch-to-first-token time over the router's prediction, per backend "
            "(streamed requests): 1 is a perfect estimator, above 1 the engine was slower.",
            ("backend",),
            buckets=RATIO_BUCKETS,
            registry=reg,
        )
        self.routing_time = Histogram(
            "tiergate_routing_decision_seconds",
            "Time to choose a backend.",
            buckets=OVERHEAD_BUCKETS,
            registry=reg,
        )
        self.overhead = Histogram(
            "tiergate_gateway_overhead_seconds",
            "Gateway processing before the upstream request is sent (auth, limits, routing), "
            "excluding time waiting in the admission queue.",
            buckets=OVERHEAD_BUCKETS,
            registry=reg,
        )
        self.loop_lag = Histogram(
            "tiergate_event_loop_lag_seconds",
            "How late the gateway's event loop ran a periodic tick (sampled ten times a "
            "second): time every request on the loop waited too.",
            buckets=LOOP_LAG_BUCKETS,
            registry=reg,
        )
        # Redis outages: docs/operations/redis-outage.md
        self.limiter_degraded = gauge(
            "tiergate_limiter_degraded",
            "1 while Redis limits are unreachable and each process enforces its share of every "
            "limit in process (degraded-local). Workers: 1 if any is.",
            registry=reg,
            mode="livemax",
        )
        self.limiter_fallbacks = Counter(
            "tiergate_limiter_fallbacks",
            "Times the limits fell back from Redis to per-process shares (Redis lost).",
            registry=reg,
        )
        self.budget_degraded = gauge(
            "tiergate_budget_degraded",
            "1 while Redis budgets are unreachable or slow and each process enforces its share "
            "of what each budget had left, in process (degraded-local). Workers: 1 if any is.",
            registry=reg,
            mode="livemax",
        )
        # request kinds: workflow calls answered without Redis (gateway.app.workflows)
        self.workflow_degraded = Counter(
            "tiergate_workflow_degraded_calls",
            "Workflow calls answered while Redis was unreachable, by outcome: local (this "
            "process's copy of the workflow: compound, as usual) or default_kind (a workflow "
            "this process never saw: served as the tier's default kind, without its workflow).",
            ("outcome",),
            registry=reg,
        )
        for outcome in DEGRADED_OUTCOMES:  # 0 from the start: a quiet panel reads 0, not "no data"
            self.workflow_degraded.labels(outcome)
        # the length model the gateway learns (gateway.app.length_learning)
        self.length_model = gauge(
            "tiergate_length_model_info",
            "1 for the length model version served (0 for one served before). Workers: 1 if "
            "any serves it.",
            ("version",),
            registry=reg,
            mode="livemax",
        )
        self.length_samples = Counter(
            "tiergate_length_samples",
            "Length samples of finished requests, by outcome: written (to the database) or "
            "dropped (queue full, or the database refused their batch: samples are not retried).",
            ("outcome",),
            registry=reg,
        )
        self.length_trainings = Counter(
            "tiergate_length_trainings",
            "Periodic length-model trainings by outcome: ok (a new version published), "
            "skipped (too few samples), failed (the served model stays).",
            ("outcome",),
            registry=reg,
        )
        for outcome in ("written", "dropped"):
            self.length_samples.labels(outcome)
        for outcome in ("ok", "skipped", "failed"):
            self.length_trainings.labels(outcome)

    def record_served(
        self,
        tenant: str,
        tier: str,
        prompt_tokens: int,
        completion_tokens: int,
        met: Sequence[tuple[str, bool]],
    ) -> None:
        """An accepted request's tokens, and each SLO objective it met or missed (``met``:
        :func:`objectives_met`, empty when it did not finish). Once per request."""
        tokens = self._token_children.get((tenant, tier))
        if tokens is None:  # labels() costs microseconds a call: look each child up once
            tokens = (
                self.tokens.labels(tenant, tier, "prompt"),
                self.tokens.labels(tenant, tier, "completion"),
            )
            self._token_children[tenant, tier] = tokens
        tokens[0].inc(prompt_tokens)
        tokens[1].inc(completion_tokens)
        for objective, attained in met:
            key = (tenant, tier, objective, attained)
            child = self._objective_children.get(key)
            if child is None:
                child = self.objectives.labels(
                    tenant, tier, objective, "true" if attained else "false"
                )
                self._objective_children[key] = child
            child.inc()

    def count_routed(self, backend: str, tier: str) -> None:
        """One routing decision sent to ``backend`` (once per attempt)."""
        child = self._routed_children.get((backend, tier))
        if child is None:
            child = self._routed_children[backend, tier] = self.routed.labels(backend, tier)
        child.inc()

    def ttft_prediction_of(self, backend: str) -> Histogram:
        """``tiergate_ttft_prediction_ratio``'s child for ``backend``, looked up once (a
        streamed request's first token observes it)."""
        child = self._ttft_prediction_children.get(backend)
        if child is None:
            child = self.ttft_prediction.labels(backend)
            self._ttft_prediction_children[backend] = child
        return child

    def limiter_switched(self, degraded: bool) -> None:
        """The rate limiter's ``on_change``: Redis lost (True) or back (False)."""
        self.limiter_degraded.set(1 if degraded else 0)
        if degraded:
            self.limiter_fallbacks.inc()

    def budget_switched(self, degraded: bool) -> None:
        """The budget guard's ``on_change``: Redis lost (True) or back (False)."""
        self.budget_degraded.set(1 if degraded else 0)

    def workflow_call_degraded(self, tier: str, outcome: str) -> None:
        """:class:`~gateway.app.kinds.RequestKinds`'s ``on_degraded``: a workflow call answered
        without Redis (``outcome``: ``local`` or ``default_kind``). Not by tier: a Redis outage
        is the whole gateway's, and a series per outcome exists from the start."""
        del tier
        self.workflow_degraded.labels(outcome).inc()

    def observe_itl(self, tier: str, gaps: Sequence[float]) -> None:
        if self._itl_shared is not None:
            observe_many(self._itl_shared.labels(tier), gaps)
            return
        hist = self._itl.get(tier)
        if hist is None:
            with self._itl_lock:
                hist = self._itl.get(tier)
                if hist is None:
                    hist = BatchHistogram(
                        "tiergate_inter_token_latency_seconds",
                        "Gaps between streamed chunks at the gateway's egress, by tier.",
                        ITL_BUCKETS,
                        {"tier": tier},
                    )
                    self._itl[tier] = hist
        hist.observe_many(gaps)

    def render(self) -> bytes:
        body = generate_latest(self.registry)
        if not self._itl:
            return body
        # one family, one HELP/TYPE, several tier series: render the batch histograms together
        return body + _render_itl(list(self._itl.values()))


def _render_itl(hists: list[BatchHistogram]) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_MergedHistograms(hists))
    return generate_latest(reg)


class _MergedHistograms:
    """One histogram family from several single-series :class:`BatchHistogram` objects."""

    def __init__(self, hists: list[BatchHistogram]) -> None:
        self.hists = hists

    def collect(self) -> Iterator[Metric]:
        families = [next(iter(h.collect())) for h in self.hists]
        merged = families[0]
        for family in families[1:]:
            merged.samples.extend(family.samples)
        yield merged
