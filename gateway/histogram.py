"""A Prometheus histogram fed a whole batch of observations at once, and vLLM's ITL buckets.

Shared by the gateway's metrics (:mod:`gateway.app.metrics`, per-tier inter-token gaps) and the
emulated engine's (:mod:`engine_emulated.metrics`), which both observe one value per streamed
token: the emulated engine imports it from here, the gateway never from the emulated engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's ``vllm:inter_token_latency_seconds`` buckets (the gateway's egress gaps use them too)."""


class BatchHistogram(Collector):
    """A Prometheus histogram that takes a whole step's observations in one numpy call.

    ``prometheus_client.Histogram`` costs a lock and a bucket search per value; the engine
    observes one inter-token latency per emitted token, hundreds per step.
    """

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], labels: dict[str, str]
    ) -> None:
        if list(buckets) != sorted(buckets) or not buckets:
            raise ValueError("buckets must be a non-empty increasing sequence")
        self.name = name
        self.documentation = documentation
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self.labels = labels
        self.counts = np.zeros(self.bounds.size + 1, dtype=np.int64)  # last: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[int(np.searchsorted(self.bounds, value, side="left"))] += 1
        self.sum += value

    def observe_many(self, values: Sequence[float]) -> None:
        if not values:
            return
        arr = np.asarray(values, dtype=np.float64)
        index = np.searchsorted(self.bounds, arr, side="left")  # value <= bound: "le"
        self.counts += np.bincount(index, minlength=self.counts.size)
        self.sum += float(arr.sum())

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))
        cumulative = np.cumsum(self.counts).tolist()
        bounds = [floatToGoString(b) for b in self.bounds.tolist()] + ["+Inf"]
        family.add_metric(
            list(self.labels.values()), list(zip(bounds, cumulative, strict=True)), self.sum
        )
        yield family
