"""The overview's live numbers, read from the metrics the gateway already keeps (read-only).

One process: its own registry (:class:`~gateway.app.metrics.GatewayMetrics`). Under
``tiergate serve --workers N`` each worker writes its metrics to the shared multiprocess
directory, and this reads them all merged, as the operator listener serves them
(:mod:`gateway.app.multiproc`): whichever worker answers the page, the numbers are the
gateway's. The request rate is the change of the request counter between this process's
polls (:class:`RateTracker`), so it needs two polls to show.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.metrics_core import Metric

from gateway.app.multiproc import multiprocess_dir
from gateway.app.state import GatewayState

RATE_WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class BackendLive:
    name: str
    model: str
    healthy: bool


@dataclass(frozen=True, slots=True)
class LiveNumbers:
    requests_total: float
    rate_per_s: float | None  # None until two polls have been seen
    rejections: dict[str, float] = field(default_factory=dict)  # by reason, since start
    queue_depth: float = 0.0
    in_flight: float = 0.0
    backends: tuple[BackendLive, ...] = ()
    planner: dict[str, float] = field(default_factory=dict)
    """SLOs-Serve's admission across engines, by outcome (admitted, rerouted, demoted, shed);
    empty when no engine runs the planner."""
    planner_declines: dict[str, float] = field(default_factory=dict)
    """Declines by engine (the gateway then asked the next one)."""

    @property
    def rejected_total(self) -> float:
        return sum(self.rejections.values())

    @property
    def healthy_backends(self) -> int:
        return sum(1 for b in self.backends if b.healthy)


class RateTracker:
    """Requests per second from the request counter's recent values (this process's polls)."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, float]] = deque()
        self._lock = threading.Lock()

    def rate(self, total: float, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._points.append((now, total))
            while len(self._points) > 2 and self._points[1][0] <= now - self.window_s:
                self._points.popleft()
            first_t, first_total = self._points[0]
        if now - first_t < 0.5:
            return None
        return max(0.0, total - first_total) / (now - first_t)


def _families(state: GatewayState) -> Iterable[Metric]:
    path = multiprocess_dir()
    if path is None:
        return list(state.metrics.registry.collect())
    registry = CollectorRegistry(auto_describe=False)
    multiprocess.MultiProcessCollector(registry, path=path)
    return list(registry.collect())


def read_live(state: GatewayState, tracker: RateTracker) -> LiveNumbers:
    """The numbers now (blocking: reading the multiprocess files is file I/O)."""
    requests = 0.0
    rejections: dict[str, float] = {}
    queue_depth = in_flight = 0.0
    planner: dict[str, float] = {}
    declines: dict[str, float] = {}
    for family in _families(state):
        for sample in family.samples:
            if sample.name == "tiergate_requests_total":
                requests += sample.value
            elif sample.name == "tiergate_rejections_total":
                reason = sample.labels.get("reason", "?")
                rejections[reason] = rejections.get(reason, 0.0) + sample.value
            elif sample.name == "tiergate_queue_depth":
                queue_depth += sample.value
            elif sample.name == "tiergate_in_flight":
                in_flight += sample.value
            elif sample.name == "tiergate_slo_admission_total":
                outcome = sample.labels.get("outcome", "?")
                planner[outcome] = planner.get(outcome, 0.0) + sample.value
            elif sample.name == "tiergate_slo_declines_total":
                backend = sample.labels.get("backend", "?")
                declines[backend] = declines.get(backend, 0.0) + sample.value
    backends = tuple(
        BackendLive(b.name, b.spec.model, bool(b.view.healthy)) for b in state.pool.backends
    )
    return LiveNumbers(
        requests_total=requests,
        rate_per_s=tracker.rate(requests),
        rejections=dict(sorted(rejections.items(), key=lambda kv: -kv[1])),
        queue_depth=queue_depth,
        in_flight=in_flight,
        backends=backends,
        planner=planner,
        planner_declines=dict(sorted(declines.items())),
    )
