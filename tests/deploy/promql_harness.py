"""Evaluating what Grafana and Prometheus would run, through a real Prometheus's HTTP API.

Three jobs: the queries of a dashboard JSON (every panel's targets, template variables
substituted the way Grafana does for a default view), the underlying quantity of an alert
expression (its comparisons and ``absent()`` taken away, so that an alert that is rightly quiet
can still be shown to look at data), and a small client for ``/api/v1/query_range``,
``/api/v1/rules`` and the label values a template variable lists.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
}
"""Grafana's own variables, as a five-minute view at a 15 s step would give them."""

_VAR = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)\]\]|\$(\w+)")
_REGEX_OP = re.compile(r"[=!]~\s*\"?$")


# ---- a Prometheus client ---------------------------------------------------------------------


class Prometheus:
    """The HTTP API of one Prometheus server (no proxy: it is on 127.0.0.1)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(self, path: str, **params: str | Sequence[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with self._opener.open(f"{self.url}{path}?{query}", timeout=30) as response:
                document = json.load(response)
        except urllib.error.HTTPError as exc:  # a bad query: 400 with Prometheus's reason
            raise RuntimeError(f"{path}: {exc.code} {exc.read().decode(errors='replace')}") from exc
        if document.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {document}")
        return document["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Any]:
        """The series ``expr`` gives over ``[start, end]``; raises on a query error."""
        data = self.get(
            "/api/v1/query_range",
            query=expr,
            start=f"{start:.3f}",
            end=f"{end:.3f}",
            step=str(step),
        )
        return list(data["result"])

    def query(self, expr: str, at: float | None = None) -> list[Any]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.get("/api/v1/query", **params)
        result = data["result"]
        return result if isinstance(result, list) else [result]

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params: dict[str, str | Sequence[str]] = {"match[]": [match]} if match else {}
        return sorted(self.get(f"/api/v1/label/{label}/values", **params))

    def rules(self) -> list[dict[str, Any]]:
        """Every rule of every group, each with its group's name added as ``group``."""
        found = []
        for group in self.get("/api/v1/rules")["groups"]:
            for rule in group["rules"]:
                found.append({**rule, "group": group["name"]})
        return found


def has_data(result: Sequence[Any]) -> bool:
    """Whether a query result holds at least one finite number (NaN is Grafana's "no data"
    for a graph as much as an empty result)."""
    for series in result:
        values = series.get("values") or ([series["value"]] if "value" in series else [])
        for _, value in values:
            if math.isfinite(float(value)):
                return True
    return False


# ---- dashboards ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel, with its expression as written and as substituted."""

    dashboard: str
    panel: str
    ref: str
    raw: str
    expr: str


def panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel, those inside collapsed rows included (rows themselves are not panels)."""
    for panel in dashboard.get("panels") or []:
        if panel.get("type") == "row":
            yield from panel.get("panels") or []
        else:
            yield panel


def variables(dashboard: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((dashboard.get("templating") or {}).get("list") or [])


def variable_query(variable: Mapping[str, Any]) -> str:
    """A query variable's query text (a string, or ``{"query": ...}`` in newer schemas)."""
    query = variable.get("query")
    if isinstance(query, Mapping):
        query = query.get("query")
    return str(query or variable.get("definition") or "")


def resolve_variable(prom: Prometheus, query: str) -> list[str]:
    """What Grafana's Prometheus data source lists for a query variable."""
    text = query.strip()
    match = re.fullmatch(r"label_values\(\s*(.*?)\s*,\s*(\w+)\s*\)", text, re.S)
    if match:
        return prom.label_values(match.group(2), match.group(1) or None)
    match = re.fullmatch(r"label_values\(\s*(\w+)\s*\)", text)
    if match:
        return prom.label_values(match.group(1))
    match = re.fullmatch(r"label_names\(\s*(.*?)\s*\)", text, re.S)
    if match:
        return sorted(prom.get("/api/v1/labels"))
    match = re.fullmatch(r"query_result\((.*)\)", text, re.S)
    if match:
        return [json.dumps(s["metric"]) for s in prom.query(match.group(1))]
    match = re.fullmatch(r"metrics\((.*)\)", text, re.S)
    if match:
        pattern = re.compile(match.group(1))
        return [n for n in prom.label_values("__name__") if pattern.search(n)]
    raise ValueError(f"unsupported variable query: {query!r}")


@dataclass(frozen=True)
class Value:
    """A variable's value in the default view: its values, and whether "All" is selected."""

    values: tuple[str, ...]
    all_value: str | None = None
    multi: bool = False

    def render(self, regex_context: bool) -> str:
        if self.all_value is not None:
            return self.all_value
        if regex_context and (self.multi or len(self.values) > 1):
            escaped = [re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", v) for v in self.values]
            return "(" + "|".join(escaped) + ")" if len(escaped) > 1 else escaped[0]
        return self.values[0] if self.values else ""


def substitute(expr: str, values: Mapping[str, Value]) -> str:
    """``expr`` with ``$var``, ``${var}``, ``${var:fmt}`` and ``[[var]]`` replaced (regex
    form after ``=~``/``!~``, as Grafana formats multi-value and "All" selections)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        if name not in values:
            return match.group(0)
        before = expr[: match.start()]
        return values[name].render(bool(_REGEX_OP.search(before)))

    return _VAR.sub(replace, expr)


def dashboard_values(prom: Prometheus, dashboard: Mapping[str, Any]) -> dict[str, Value]:
    """Each template variable's default-view value, query variables asked of Prometheus (in
    order: a variable may use the ones before it). A variable that lists nothing raises."""
    values: dict[str, Value] = {}
    for variable in variables(dashboard):
        name, kind = str(variable["name"]), variable.get("type", "query")
        multi = bool(variable.get("multi"))
        if kind == "datasource":
            continue
        if kind == "query":
            listed = resolve_variable(prom, substitute(variable_query(variable), values))
            if variable.get("regex"):
                pattern = re.compile(str(variable["regex"]).strip("/"))
                listed = [v for v in listed if pattern.search(v)]
            if not listed:
                raise LookupError(f"variable ${name} lists nothing: {variable_query(variable)}")
        elif kind == "custom":
            listed = [v.strip() for v in str(variable.get("query", "")).split(",") if v.strip()]
        elif kind == "interval":
            listed = ["1m"]
        else:  # constant, textbox
            listed = [str(variable.get("query", ""))]
        all_value = None
        if variable.get("includeAll"):
            all_value = variable.get("allValue") or None
            multi = True
        values[name] = Value(tuple(listed), all_value, multi)
    return values


def dashboard_queries(
    name: str, dashboard: Mapping[str, Any], values: Mapping[str, Value]
) -> list[PanelQuery]:
    """Every Prometheus expression of every panel, substituted."""
    found = []
    for panel in panels(dashboard):
        title = str(panel.get("title") or f"panel {panel.get('id')}")
        for target in panel.get("targets") or []:
            raw = target.get("expr")
            if not raw:
                continue
            found.append(
                PanelQuery(name, title, str(target.get("refId", "")), raw, substitute(raw, values))
            )
    return found


# ---- alert expressions -----------------------------------------------------------------------

_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(\s*bool\b)?")
_SET_OP = re.compile(r"\b(and|or|unless)\b")
_MODIFIER = re.compile(r"^\s*(on|ignoring|group_left|group_right)\s*(\([^)]*\))?", re.I)


def _top_level(expr: str) -> Iterator[int]:
    """Offsets of ``expr`` outside any parentheses, brackets, braces or string."""
    depth, quote = 0, ""
    for i, char in enumerate(expr):
        if quote:
            if char == quote and expr[i - 1] != "\\":
                quote = ""
            continue
        if char in "\"'`":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0:
            yield i


def _strip_parens(expr: str) -> str:
    """``expr`` without parentheses around all of it."""
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")"):
        if any(True for _ in _top_level(expr)):  # the first "(" closes before the end
            break
        expr = expr[1:-1].strip()
    return expr


def _split_top(expr: str, pattern: re.Pattern[str]) -> tuple[str, str, str] | None:
    """The first top-level match of ``pattern``: (left, operator, right)."""
    top = set(_top_level(expr))
    for match in pattern.finditer(expr):
        if match.start() in top:
            if match.group(1) in ("<", ">") and expr[match.start() - 1 : match.start()] == "=":
                continue
            return expr[: match.start()], match.group(0), expr[match.end() :]
    return None


def underlying(expr: str) -> list[str]:
    """The quantities an alert expression compares against thresholds: each operand of a
    top-level ``and``/``or`` (the left of ``unless``), each comparison's left side, the
    argument of ``absent``/``absent_over_time``. An expression without any is itself."""
    expr = _strip_parens(expr)
    split = _split_top(expr, _SET_OP)
    if split is not None:
        left, op, right = split
        right = _MODIFIER.sub("", right, count=1)
        parts = underlying(left)
        if op.strip() != "unless":
            parts += underlying(right)
        return parts
    split = _split_top(expr, _COMPARISON)
    if split is not None and not split[1].rstrip().endswith("bool"):
        return underlying(split[0])
    match = re.fullmatch(r"absent(_over_time)?\((.*)\)", expr, re.S)
    if match:
        inner = match.group(2).strip()
        if match.group(1):  # absent_over_time(v[range]): the vector
            inner = re.sub(r"\[[^\]]*\]$", "", inner)
        return [inner]
    return [expr]
