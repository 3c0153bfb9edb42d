"""The Grafana dashboards as code (``deploy/grafana/``): generated, valid, and reading real metrics.

* the committed JSON is exactly what ``deploy/grafana/generate.py`` writes;
* each dashboard decodes into Grafana's types (``grafana-foundation-sdk``, generated from
  Grafana's schema) with nothing left over, and every field holds the type the schema gives it;
* every panel has a title, a unique id, a description and a query on the template's data source;
* every metric a query reads is one the code defines (catches typos and renames);
* the template variables are the ones the issue asks for, and the provisioning files point at
  the dashboards and a Prometheus data source;
* ``docs/operations/dashboards.md`` describes every panel.

Whether each query returns data on a real Prometheus scraping a real gateway is
``test_monitoring_proof.py``'s job.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import re
import sys
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from metric_names import ROOT, defined_metrics, exposed_names, metric_names, recorded_names

sdk = pytest.importorskip(
    "grafana_foundation_sdk", reason="grafana-foundation-sdk is a development dependency"
)
from grafana_foundation_sdk.cog.plugins import register_default_plugins  # noqa: E402
from grafana_foundation_sdk.models import dashboard as model  # noqa: E402

GRAFANA = ROOT / "deploy/grafana"
DASHBOARDS = {
    path.stem: json.loads(path.read_text())
    for path in sorted((GRAFANA / "dashboards").glob("*.json"))
}
EXPECTED = {"fleet-slo", "tenants", "backends", "gateway"}
VARIABLE = re.compile(r"\$\{?(\w+)")
VARIABLES = {
    "fleet-slo": {"datasource", "tier"},
    "tenants": {"datasource", "tier", "tenant"},
    "backends": {"datasource", "tier", "backend"},
    "gateway": {"datasource"},
}


def _generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        "tiergate_grafana_generate", GRAFANA / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


GENERATE = _generator()


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows and panels inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(panel title, expr)`` of every query target."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel.get("title", "?"), target.get("expr", "")


# ---- generated -----------------------------------------------------------------------------


def test_the_four_dashboards_are_there() -> None:
    assert set(DASHBOARDS) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_committed_json_is_what_the_generator_writes(name: str) -> None:
    committed = (GRAFANA / "dashboards" / f"{name}.json").read_text()
    assert committed == GENERATE.render(name), (
        f"{name}.json is stale: run python deploy/grafana/generate.py"
    )


def test_the_generators_check_mode_agrees(capsys: pytest.CaptureFixture[str]) -> None:
    assert GENERATE.main(["--check"]) == 0, capsys.readouterr().out


# ---- Grafana's schema ----------------------------------------------------------------------


def check_types(value: Any, hint: Any, path: str, errors: list[str]) -> None:
    """Check ``value`` (a decoded SDK object or a plain value) against the type ``hint`` the SDK
    declares for it, recursively."""
    origin = typing.get_origin(hint)
    if hint is typing.Any or hint is object:
        return
    if origin is typing.Union or origin is types.UnionType:
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return
        if hasattr(value, "to_json") and type(value) in options:  # a decoded model
            check_types(value, type(value), path, errors)
            return
        shaped = [o for o in options if typing.get_origin(o) is type(value)]  # list, dict
        if len(shaped) == 1:  # the one option of this shape: its errors are the ones to say
            check_types(value, shaped[0], path, errors)
            return
        for option in options:
            if option is type(None):
                continue
            found: list[str] = []
            check_types(value, option, path, found)
            if not found:
                return
        errors.append(f"{path}: {value!r} matches none of {hint}")
        return
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            errors.append(f"{path}: {value!r} not one of {typing.get_args(hint)}")
        return
    if origin is list:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        (item,) = typing.get_args(hint)
        for i, element in enumerate(value):
            check_types(element, item, f"{path}[{i}]", errors)
        return
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected an object, got {type(value).__name__}")
            return
        key_type, value_type = typing.get_args(hint)
        for key, element in value.items():
            check_types(key, key_type, f"{path}.<key>", errors)
            check_types(element, value_type, f"{path}.{key}", errors)
        return
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            hint(value)
        except ValueError:
            errors.append(f"{path}: {value!r} is not a {hint.__name__}")
        return
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            errors.append(f"{path}: expected a number, got {value!r}")
        return
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{path}: expected an integer, got {value!r}")
        return
    if hint in (str, bool):
        if not isinstance(value, hint):
            errors.append(f"{path}: expected {hint.__name__}, got {value!r}")
        return
    if isinstance(hint, type):
        if not isinstance(value, hint):
            errors.append(f"{path}: expected {hint.__name__}, got {type(value).__name__}")
            return
        if hasattr(value, "to_json"):  # an SDK model: its own fields, by their declared types
            module = sys.modules[type(value).__module__]
            hints = typing.get_type_hints(type(value), vars(module))
            for field, field_hint in hints.items():
                check_types(getattr(value, field), field_hint, f"{path}.{field}", errors)
        return
    errors.append(f"{path}: unchecked type {hint!r}")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_dashboard_matches_grafanas_schema(name: str) -> None:
    register_default_plugins()  # panel options and Prometheus queries decode to their types
    data = DASHBOARDS[name]
    decoded = model.Dashboard.from_json(data)
    # nothing unknown to the schema (an unknown key would be dropped by the round trip)...
    reencoded = json.loads(json.dumps(decoded, default=lambda o: o.to_json(), sort_keys=True))
    assert reencoded == data
    # ...and every known key holds the type the schema declares
    errors: list[str] = []
    check_types(decoded, model.Dashboard, name, errors)
    assert not errors, "\n".join(errors[:20])
    for panel in decoded.panels or []:
        if isinstance(panel, model.Panel):  # options of the panel's own plugin, decoded
            assert not isinstance(panel.options, dict), f"{panel.title}: options not decoded"
            for target in panel.targets or []:
                assert type(target).__module__.endswith(".prometheus"), panel.title


def test_schema_check_catches_a_wrong_type() -> None:
    """The checker above is not vacuous: a string where the schema wants a number fails."""
    register_default_plugins()
    broken = json.loads(json.dumps(DASHBOARDS["gateway"]))
    broken["panels"][1]["gridPos"]["w"] = "wide"
    errors: list[str] = []
    check_types(model.Dashboard.from_json(broken), model.Dashboard, "gateway", errors)
    assert any("grid_pos.w" in e and "'wide'" in e for e in errors), errors
    broken = json.loads(json.dumps(DASHBOARDS["gateway"]))
    broken["panels"][1]["notAGrafanaKey"] = 1
    decoded = model.Dashboard.from_json(broken)
    assert json.loads(json.dumps(decoded, default=lambda o: o.to_json())) != broken


# ---- panels and queries --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_panel_has_a_query_an_id_and_a_title(name: str) -> None:
    seen: set[int] = set()
    content = 0
    for panel in panels(DASHBOARDS[name]):
        assert isinstance(panel.get("id"), int), panel
        assert panel["id"] not in seen, f"{name}: id {panel['id']} twice"
        seen.add(panel["id"])
        assert panel.get("title", "").strip(), f"{name}: panel {panel['id']} has no title"
        if panel["type"] == "row":
            continue
        content += 1
        assert panel.get("description", "").strip(), f"{name}: {panel['title']}: no description"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        targets = panel.get("targets") or []
        assert targets, f"{name}: {panel['title']} has no query"
        refs = [t["refId"] for t in targets]
        assert len(set(refs)) == len(refs), f"{name}: {panel['title']}: refId twice"
        for target in targets:
            assert target.get("expr", "").strip(), f"{name}: {panel['title']}: empty query"
            assert target["datasource"] == panel["datasource"]
    assert content >= 6, f"{name}: only {content} panels"


def test_every_metric_a_query_reads_is_defined_in_the_code() -> None:
    defined = exposed_names(defined_metrics())
    recorded = recorded_names((ROOT / "deploy/prometheus/rules").glob("*.yml"))
    unknown = {
        (name, title, metric)
        for name, dashboard in DASHBOARDS.items()
        for title, expr in queries(dashboard)
        for metric in metric_names(expr)
        if metric not in defined | recorded
    }
    assert not unknown, sorted(unknown)


def test_the_metric_check_catches_a_typo() -> None:
    defined = exposed_names(defined_metrics())
    assert "tiergate_requests_total" in defined and "vllm:kv_cache_usage_perc" in defined
    assert "tiergate:estimator_beta" in defined  # the vLLM plugin's, parsed not imported
    assert "tiergate_gateway_overhead_seconds_bucket" in defined
    typo = 'sum(rate(tiergate_request_total{tier="x"}[5m])) / sum(tiergate:estimator_bta)'
    assert metric_names(typo) - defined == {"tiergate_request_total", "tiergate:estimator_bta"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_queries_use_only_the_dashboards_variables(name: str) -> None:
    declared = {v["name"] for v in DASHBOARDS[name]["templating"]["list"]}
    assert declared == VARIABLES[name]
    allowed = declared | {"__rate_interval", "__range", "__interval"}
    for title, expr in queries(DASHBOARDS[name]):
        used = set(VARIABLE.findall(expr))
        assert used <= allowed, f"{name}: {title}: {used - allowed}"
        for variable in ("tier", "tenant", "backend"):  # multi-value: matched as a regex
            assert f'="${variable}"' not in expr, f"{name}: {title}: use =~ for ${variable}"


def test_template_variables_are_multi_value_with_a_regex_all() -> None:
    for name, dashboard in DASHBOARDS.items():
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "datasource":
                assert variable["query"] == "prometheus"
                continue
            assert variable["type"] == "query", (name, variable["name"])
            assert variable["multi"] and variable["includeAll"], (name, variable["name"])
            assert variable["allValue"] == ".*", (name, variable["name"])
            assert metric_names(variable["query"]) <= exposed_names(defined_metrics())


# ---- provisioning and docs -----------------------------------------------------------------


def test_provisioning_points_at_the_dashboards_and_a_prometheus() -> None:
    (datasources,) = (GRAFANA / "provisioning/datasources").glob("*.yaml")
    document = yaml.safe_load(datasources.read_text())
    assert document["apiVersion"] == 1
    (source,) = document["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    (providers,) = (GRAFANA / "provisioning/dashboards").glob("*.yaml")
    (provider,) = yaml.safe_load(providers.read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")


def test_the_docs_describe_every_panel() -> None:
    docs = (ROOT / "docs/operations/dashboards.md").read_text()
    missing = [
        f"{name}: {panel['title']}"
        for name, dashboard in DASHBOARDS.items()
        for panel in panels(dashboard)
        if panel["type"] != "row" and panel["title"] not in docs
    ]
    assert not missing, missing
