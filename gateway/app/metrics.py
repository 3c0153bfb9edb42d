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

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from gateway.histogram import ITL_BUCKETS, BatchHistogram

OTHER_TENANT = "other"
LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0,
)  # fmt: skip
OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip


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


def _no_tenant(_: str) -> str:
    """The tenant label function when tenant labels are off: nothing about the tenant kept."""
    return ""


class RequestCounter:
    """``tiergate_requests_total``: by tier and status, and by tenant only where enabled.

    ``labels(tenant, tier, status)`` is the one call for both shapes, so the request path never
    reads the setting; without tenant labels the tenant is dropped here, before it reaches the
    registry and so the exposition.
    """

    def __init__(self, registry: CollectorRegistry, *, by_tenant: bool) -> None:
        self.by_tenant = by_tenant
        self._counter = Counter(
            "tiergate_requests",
            "Requests answered, by tier and HTTP status (and tenant, where enabled).",
            ("tenant", "tier", "status") if by_tenant else ("tier", "status"),
            registry=registry,
        )

    def labels(self, tenant: str, tier: str, status: str) -> Counter:
        if self.by_tenant:
            return self._counter.labels(tenant, tier, status)
        return self._counter.labels(tier, status)


class GatewayMetrics:
    """Every metric the gateway exports; ``render()`` is the ``/metrics`` body."""

    def __init__(self, *, max_tenants: int = 50, tenant_labels: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.tenant_label: Callable[[str], str] = (
            TenantLabels(max_tenants) if tenant_labels else _no_tenant
        )
        self.requests = RequestCounter(reg, by_tenant=tenant_labels)
        self.rejections = Counter(
            "tiergate_rejections",
            "Requests refused by admission control, by reason.",
            ("tier", "reason"),
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
        self.slo = Counter(
            "tiergate_slo_requests",
            "Finished requests by tier and whether they met their SLO.",
            ("tier", "attained"),
            registry=reg,
        )
        self.queue_depth = Gauge(
            "tiergate_queue_depth", "Requests waiting in the admission queue.", registry=reg
        )
        self.in_flight = Gauge(
            "tiergate_in_flight", "Requests holding a dispatch slot.", registry=reg
        )
        self.backend_healthy = Gauge(
            "tiergate_backend_healthy",
            "1 if the backend takes requests (breaker closed).",
            ("backend",),
            registry=reg,
        )
        self.backend_prefills = Gauge(
            "tiergate_backend_prefill_queue",
            "Dispatched requests awaiting their first token.",
            ("backend",),
            registry=reg,
        )
        self.backend_decoding = Gauge(
            "tiergate_backend_decoding",
            "Requests decoding on the backend (reconciled).",
            ("backend",),
            registry=reg,
        )
        self.backend_running = Gauge(
            "tiergate_backend_running",
            "vllm:num_requests_running at the last scrape.",
            ("backend",),
            registry=reg,
        )
        self.backend_waiting = Gauge(
            "tiergate_backend_waiting",
            "vllm:num_requests_waiting at the last scrape.",
            ("backend",),
            registry=reg,
        )
        self.backend_kv = Gauge(
            "tiergate_backend_kv_cache_usage",
            "vllm:kv_cache_usage_perc at the last scrape.",
            ("backend",),
            registry=reg,
        )
        self.upstream_failures = Counter(
            "tiergate_upstream_failures",
            "Failed upstream attempts (connect, 5xx, broken stream).",
            ("backend",),
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

    def observe_itl(self, tier: str, gaps: Sequence[float]) -> None:
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
