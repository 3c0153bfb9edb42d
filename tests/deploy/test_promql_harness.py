"""The monitoring proof's own logic, without Prometheus: what it substitutes into a dashboard's
queries and what it evaluates for an alert that is rightly quiet (a mistake here would make the
proof pass on panels it never ran, or fail on alerts that are fine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy/local"))

import prometheus_config as promcfg
from promql_harness import (
    Value,
    dashboard_queries,
    has_data,
    panels,
    substitute,
    underlying,
)

VALUES = {
    "tier": Value(("premium", "standard"), multi=True),
    "tenant": Value(("a.b", "c"), all_value=".*", multi=True),
    "backend": Value(("nvidia-a100-0",)),
}


def test_variables_take_grafanas_default_view_forms() -> None:
    expr = (
        'sum by (tier) (rate(m{tier=~"$tier", tenant=~"${tenant}", backend="$backend"}'
        "[$__rate_interval])) / [[backend]] and $__range"
    )
    assert substitute(expr, VALUES) == (
        'sum by (tier) (rate(m{tier=~"(premium|standard)", tenant=~".*", '
        'backend="nvidia-a100-0"}[1m])) / nvidia-a100-0 and 5m'
    )


def test_a_multi_value_in_a_regex_is_escaped_and_an_unknown_variable_is_left_alone() -> None:
    values = {"tenant": Value(("a.b", "c+d"), multi=True)}
    assert substitute('x{tenant=~"$tenant"} $unknown', values) == (
        'x{tenant=~"(a\\.b|c\\+d)"} $unknown'
    )


def test_panels_inside_collapsed_rows_are_found_and_rows_are_not_panels() -> None:
    dashboard = {
        "panels": [
            {"type": "row", "title": "r", "panels": [{"title": "inner", "targets": []}]},
            {"type": "stat", "title": "outer", "targets": [{"refId": "A", "expr": "up"}]},
            {"type": "text", "title": "note"},
        ]
    }
    assert [p["title"] for p in panels(dashboard)] == ["inner", "outer", "note"]
    queries = dashboard_queries("d.json", dashboard, {})
    assert [(q.panel, q.ref, q.expr) for q in queries] == [("outer", "A", "up")]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("tiergate_backend_healthy == 0", ["tiergate_backend_healthy"]),
        ("(a > 1)", ["a"]),
        ("max_over_time(x[5m]) >= 1000", ["max_over_time(x[5m])"]),
        (
            "(sum(rate(e[5m])) / sum(rate(t[5m]))) > (14.4 * 0.01) "
            "and (sum(rate(e[1h])) / sum(rate(t[1h]))) > (14.4 * 0.01)",
            ["sum(rate(e[5m])) / sum(rate(t[5m]))", "sum(rate(e[1h])) / sum(rate(t[1h]))"],
        ),
        ("abs(beta - 1) > 0.3 or beta < 0", ["abs(beta - 1)", "beta"]),
        ("up == 0 unless on(instance) maintenance", ["up"]),
        ('absent(up{job="engines"})', ['up{job="engines"}']),
        ("absent_over_time(up[5m])", ["up"]),
        ("a > on(tier) group_left() b", ["a"]),
        ('rate(x{reason=">"}[1m])', ['rate(x{reason=">"}[1m])']),
        ("(a) / (b)", ["(a) / (b)"]),
    ],
)
def test_an_alerts_underlying_quantities_are_its_compared_sides(
    expr: str, expected: list[str]
) -> None:
    assert underlying(expr) == expected


def test_nan_and_empty_results_are_no_data() -> None:
    assert not has_data([])
    assert not has_data([{"metric": {}, "values": [[1, "NaN"], [2, "NaN"]]}])
    assert has_data([{"metric": {}, "values": [[1, "NaN"], [2, "0"]]}])
    assert has_data([{"metric": {}, "value": [1, "3"]}])


def test_the_local_scrape_config_keeps_the_jobs_and_replaces_discovery() -> None:
    template = {
        "global": {"scrape_interval": "15s", "external_labels": {"site": "x"}},
        "rule_files": ["/etc/prometheus/rules/*.yml"],
        "scrape_configs": [
            {
                "job_name": "tiergate-gateway",
                "metrics_path": "/metrics",
                "kubernetes_sd_configs": [{"role": "pod"}],
                "relabel_configs": [{"action": "keep"}],
                "scrape_interval": "30s",
            },
            {"job_name": "vllm-engines", "static_configs": [{"targets": ["vllm:8000"]}]},
            {"job_name": "unrelated-exporter", "static_configs": [{"targets": ["x:1"]}]},
        ],
    }
    targets = {
        "gateways": [promcfg.Target("127.0.0.1:9464", {"instance": "gateway-0"})],
        "engines": [promcfg.Target("127.0.0.1:8200", {"backend": "nvidia-a100-0"})],
        "prometheus": [promcfg.Target("127.0.0.1:9190")],
    }
    config = promcfg.local_config(
        template,
        targets,
        scrape_interval="1s",
        evaluation_interval="1s",
        rule_files=[Path("/r/a.yml")],
    )
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"tiergate-gateway", "vllm-engines", "prometheus"}  # nothing else here
    assert jobs["tiergate-gateway"] == {
        "job_name": "tiergate-gateway",
        "metrics_path": "/metrics",
        "static_configs": [{"targets": ["127.0.0.1:9464"], "labels": {"instance": "gateway-0"}}],
    }
    assert jobs["vllm-engines"]["static_configs"] == [
        {"targets": ["127.0.0.1:8200"], "labels": {"backend": "nvidia-a100-0"}}
    ]
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["127.0.0.1:9190"]}]
    assert config["global"] == {
        "scrape_interval": "1s",
        "evaluation_interval": "1s",
        "scrape_timeout": "1s",
        "external_labels": {"site": "x"},
    }
    assert config["rule_files"] == ["/r/a.yml"]
