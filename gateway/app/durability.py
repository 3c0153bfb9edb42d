"""What the gateway says about its database: metrics of the usage writer and auth cache, and
the database part of readiness (``docs/operations/database-outage.md``).

The writer and the cache count in plain attributes (the writer from its own thread, the cache
on the event loop); :class:`DurabilityExporter` copies them into the Prometheus metrics once a
second rather than on every change, so neither hot path touches a metric lock (or, under
several workers, a memory-mapped file) per record or per request.

Readiness: a database that does not answer does not make the gateway unready on its own. The
data plane serves through an outage (keys in use from the cache, usage records buffered and
spooled), and a readiness probe that failed on every database blip would take every replica
out of its load balancer at the same moment. The gateway is unready only when it could not
serve at all: no healthy backend, or the database unreachable with no key in the cache it
could still serve (e.g. a gateway that started during the outage).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from gateway.app.metrics import GatewayMetrics

if TYPE_CHECKING:
    from gateway.app.auth import AuthCache
    from gateway.app.state import GatewayState
    from gateway.db.usage import UsageWriter

log = logging.getLogger(__name__)

EXPORT_INTERVAL_S = 1.0
_OUTCOMES = ("written", "duplicate", "spilled", "replayed", "dropped")


class DurabilityExporter:
    """Copies :class:`UsageWriter` and :class:`AuthCache` counters into :class:`GatewayMetrics`
    (counters by their increase since the last copy)."""

    def __init__(self, metrics: GatewayMetrics, writer: UsageWriter, auth: AuthCache) -> None:
        self.metrics = metrics
        self.writer = writer
        self.auth = auth
        self._last: dict[str, int] = dict.fromkeys((*_OUTCOMES, "stale"), 0)
        for outcome in _OUTCOMES:  # exported at 0 from the start: an alert on `dropped`
            metrics.usage_records.labels(outcome)  # rising needs the series before it rises

    def export(self) -> None:
        writer, metrics = self.writer, self.metrics
        now = {
            "written": writer.written,
            "duplicate": writer.duplicates,
            "spilled": writer.spilled,
            "replayed": writer.replayed,
            "dropped": writer.dropped,
            "stale": self.auth.stale_served,
        }
        for name, value in now.items():
            delta = value - self._last[name]
            if delta > 0:
                if name == "stale":
                    metrics.auth_stale.inc(delta)
                else:
                    metrics.usage_records.labels(name).inc(delta)
            self._last[name] = value
        metrics.usage_buffered.set(writer.buffered)
        metrics.usage_spooled.set(writer.spooled)
        metrics.usage_spool_bytes.set(writer.spool_bytes)
        metrics.database_unavailable.set(int(writer.failing or self.auth.database_down))

    async def run(self) -> None:
        """Export every :data:`EXPORT_INTERVAL_S` until cancelled (then once more)."""
        try:
            while True:
                self.export()
                await asyncio.sleep(EXPORT_INTERVAL_S)
        finally:
            with contextlib.suppress(Exception):
                self.export()


def database_ok(state: GatewayState) -> bool:
    """Whether the database answers a trivial query now (a worker thread's call)."""
    try:
        with state.session_factory() as session:
            session.execute(text("SELECT 1"))
    except Exception:
        return False
    return True


async def database_readiness(state: GatewayState) -> tuple[bool, dict[str, Any]]:
    """Whether the database side lets the gateway serve, and readiness's fields for it:
    ``database`` (``ok`` / ``unreachable``), ``degraded`` (serving from the cache and buffering
    usage), and the usage writer's backlog."""
    reachable = await asyncio.to_thread(database_ok, state)
    writer = state.usage_writer
    fields: dict[str, Any] = {
        "database": "ok" if reachable else "unreachable",
        "degraded": not reachable or writer.failing,
        "usage_buffered": writer.buffered,
        "usage_spooled": writer.spooled,
    }
    return reachable or state.auth.can_serve_stale(), fields
