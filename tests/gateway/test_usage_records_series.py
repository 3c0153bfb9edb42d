"""``tiergate_usage_records_total`` has every outcome from the start, at 0: an alert on
``increase(...{outcome="dropped"}[10m]) > 0`` can only ever fire on a series that exists before
the first record is lost (Prometheus's ``increase`` needs two samples of it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gateway.app.durability import DurabilityExporter
from gateway.app.metrics import GatewayMetrics


def test_every_usage_outcome_is_exported_at_zero_before_any_record() -> None:
    metrics = GatewayMetrics()
    writer: Any = SimpleNamespace()
    auth: Any = SimpleNamespace()
    DurabilityExporter(metrics, writer, auth)
    text = metrics.render().decode()
    for outcome in ("written", "duplicate", "spilled", "replayed", "dropped"):
        assert f'tiergate_usage_records_total{{outcome="{outcome}"}} 0.0' in text
