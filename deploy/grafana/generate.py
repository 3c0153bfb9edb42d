"""tiergate's Grafana dashboards as code: writes ``deploy/grafana/dashboards/*.json``.

Built with Grafana's own types and builders (``grafana-foundation-sdk``, the Grafana 11.6
release: the types are generated from Grafana's schema), so a panel option Grafana does not know
cannot be written. ``tests/deploy/test_dashboards.py`` checks that the committed JSON is what
this writes, validates it against the SDK's types, and that every metric a query names is one
the code defines.

    python deploy/grafana/generate.py          # write the dashboards
    python deploy/grafana/generate.py --check  # exit 1 if a committed file differs

Queries name only the template variables ``$datasource``, ``$tier``, ``$tenant``, ``$backend``
and Grafana's ``$__rate_interval`` / ``$__range``. Counters that move only on rare events
(rejections, demotions, failovers) end in ``or on() vector(0)``, so a quiet fleet shows a flat
zero rather than "No data" (a missing series and a healthy zero look alike otherwise).
Attainment ratios add the missing side as zero (``(met or total * 0) / total``), so a tier
whose every request missed reads 0 rather than nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import (
    common,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    timeseries,
)
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    GraphThresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
    VisibilityMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
ZERO = " or on() vector(0)"
TAG = "tiergate"

Builder = Any  # a panel builder of the SDK (timeseries, stat, ...): they share no base class


def q(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    """A range query on the dashboard's Prometheus."""
    query = prometheus.Dataquery().expr(" ".join(expr.split())).ref_id(ref).datasource(DS)
    return query.legend_format(legend) if legend else query


def ratio(metric: str, by: str, selector: str, good: str, window: str = RATE) -> str:
    """Share of ``metric``'s rate that is ``good`` (a label matcher), by ``by``; zero rather
    than no data where no good sample exists yet."""
    total = f"sum by ({by}) (rate({metric}{{{selector}}}[{window}]))"
    met = f"sum by ({by}) (rate({metric}{{{selector}, {good}}}[{window}]))"
    return f"({met} or {total} * 0) / {total}"


def quantile(q_: float, metric: str, by: str, selector: str) -> str:
    inner = f"sum by ({by + ', ' if by else ''}le) (rate({metric}_bucket{{{selector}}}[{RATE}]))"
    return f"histogram_quantile({q_}, {inner})"


@dataclass
class Spec:
    """One panel: what the dashboards and ``docs/operations/dashboards.md`` say about it."""

    title: str
    description: str
    build: Callable[[], Builder]
    width: int = 12
    height: int = 8


@dataclass
class Board:
    """A dashboard under construction: rows of panels, ids handed out in order."""

    uid: str
    title: str
    description: str
    variables: Sequence[str]
    rows: list[tuple[str, list[Spec]]] = field(default_factory=list)

    def row(self, title: str, *panels: Spec) -> None:
        self.rows.append((title, list(panels)))

    def build(self) -> dict[str, Any]:
        dash = (
            Dashboard(self.title)
            .uid(self.uid)
            .description(self.description)
            .tags([TAG])
            .time("now-1h", "now")
            .refresh("30s")
            .timezone("browser")
            .tooltip(DashboardCursorSync.CROSSHAIR)
            .editable()
            .link(
                DashboardLink("tiergate")
                .type(DashboardLinkType.DASHBOARDS)
                .tags([TAG])
                .as_dropdown(True)
                .include_vars(True)
                .keep_time(True)
            )
        )
        for variable in variables(self.variables):
            dash = dash.with_variable(variable)
        next_id = 1
        for title, specs in self.rows:
            dash = dash.with_row(Row(title).id(next_id))
            next_id += 1
            for spec in specs:
                panel = (
                    spec.build()
                    .id(next_id)
                    .title(spec.title)
                    .description(spec.description)
                    .datasource(DS)
                    .span(spec.width)
                    .height(spec.height)
                )
                dash = dash.with_panel(panel)
                next_id += 1
        encoded = json.loads(JSONEncoder(sort_keys=True).encode(dash.build()))
        assert isinstance(encoded, dict)
        return encoded


# ---- building blocks ---------------------------------------------------------------------------


def legend() -> common.VizLegendOptions:
    return (
        common.VizLegendOptions()
        .display_mode(LegendDisplayMode.TABLE)
        .placement(LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["mean", "lastNotNull", "max"])
    )


def series(
    *targets: prometheus.Dataquery,
    unit: str = "short",
    min_: float | None = 0,
    max_: float | None = None,
    stacked: bool = False,
    lines: Sequence[tuple[float, str]] = (),
) -> Callable[[], Builder]:
    """A time series panel; ``lines``: thresholds drawn as dashed lines (value, colour)."""

    def build() -> Builder:
        panel = timeseries.Panel().unit(unit).legend(legend()).fill_opacity(10).line_width(1)
        for target in targets:
            panel = panel.with_target(target)
        if min_ is not None:
            panel = panel.min(min_)
        if max_ is not None:
            panel = panel.max(max_)
        if stacked:
            panel = panel.stacking(common.StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(
                40
            )
        if lines:
            steps = [Threshold(value=None, color="transparent")]
            steps += [Threshold(value=v, color=c) for v, c in lines]
            panel = panel.thresholds(
                ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)
            ).thresholds_style(
                common.GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode.DASHED)
            )
        return panel

    return build


def stats(
    *targets: prometheus.Dataquery,
    unit: str = "short",
    steps: Sequence[tuple[float | None, str]] = ((None, "blue"),),
    decimals: int | None = None,
) -> Callable[[], Builder]:
    def build() -> Builder:
        panel = stat.Panel().unit(unit)
        for target in targets:
            panel = panel.with_target(target)
        if decimals is not None:
            panel = panel.decimals(decimals)
        return panel.thresholds(
            ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=v, color=c) for v, c in steps])
        )

    return build


def states(
    target: prometheus.Dataquery, mapping: dict[str, tuple[str, str]]
) -> Callable[[], Builder]:
    """A state timeline: each series' value over time, named and coloured by ``mapping``."""

    def build() -> Builder:
        options = {
            value: ValueMappingResult(text=text, color=color, index=i)
            for i, (value, (text, color)) in enumerate(mapping.items())
        }
        return (
            statetimeline.Panel()
            .with_target(target)
            .mappings([ValueMap(options=options)])
            .show_value(VisibilityMode.NEVER)
            .fill_opacity(80)
        )

    return build


def heat(target: prometheus.Dataquery, unit: str) -> Callable[[], Builder]:
    """A heatmap of a histogram's buckets (the query is ``sum by (le) (rate(..._bucket))``)."""

    def build() -> Builder:
        return (
            heatmap.Panel()
            .with_target(target.format(PromQueryFormat.HEATMAP))
            .calculate(False)
            .unit(unit)
            .hide_from(common.HideSeriesConfig().legend(False).tooltip(False).viz(False))
        )

    return build


# ---- template variables ------------------------------------------------------------------------


def variables(names: Sequence[str]) -> list[Builder]:
    out: list[Builder] = [
        DatasourceVariable("datasource").label("Data source").type("prometheus"),
    ]
    queries = {
        "tier": ("Tier", 'label_values(tiergate_requests_total{tier!="unauthenticated"}, tier)'),
        "tenant": ("Tenant", "label_values(tiergate_requests_total, tenant)"),
        "backend": ("Backend", "label_values(tiergate_backend_healthy, backend)"),
    }
    for name in names:
        label, query = queries[name]
        out.append(
            QueryVariable(name)
            .label(label)
            .datasource(DS)
            .query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    return out


TIER = 'tier=~"$tier"'
TENANT = 'tenant=~"$tenant", tier=~"$tier"'
BACKEND = 'backend=~"$backend"'
ADMISSION_REASONS = "rate_limit_rpm|rate_limit_tpm|concurrency|queue_full|queue_ttl|slo_.*"
LIMIT_REASONS = "rate_limit_rpm|rate_limit_tpm|concurrency"


# ---- fleet SLO ---------------------------------------------------------------------------------


def fleet_slo() -> Board:
    board = Board(
        "tiergate-fleet-slo",
        "tiergate / Fleet SLO",
        "Is each tier getting what it was promised? Gain (TDG) ratio and SLO attainment per "
        "tier, goodput, admission and the queue.",
        ("tier",),
    )
    slo = "tiergate_slo_objective_requests_total"
    board.row(
        "Service level",
        Spec(
            "TDG ratio by tier",
            "Gain earned over the gain had every token been on time (1 = every token met its "
            "deadline). The number tiergate maximises; it falls before attainment does.",
            series(
                q(
                    f"sum by (tier) (rate(tiergate_gain_total{{{TIER}}}[{RATE}]))"
                    f" / sum by (tier) (rate(tiergate_ideal_gain_total{{{TIER}}}[{RATE}]))",
                    "{{tier}}",
                ),
                unit="percentunit",
                max_=1,
            ),
        ),
        Spec(
            "SLO attainment by tier",
            "Share of finished requests that met every objective of their SLO (TTFT, mean TPOT, "
            "deadline). Dashed lines: the premium/standard/batch objectives of the alert rules.",
            series(
                q(
                    ratio("tiergate_slo_requests_total", "tier", TIER, 'attained="true"'),
                    "{{tier}}",
                ),
                unit="percentunit",
                max_=1,
                lines=((0.9, "orange"), (0.95, "yellow"), (0.99, "green")),
            ),
        ),
        Spec(
            "Attainment by objective",
            "The same samples split by objective: which one a tier misses (TTFT: queueing, "
            "prefill; TPOT: decode batches too large; deadline: both).",
            series(
                q(ratio(slo, "tier, objective", TIER, 'attained="true"'), "{{tier}} {{objective}}"),
                unit="percentunit",
                max_=1,
            ),
        ),
        Spec(
            "Error budget burn rate (1h)",
            "Errors over the last hour divided by the errors the objective allows (1 = the "
            "budget lasts exactly the SLO period; 14.4 pages). From the recording rules.",
            series(
                q(
                    f"tier_objective:tiergate_slo_errors:ratio_rate1h{{{TIER}}} / on (tier, "
                    "objective) group_left () (1 - tier_objective:tiergate_slo_target:ratio)",
                    "{{tier}} {{objective}}",
                ),
                lines=((1, "yellow"), (6, "orange"), (14.4, "red")),
            ),
        ),
        Spec(
            "Attainment over the range",
            "Share of the range's finished requests that met their SLO, per tier.",
            stats(
                q(
                    f"(sum by (tier) (increase(tiergate_slo_requests_total"
                    f'{{{TIER}, attained="true"}}[$__range]))'
                    f" or sum by (tier) (increase(tiergate_slo_requests_total{{{TIER}}}"
                    "[$__range])) * 0) / sum by (tier) (increase(tiergate_slo_requests_total"
                    f"{{{TIER}}}[$__range]))",
                    "{{tier}}",
                ),
                unit="percentunit",
                steps=((None, "red"), (0.9, "orange"), (0.95, "yellow"), (0.99, "green")),
                decimals=2,
            ),
            width=12,
            height=5,
        ),
        Spec(
            "TDG ratio over the range",
            "Gain over ideal gain for the whole range, per tier.",
            stats(
                q(
                    f"sum by (tier) (increase(tiergate_gain_total{{{TIER}}}[$__range]))"
                    f" / sum by (tier) (increase(tiergate_ideal_gain_total{{{TIER}}}[$__range]))",
                    "{{tier}}",
                ),
                unit="percentunit",
                steps=((None, "red"), (0.8, "orange"), (0.9, "yellow"), (0.95, "green")),
                decimals=3,
            ),
            width=12,
            height=5,
        ),
    )
    board.row(
        "Goodput",
        Spec(
            "Gain (TDG) per second by tier",
            "Priority-weighted on-time tokens per second: the fleet's useful output.",
            series(
                q(f"sum by (tier) (rate(tiergate_gain_total{{{TIER}}}[{RATE}]))", "{{tier}}"),
                stacked=True,
            ),
        ),
        Spec(
            "Requests meeting their SLO per second",
            "Finished requests per second that met every objective, by tier.",
            series(
                q(
                    f'sum by (tier) (rate(tiergate_slo_requests_total{{{TIER}, attained="true"}}'
                    f"[{RATE}])) or sum by (tier) (rate(tiergate_slo_requests_total{{{TIER}}}"
                    f"[{RATE}])) * 0",
                    "{{tier}}",
                ),
                unit="reqps",
                stacked=True,
            ),
        ),
        Spec(
            "Tokens per second by tier",
            "Prompt tokens processed and completion tokens delivered for accepted requests.",
            series(
                q(
                    f"sum by (tier, kind) (rate(tiergate_tokens_total{{{TIER}}}[{RATE}]))",
                    "{{tier}} {{kind}}",
                ),
            ),
            width=24,
        ),
    )
    board.row(
        "Admission",
        Spec(
            "Requests by tier and status",
            "Answered requests per second by HTTP status: 200 served, 429 a limit, 503 shed "
            "or unavailable, 499 the client left.",
            series(
                q(
                    f"sum by (tier, status) (rate(tiergate_requests_total{{{TIER}}}[{RATE}]))",
                    "{{tier}} {{status}}",
                ),
                unit="reqps",
                stacked=True,
            ),
        ),
        Spec(
            "Rejections by reason",
            "Refusals per second by reason: rate_limit_rpm/tpm and concurrency are a tenant's "
            "own limits; queue_full, queue_ttl and slo_* are the fleet out of capacity.",
            series(
                q(
                    f"sum by (reason) (rate(tiergate_rejections_total{{{TIER}}}[{RATE}])){ZERO}",
                    "{{reason}}",
                ),
                unit="reqps",
                stacked=True,
            ),
        ),
        Spec(
            "Share of requests refused at admission",
            "Admission refusals (limits, queue, SLO shedding) over all requests, by tier.",
            series(
                q(
                    f"(sum by (tier) (rate(tiergate_rejections_total{{{TIER}, "
                    f'reason=~"{ADMISSION_REASONS}"}}[{RATE}])) or sum by (tier) '
                    f"(rate(tiergate_requests_total{{{TIER}}}[{RATE}])) * 0) / sum by (tier) "
                    f"(rate(tiergate_requests_total{{{TIER}}}[{RATE}]))",
                    "{{tier}}",
                ),
                unit="percentunit",
                max_=1,
                lines=((0.1, "orange"),),
            ),
        ),
        Spec(
            "Demotions to best effort",
            "Requests served at the lowest priority because their TTFT objective became "
            "unattainable (overload: docs/operations/overload.md).",
            series(
                q(
                    f"sum by (tier, reason) (rate(tiergate_demotions_total{{{TIER}}}[{RATE}]))"
                    + ZERO,
                    "{{tier}} {{reason}}",
                ),
                unit="reqps",
            ),
        ),
    )
    board.row(
        "Queue and latency",
        Spec(
            "Admission queue",
            "Requests waiting for a dispatch slot and requests holding one, per gateway.",
            series(
                q("sum by (instance) (tiergate_queue_depth)", "queued {{instance}}", "A"),
                q("sum by (instance) (tiergate_in_flight)", "in flight {{instance}}", "B"),
            ),
        ),
        Spec(
            "Queue service rate",
            "Dispatch slots released per second while requests waited: the rate the queue "
            "drains at (0 until measured).",
            series(
                q("sum by (instance) (tiergate_queue_service_rate)", "{{instance}}"), unit="ops"
            ),
        ),
        Spec(
            "TTFT p95 by tier",
            "Time to first token at the gateway's egress, 95th percentile.",
            series(
                q(quantile(0.95, "tiergate_time_to_first_token_seconds", "tier", TIER), "{{tier}}"),
                unit="s",
            ),
            width=8,
        ),
        Spec(
            "Inter-token latency p95 by tier",
            "Gaps between streamed chunks at the egress, 95th percentile (TPOT's raw material).",
            series(
                q(quantile(0.95, "tiergate_inter_token_latency_seconds", "tier", TIER), "{{tier}}"),
                unit="s",
            ),
            width=8,
        ),
        Spec(
            "Request duration p95 by tier",
            "Arrival to last byte, 95th percentile.",
            series(
                q(quantile(0.95, "tiergate_request_duration_seconds", "tier", TIER), "{{tier}}"),
                unit="s",
            ),
            width=8,
        ),
    )
    return board


# ---- tenants -----------------------------------------------------------------------------------


def tenants() -> Board:
    board = Board(
        "tiergate-tenants",
        "tiergate / Tenants",
        "Who uses the fleet and what they get: per-tenant requests, tokens, attainment and "
        "limits hit. Needs TIERGATE_METRICS_TENANT_LABELS=true (otherwise every tenant reads "
        "as one, with an empty name).",
        ("tier", "tenant"),
    )
    board.row(
        "Usage",
        Spec(
            "Requests per second by tenant",
            "All answered requests, whatever their status.",
            series(
                q(
                    f"sum by (tenant) (rate(tiergate_requests_total{{{TENANT}}}[{RATE}]))",
                    "{{tenant}}",
                ),
                unit="reqps",
                stacked=True,
            ),
        ),
        Spec(
            "Tokens per second by tenant",
            "Prompt and completion tokens of accepted requests.",
            series(
                q(
                    f"sum by (tenant, kind) (rate(tiergate_tokens_total{{{TENANT}}}[{RATE}]))",
                    "{{tenant}} {{kind}}",
                ),
            ),
        ),
        Spec(
            "Requests by tenant and status",
            "Answered requests per second by HTTP status: 200 served, 429 its limits, 503 "
            "shed or unavailable, 499 the client left.",
            series(
                q(
                    f"sum by (tenant, status) (rate(tiergate_requests_total{{{TENANT}}}[{RATE}]))",
                    "{{tenant}} {{status}}",
                ),
                unit="reqps",
            ),
        ),
        Spec(
            "Tokens over the range",
            "Tokens per tenant for the selected range (prompt + completion): what a bill is "
            "made of (the usage table is the record of account: `tiergate usage`).",
            stats(
                q(
                    f"sum by (tenant) (increase(tiergate_tokens_total{{{TENANT}}}[$__range]))",
                    "{{tenant}}",
                ),
                decimals=0,
            ),
            width=24,
            height=5,
        ),
    )
    board.row(
        "Service level",
        Spec(
            "Attainment by tenant and objective",
            "Share of a tenant's finished requests that met each objective of its SLO.",
            series(
                q(
                    ratio(
                        "tiergate_slo_objective_requests_total",
                        "tenant, objective",
                        TENANT,
                        'attained="true"',
                    ),
                    "{{tenant}} {{objective}}",
                ),
                unit="percentunit",
                max_=1,
            ),
        ),
        Spec(
            "Errors by tenant",
            "Share of a tenant's requests answered with a 5xx: engine failures, SLO shedding "
            "(503), the database or every backend unavailable.",
            series(
                q(
                    ratio("tiergate_requests_total", "tenant", TENANT, 'status=~"5.."'),
                    "{{tenant}}",
                ),
                unit="percentunit",
                max_=1,
            ),
        ),
    )
    board.row(
        "Limits",
        Spec(
            "Limits hit by tenant",
            "Refusals per second for the tenant's own limits (requests or tokens per minute, "
            "concurrency): the tenant is sending more than its plan.",
            series(
                q(
                    f"sum by (tenant, reason) (rate(tiergate_rejections_total{{{TENANT}, "
                    f'reason=~"{LIMIT_REASONS}"}}[{RATE}])){ZERO}',
                    "{{tenant}} {{reason}}",
                ),
                unit="reqps",
                stacked=True,
            ),
        ),
        Spec(
            "Share of requests answered 429",
            "Per tenant: how much of what it sends its limits refuse.",
            series(
                q(ratio("tiergate_requests_total", "tenant", TENANT, 'status="429"'), "{{tenant}}"),
                unit="percentunit",
                max_=1,
            ),
        ),
    )
    board.row(
        "Spend and budgets",
        Spec(
            "Spend per hour by tier",
            "What requests cost at their model's price, per hour, by tier (in the currency the "
            "prices are set in; counted when each usage record is charged; an unpriced model "
            "costs nothing). Per tenant and key: the dashboard's usage page, its CSV, or "
            "/admin/v1/usage/series.",
            series(
                q(
                    f"sum by (tier) (rate(tiergate_spend_total{{{TIER}}}[{RATE}])) * 3600{ZERO}",
                    "{{tier}}",
                ),
                stacked=True,
            ),
        ),
        Spec(
            "Spend over the range by tier",
            "Spend per tier for the selected range: the gateways' running count (the usage "
            "records, each charged at its model's price when written, are the record of "
            "account: docs/operations/spend-and-budgets.md).",
            stats(
                q(
                    f"sum by (tier) (increase(tiergate_spend_total{{{TIER}}}[$__range])){ZERO}",
                    "{{tier}}",
                ),
            ),
        ),
        Spec(
            "Budget refusals",
            "Requests refused per second because a tenant's or key's budget was spent "
            "(429 budget_exceeded), by scope (tenant, key) and period (day, month). Not "
            "filtered by tier or tenant: the metric carries neither.",
            series(
                q(
                    "sum by (scope, period) "
                    f"(rate(tiergate_budget_rejections_total[{RATE}])){ZERO}",
                    "{{scope}} {{period}}",
                ),
                unit="reqps",
                stacked=True,
            ),
        ),
        Spec(
            "Budget soft crossings over the range",
            "Budgets whose spend passed their soft threshold in the selected range, by scope "
            "and period: once per budget and period with Redis (the first process to see it; "
            "its webhook is posted then), once per gateway process without (each counts its "
            "own share of the budget).",
            stats(
                q(
                    "sum by (scope, period) "
                    f"(increase(tiergate_budget_soft_crossings_total[$__range])){ZERO}",
                    "{{scope}} {{period}}",
                ),
                decimals=0,
            ),
        ),
    )
    return board


# ---- backends ----------------------------------------------------------------------------------


BREAKER = {"0": ("closed", "green"), "1": ("half-open", "yellow"), "2": ("open", "red")}
HEALTH = {"0": ("out of routing", "red"), "1": ("routable", "green")}


def backends() -> Board:
    board = Board(
        "tiergate-backends",
        "tiergate / Backends",
        "The engines behind the gateways: health and breaker, where the router sends work, "
        "the engines' own vllm:* metrics and the scheduling policy's tiergate:* state.",
        ("tier", "backend"),
    )
    board.row(
        "Routing (the gateways' view)",
        Spec(
            "Routable",
            "Whether every gateway routes to the backend (breaker closed or half-open).",
            states(
                q(f"min by (backend) (tiergate_backend_healthy{{{BACKEND}}})", "{{backend}}"),
                HEALTH,
            ),
        ),
        Spec(
            "Breaker state",
            "The worst breaker state any gateway holds for the backend: open is out of "
            "routing for its cooldown, half-open is routed to again on trial.",
            states(
                q(f"max by (backend) (tiergate_backend_breaker_state{{{BACKEND}}})", "{{backend}}"),
                BREAKER,
            ),
        ),
        Spec(
            "Routing decisions per second",
            "Attempts the router sent to each backend (a failover counts on the backend it "
            "moved to), by tier.",
            series(
                q(
                    "sum by (backend, tier) (rate(tiergate_routed_requests_total"
                    f"{{{BACKEND}, {TIER}}}[{RATE}]))",
                    "{{backend}} {{tier}}",
                ),
                unit="reqps",
                stacked=True,
            ),
        ),
        Spec(
            "Routing share",
            "Each backend's share of the routing decisions: GoRouting sends more to faster "
            "hardware, less to a loaded or slow engine.",
            series(
                q(
                    f"sum by (backend) (rate(tiergate_routed_requests_total{{{BACKEND}, {TIER}}}"
                    f"[{RATE}])) / on () group_left () sum (rate(tiergate_routed_requests_total"
                    f"{{{TIER}}}[{RATE}]))",
                    "{{backend}}",
                ),
                unit="percentunit",
                max_=1,
            ),
        ),
        Spec(
            "Gateway load per backend",
            "The gateways' own count of requests awaiting their first token (prefill) and "
            "decoding on each backend.",
            series(
                q(
                    f"sum by (backend) (tiergate_backend_prefill_queue{{{BACKEND}}})",
                    "prefill {{backend}}",
                    "A",
                ),
                q(
                    f"max by (backend) (tiergate_backend_decoding{{{BACKEND}}})",
                    "decoding {{backend}}",
                    "B",
                ),
            ),
        ),
        Spec(
            "Upstream failures and timeouts",
            "Failed attempts (connect errors, 5xx, broken streams) and attempts abandoned for "
            "time, by phase.",
            series(
                q(
                    "sum by (backend) (rate(tiergate_upstream_failures_total"
                    f"{{{BACKEND}}}[{RATE}]))",
                    "failed {{backend}}",
                    "A",
                ),
                q(
                    f"sum by (backend, phase) (rate(tiergate_upstream_timeouts_total{{{BACKEND}}}"
                    f"[{RATE}]))",
                    "timeout {{backend}} {{phase}}",
                    "B",
                ),
                unit="ops",
            ),
        ),
        Spec(
            "Breaker opens",
            "Times a breaker opened in the interval, by reason (unreachable: /health failed; "
            "unresponsive: requests failed or hung).",
            series(
                q(
                    f"sum by (backend, reason) (increase(tiergate_breaker_opens_total{{{BACKEND}}}"
                    f"[{RATE}]))",
                    "{{backend}} {{reason}}",
                ),
            ),
        ),
        Spec(
            "Failovers by tier",
            "Requests retried on another backend after failing before their first token.",
            series(
                q(
                    f"sum by (tier) (rate(tiergate_failovers_total{{{TIER}}}[{RATE}])){ZERO}",
                    "{{tier}}",
                ),
                unit="ops",
            ),
        ),
    )
    board.row(
        "Engines (vllm:*)",
        Spec(
            "Running and waiting requests",
            "The engine's running batch and its waiting queue (vLLM's gauges).",
            series(
                q(
                    f"sum by (backend) (vllm:num_requests_running{{{BACKEND}}})",
                    "running {{backend}}",
                    "A",
                ),
                q(
                    f"sum by (backend) (vllm:num_requests_waiting{{{BACKEND}}})",
                    "waiting {{backend}}",
                    "B",
                ),
            ),
        ),
        Spec(
            "KV cache usage",
            "Share of the engine's KV blocks in use; near 1 the engine preempts.",
            series(
                q(f"max by (backend) (vllm:kv_cache_usage_perc{{{BACKEND}}})", "{{backend}}"),
                unit="percentunit",
                max_=1,
                lines=((0.9, "orange"),),
            ),
        ),
        Spec(
            "Engine TTFT p95",
            "Time to first token inside the engine (queue + prefill), 95th percentile: the "
            "gateway's TTFT less the network and the gateway.",
            series(
                q(
                    quantile(0.95, "vllm:time_to_first_token_seconds", "backend", BACKEND),
                    "{{backend}}",
                ),
                unit="s",
            ),
            width=8,
        ),
        Spec(
            "Engine inter-token latency p95",
            "Time between output tokens inside the engine, 95th percentile.",
            series(
                q(
                    quantile(0.95, "vllm:inter_token_latency_seconds", "backend", BACKEND),
                    "{{backend}}",
                ),
                unit="s",
            ),
            width=8,
        ),
        Spec(
            "Engine queue time p95",
            "Time a request waited in the engine before it was first scheduled.",
            series(
                q(
                    quantile(0.95, "vllm:request_queue_time_seconds", "backend", BACKEND),
                    "{{backend}}",
                ),
                unit="s",
            ),
            width=8,
        ),
        Spec(
            "Engine throughput",
            "Prompt tokens prefilled and tokens generated per second.",
            series(
                q(
                    f"sum by (backend) (rate(vllm:prompt_tokens_total{{{BACKEND}}}[{RATE}]))",
                    "prompt {{backend}}",
                    "A",
                ),
                q(
                    f"sum by (backend) (rate(vllm:generation_tokens_total{{{BACKEND}}}[{RATE}]))",
                    "generation {{backend}}",
                    "B",
                ),
            ),
        ),
        Spec(
            "Preemptions",
            "Requests the engine evicted from its batch to free KV blocks (recomputed later).",
            series(
                q(
                    f"sum by (backend) (rate(vllm:num_preemptions_total{{{BACKEND}}}[{RATE}]))",
                    "{{backend}}",
                ),
                unit="ops",
            ),
        ),
    )
    board.row(
        "Scheduling policy (tiergate:*)",
        Spec(
            "URGENT and NORMAL requests",
            "SlideBatching's split at the latest step: URGENT requests are near their "
            "deadline and scheduled by weight first; a growing URGENT share means the engine "
            "is behind. Other policies report everything NORMAL.",
            series(
                q(
                    f"sum by (backend) (tiergate:urgent_requests{{{BACKEND}}})",
                    "urgent {{backend}}",
                    "A",
                ),
                q(
                    f"sum by (backend) (tiergate:normal_requests{{{BACKEND}}})",
                    "normal {{backend}}",
                    "B",
                ),
            ),
        ),
        Spec(
            "Latency budget",
            "The step-time budget the policy planned within (the tightest URGENT deadline).",
            series(
                q(
                    f"max by (backend) (tiergate:latency_budget_seconds{{{BACKEND}}})",
                    "{{backend}}",
                ),
                unit="s",
            ),
        ),
        Spec(
            "Estimator correction β",
            "The step-time estimator's momentum correction: 1 when the latency profile "
            "predicts the engine exactly; the estimator-drift alert fires beyond 1.5 or 1/1.5.",
            series(
                q(f"avg by (backend) (tiergate:estimator_beta{{{BACKEND}}})", "{{backend}}"),
                min_=None,
                lines=((0.667, "orange"), (1.5, "orange")),
            ),
            width=8,
        ),
        Spec(
            "Estimator error",
            "|real / predicted − 1| of the latest step time.",
            series(
                q(f"max by (backend) (tiergate:estimator_error_ratio{{{BACKEND}}})", "{{backend}}"),
                unit="percentunit",
            ),
            width=8,
        ),
        Spec(
            "Plan deviations",
            "Share of steps whose executed batch differed from the policy's plan (vLLM ran "
            "something else: a rule the policy does not model).",
            series(
                q(
                    f"sum by (backend) (rate(tiergate:plan_deviations{{{BACKEND}}}[{RATE}]))"
                    f" / sum by (backend) (rate(tiergate:policy_steps{{{BACKEND}}}[{RATE}]))",
                    "{{backend}}",
                ),
                unit="percentunit",
            ),
            width=8,
        ),
    )
    return board


# ---- gateway -----------------------------------------------------------------------------------


def gateway() -> Board:
    board = Board(
        "tiergate-gateway",
        "tiergate / Gateway",
        "The gateway processes themselves: the latency they add, their event loop, the usage "
        "writer and their dependencies (database, Redis).",
        (),
    )
    board.row(
        "Overhead",
        Spec(
            "Gateway overhead",
            "Time from arrival to the upstream request, queue wait excluded (auth, limits, "
            "routing): p50, p99.",
            series(
                q(quantile(0.5, "tiergate_gateway_overhead_seconds", "", ""), "p50", "A"),
                q(quantile(0.99, "tiergate_gateway_overhead_seconds", "", ""), "p99", "B"),
                unit="s",
            ),
        ),
        Spec(
            "Gateway overhead distribution",
            "Requests per overhead bucket over time.",
            heat(
                q(
                    f"sum by (le) (rate(tiergate_gateway_overhead_seconds_bucket[{RATE}]))",
                    "{{le}}",
                ),
                "s",
            ),
        ),
        Spec(
            "Routing decision time p99",
            "Time the router takes to choose a backend.",
            series(q(quantile(0.99, "tiergate_routing_decision_seconds", "", ""), "p99"), unit="s"),
            width=8,
        ),
        Spec(
            "Event-loop lag",
            "How late the event loop ran a 100 ms tick, p99 and mean: every request on that "
            "loop waited as long. Sustained lag above ~50 ms means a CPU-bound gateway.",
            series(
                q(
                    quantile(0.99, "tiergate_event_loop_lag_seconds", "instance", ""),
                    "p99 {{instance}}",
                    "A",
                ),
                q(
                    f"sum by (instance) (rate(tiergate_event_loop_lag_seconds_sum[{RATE}]))"
                    f" / sum by (instance) (rate(tiergate_event_loop_lag_seconds_count[{RATE}]))",
                    "mean {{instance}}",
                    "B",
                ),
                unit="s",
                lines=((0.05, "orange"),),
            ),
            width=8,
        ),
        Spec(
            "Requests per gateway",
            "Answered requests per second, per gateway process (instance).",
            series(
                q(f"sum by (instance) (rate(tiergate_requests_total[{RATE}]))", "{{instance}}"),
                unit="reqps",
                stacked=True,
            ),
            width=8,
        ),
    )
    board.row(
        "Usage writer",
        Spec(
            "Usage backlog",
            "Usage records in memory not yet in the database, and records spooled to disk "
            "awaiting replay (both grow while the database is away).",
            series(
                q(
                    "sum by (instance) (tiergate_usage_buffered_records)",
                    "buffered {{instance}}",
                    "A",
                ),
                q(
                    "sum by (instance) (tiergate_usage_spooled_records)",
                    "spooled {{instance}}",
                    "B",
                ),
            ),
        ),
        Spec(
            "Usage spool size",
            "Bytes in the usage spool directory: records are dropped past "
            "TIERGATE_USAGE_SPOOL_MAX_BYTES (1 GiB by default).",
            series(
                q("max by (instance) (tiergate_usage_spool_bytes)", "{{instance}}"), unit="bytes"
            ),
        ),
        Spec(
            "Usage records by outcome",
            "written, duplicate (already stored), spilled (to the spool), replayed (from it), "
            "dropped (lost: should stay zero).",
            series(
                q(
                    f"sum by (outcome) (rate(tiergate_usage_records_total[{RATE}])){ZERO}",
                    "{{outcome}}",
                ),
                unit="ops",
            ),
            width=24,
        ),
    )
    board.row(
        "Dependencies",
        Spec(
            "Database unavailable",
            "1 while the database fails the gateway: usage writes kept for retry, API keys "
            "served from the cache (docs/operations/database-outage.md).",
            states(
                q("max by (instance) (tiergate_database_unavailable)", "{{instance}}"),
                {"0": ("ok", "green"), "1": ("unavailable", "red")},
            ),
        ),
        Spec(
            "Rate limiter degraded",
            "1 while Redis is unreachable and each process enforces its share of every limit "
            "in process (docs/operations/redis-outage.md).",
            states(
                q("max by (instance) (tiergate_limiter_degraded)", "{{instance}}"),
                {"0": ("redis", "green"), "1": ("degraded-local", "orange")},
            ),
        ),
        Spec(
            "Spend budgets degraded",
            "1 while Redis is unreachable or too slow for the budget guard and each process "
            "enforces its share of what every budget had left, in process "
            "(docs/operations/spend-and-budgets.md).",
            states(
                q("max by (instance) (tiergate_budget_degraded)", "{{instance}}"),
                {"0": ("redis", "green"), "1": ("degraded-local", "orange")},
            ),
        ),
        Spec(
            "Keys served from the cache",
            "Requests authenticated from a key's last-good identity while the database could "
            "not answer, fallbacks of the limiter from Redis, and workflow calls answered "
            "without Redis (by outcome: local copy, or served as the tier's default kind).",
            series(
                q(
                    f"sum by (instance) (rate(tiergate_auth_stale_total[{RATE}]))",
                    "stale auth {{instance}}",
                    "A",
                ),
                q(
                    f"sum by (instance) (increase(tiergate_limiter_fallbacks_total[{RATE}]))",
                    "limiter fallbacks {{instance}}",
                    "B",
                ),
                q(
                    "sum by (instance, outcome) "
                    f"(rate(tiergate_workflow_degraded_calls_total[{RATE}]))",
                    "workflow calls {{outcome}} {{instance}}",
                    "C",
                ),
            ),
        ),
        Spec(
            "Scrape targets up",
            "Gateways and engines Prometheus reaches (job tiergate-gateway, tiergate-engines).",
            series(q('sum by (job) (up{job=~"tiergate-.*"})', "{{job}}")),
        ),
    )
    return board


BOARDS: dict[str, Callable[[], Board]] = {
    "fleet-slo": fleet_slo,
    "tenants": tenants,
    "backends": backends,
    "gateway": gateway,
}


def render(name: str) -> str:
    """The JSON text of dashboard ``name``, as committed."""
    return json.dumps(BOARDS[name]().build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def panel_table(name: str) -> str:
    """Markdown: each panel's title and description (``docs/operations/dashboards.md``)."""
    board = BOARDS[name]()
    lines = [f"### {board.title}", "", board.description, ""]
    for row, specs in board.rows:
        lines += [f"**{row}**", "", "| panel | what it shows |", "| --- | --- |"]
        lines += [f"| {s.title} | {s.description} |" for s in specs]
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--docs", action="store_true", help="print the panel tables (markdown)")
    args = parser.parse_args(argv)
    if args.docs:
        print("\n".join(panel_table(name) for name in BOARDS))
        return 0
    stale = []
    for name in BOARDS:
        path = OUT / f"{name}.json"
        text = render(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("out of date (run python deploy/grafana/generate.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
