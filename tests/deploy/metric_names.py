"""The metric names tiergate's code defines, read from its source, and the names a query uses.

The dashboards and the Prometheus rules are checked against these, so a typo in a query (or a
metric renamed in code and not in a dashboard) fails a test instead of drawing an empty panel.
The definitions are parsed, not imported: the vLLM stat logger imports vLLM, which is not
installed where these tests run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEFINITIONS = (
    "gateway/app/metrics.py",
    "gateway/app/operator.py",
    "engine_emulated/metrics.py",
    "engine_common/stat_logger.py",
)
"""Where every metric the dashboards and rules may read is defined: the gateway's, the emulated
engines' (vLLM's names) and the vLLM plugin's ``tiergate:*`` gauges."""

KINDS = {
    "Counter": "counter",
    "TenantCounter": "counter",
    "__init__": "counter",  # RequestCounter's super().__init__(name, ...): a TenantCounter
    "Gauge": "gauge",
    "gauge": "gauge",
    "Histogram": "histogram",
    "BatchHistogram": "histogram",
    "histogram": "histogram",
}
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}
PREFIXES = ("tiergate_", "tiergate:", "vllm:")
BUILTIN_SERIES = {"up"}
"""Series Prometheus writes itself."""

_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _metric_literal(node: ast.AST) -> str | None:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith(PREFIXES)
    ):
        return node.value
    return None


def defined_metrics(root: Path = ROOT) -> dict[str, str]:
    """``{name: kind}`` of every metric created in :data:`DEFINITIONS` (the name as passed to
    prometheus_client: a counter without its ``_total``)."""
    found: dict[str, str] = {}
    for relative in DEFINITIONS:
        tree = ast.parse((root / relative).read_text(), relative)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                name = _metric_literal(node.args[0])
                kind = KINDS.get(_call_name(node))
                if name is not None and kind is not None:
                    found[name] = kind
            elif isinstance(node, ast.Tuple) and node.elts:
                # the gauge specs of the plugin and the emulation: (name, documentation)
                name = _metric_literal(node.elts[0])
                if name is not None and name.startswith("tiergate:") and len(node.elts) == 2:
                    found.setdefault(name, "gauge")
    return found


def exposed_names(definitions: dict[str, str]) -> set[str]:
    """Every series name the definitions put in an exposition (``_total``, ``_bucket``...)."""
    return {
        name + suffix for name, kind in definitions.items() for suffix in SUFFIXES[kind]
    } | BUILTIN_SERIES


def recorded_names(rule_files: Iterable[Path]) -> set[str]:
    """The series the recording rules write."""
    names = set()
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {rule["record"] for rule in group["rules"] if "record" in rule}
    return names


def metric_names(expr: str) -> set[str]:
    """The tiergate and vLLM series names a PromQL expression reads (string literals, such as
    label values, left out)."""
    bare = _STRING.sub('""', expr)
    return {
        token
        for token in _IDENT.findall(bare)
        if token.startswith(PREFIXES) or ":tiergate_" in token or token in BUILTIN_SERIES
    }
