"""Metrics across gateway workers: prometheus_client's multiprocess mode, in one place.

``tiergate serve --workers N`` sets ``PROMETHEUS_MULTIPROC_DIR`` to a fresh directory before it
starts the workers; prometheus_client then keeps every worker's values in memory-mapped files
there (chosen when prometheus_client is imported, so the variable must be set before: the
supervisor sets it in its environment and *spawns* the workers). The supervisor serves the
merged exposition (:func:`render_multiprocess`): counters are summed over workers (a dead
worker's counts stay in), histograms merged bucket by bucket, and each gauge combined as its
``multiprocess_mode`` says (:func:`gateway.app.metrics.gauge` makes every gateway gauge name
one). When a worker exits, :func:`forget_process` drops its ``live*`` gauges.

One process, no variable: none of this is used and the metrics stay in memory as before.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess

ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The directory this process writes its metrics to, or None (single process)."""
    return os.environ.get(ENV) or None


HEADER_BYTES = 8
"""A metrics file's header (its used length, then padding): a file shorter than this is one a
worker is creating right now (prometheus_client opens it, then sizes it)."""


class _SettledFilesCollector(multiprocess.MultiProcessCollector):
    """prometheus_client's collector, minus the files a worker is still creating: a worker's
    first value of a new kind of metric creates its file, and reading it in the instant between
    its creation and its sizing fails the whole exposition (a 500 seen in CI). Such a file holds
    no value yet, so leaving it out loses nothing."""

    def collect(self):  # type: ignore[no-untyped-def,unused-ignore]
        files = [f for f in glob.glob(os.path.join(self._path, "*.db")) if _settled(f)]
        return self.merge(files, accumulate=True)


def _settled(path: str) -> bool:
    try:
        return os.path.getsize(path) >= HEADER_BYTES
    except OSError:  # gone meanwhile (a dead worker's live gauges)
        return False


def render_multiprocess(path: str) -> bytes:
    """The exposition of every process that wrote to ``path``, merged."""
    registry = CollectorRegistry(auto_describe=False)
    _SettledFilesCollector(registry, path=path)
    return generate_latest(registry)


def forget_process(pid: int, path: str) -> None:
    """A worker exited: its ``live*`` gauges no longer count (its counters still do)."""
    multiprocess.mark_process_dead(pid, path)


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe`` for each value, in one numpy pass: one increment per bucket hit.

    For multiprocess mode, where :class:`~gateway.histogram.BatchHistogram` (numpy counts in
    this process's memory) cannot be merged across workers. It writes the counts into the
    histogram's own values (non-cumulative per bucket, as ``Histogram.observe`` stores them),
    so the merged exposition is exactly that of observing each value.
    """
    if not values:
        return
    bounds = histogram._upper_bounds  # ends with +Inf
    buckets = histogram._buckets
    arr = np.asarray(values, dtype=np.float64)
    counts = np.bincount(np.searchsorted(bounds, arr, side="left"), minlength=len(bounds))
    for index in np.flatnonzero(counts).tolist():
        buckets[index].inc(int(counts[index]))
    histogram._sum.inc(float(arr.sum()))
