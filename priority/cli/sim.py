"""``tiergate sim``: replay a trace through the cluster simulator under several policies.

Every policy (and every load level) in one invocation replays the identical workload: the
workload is built once per load from ``--seed`` and each run gets fresh request objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from priority.policies import POLICY_NAMES
from priority.profiles import load_profile
from priority.routing import ROUTER_NAMES
from priority.sim import ClusterConfig, PdConfig, build_workload, load_trace
from priority.sim.compare import compare_policies
from priority.sim.length_error import DEFAULT_LENGTH_ERROR, parse_length_error
from priority.sim.rules import ENGINE_RULES
from priority.sim.workflows import LENGTH_MODES

console = Console(stderr=True)


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _floats(value: str | None, option: str) -> list[float]:
    if value is None:
        return []
    try:
        numbers = [float(item) for item in _split(value)]
    except ValueError:
        raise typer.BadParameter(
            f"expected comma-separated numbers, got {value!r}", param_hint=option
        ) from None
    if not numbers or any(n <= 0 for n in numbers):
        raise typer.BadParameter("every value must be > 0", param_hint=option)
    return numbers


@dataclass(frozen=True)
class LoadLevel:
    rate_scale: float | None
    rps: float | None

    @property
    def label(self) -> str:
        return f"{self.rate_scale:g}x" if self.rate_scale is not None else f"{self.rps:g} req/s"


def sim(
    trace: Annotated[
        str,
        typer.Option(
            help="Trace CSV path, or a named trace: azure_conv, azure_code, mooncake_conv, "
            "arxiv, azure_conv_20min."
        ),
    ],
    profile: Annotated[
        str,
        typer.Option(help="Profile name(s), comma-separated; assigned round-robin to instances."),
    ],
    instances: Annotated[int, typer.Option(min=1, help="Number of engine instances.")] = 1,
    router: Annotated[str, typer.Option(help=f"Router: {', '.join(ROUTER_NAMES)}.")] = "goroute",
    policy: Annotated[
        str, typer.Option(help=f"Policy name(s), comma-separated: {', '.join(POLICY_NAMES)}.")
    ] = "slide",
    rate_scale: Annotated[
        str | None,
        typer.Option(
            "--rate-scale",
            help="Multiply the trace's native rate (comma-separated list sweeps loads).",
        ),
    ] = None,
    rps: Annotated[
        str | None,
        typer.Option(
            help="Rescale arrivals to this many requests/s (comma-separated list sweeps loads)."
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            min=0.001, help="Only requests arriving in the first S seconds (after scaling)."
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the workload (tiers, SLOs) and the simulation.")
    ] = 0,
    prefill_instances: Annotated[
        int,
        typer.Option(
            "--pd-prefill",
            min=0,
            help="PD-disaggregation: this many instances are prefill-only, the rest "
            "decode-only (0 = co-located).",
        ),
    ] = 0,
    noise: Annotated[
        float, typer.Option(min=0.0, help="Log-normal sigma of step-time noise.")
    ] = 0.0,
    engine_rules: Annotated[
        str,
        typer.Option(
            help=f"The engines' own admission/queue rules: {', '.join(ENGINE_RULES)} "
            "(vllm: whole-sequence admission, preempted requests first, as vLLM 0.23/0.33)."
        ),
    ] = "vllm",
    lengths: Annotated[
        str,
        typer.Option(
            help="Length bounds the policies see: oracle (true lengths), predicted (the truth "
            "blurred by --length-error, see priority/sim/workflows.py) or max-tokens (only "
            "the cap).",
        ),
    ] = "predicted",
    length_error: Annotated[
        str,
        typer.Option(
            help="--lengths predicted: measured (the real predictor's held-out error on "
            "HH-RLHF, priority/sim/data/length_error_hh.csv), measured:CSV (another file from "
            "scripts/length_error_model.py) or lognormal:SIGMA (a calibrated lognormal "
            "stand-in, log-space std-dev SIGMA).",
        ),
    ] = DEFAULT_LENGTH_ERROR,
    workflow_history: Annotated[
        str,
        typer.Option(
            help="Compound sub-deadlines: on (matched against workflows that finished earlier "
            "in the run, priority/sim/history.py; cold start without a match) or off (cold "
            "start only).",
        ),
    ] = "off",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write results as JSON here.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Draw TDG ratio and SLO attainment vs load (PNG).")
    ] = None,
) -> None:
    """Simulate a cluster on a trace and compare engine policies (TDG, SLO attainment, goodput)."""
    policies = _split(policy)
    for name in policies:
        if name not in POLICY_NAMES:
            raise typer.BadParameter(
                f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}", param_hint="--policy"
            )
    if lengths not in LENGTH_MODES:
        raise typer.BadParameter(
            f"unknown lengths mode {lengths!r}; known: {', '.join(LENGTH_MODES)}",
            param_hint="--lengths",
        )
    try:
        error = parse_length_error(length_error)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--length-error") from None
    if workflow_history not in ("on", "off"):
        raise typer.BadParameter(
            f"expected on or off, got {workflow_history!r}", param_hint="--workflow-history"
        )
    if engine_rules not in ENGINE_RULES:
        raise typer.BadParameter(
            f"unknown engine rules {engine_rules!r}; known: {', '.join(ENGINE_RULES)}",
            param_hint="--engine-rules",
        )
    if router not in ROUTER_NAMES:
        raise typer.BadParameter(
            f"unknown router {router!r}; known: {', '.join(ROUTER_NAMES)}", param_hint="--router"
        )
    if (rate_scale is None) == (rps is None):
        raise typer.BadParameter(
            "give exactly one of --rate-scale or --rps", param_hint="--rate-scale/--rps"
        )
    if prefill_instances and not 0 < prefill_instances < instances:
        raise typer.BadParameter(
            "--pd-prefill must leave at least one decode instance", param_hint="--pd-prefill"
        )
    try:
        profiles = [load_profile(name) for name in _split(profile)]
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0]), param_hint="--profile") from None
    if not profiles:
        raise typer.BadParameter("at least one profile is required", param_hint="--profile")
    levels = [LoadLevel(x, None) for x in _floats(rate_scale, "--rate-scale")] + [
        LoadLevel(None, x) for x in _floats(rps, "--rps")
    ]
    try:
        table = load_trace(trace)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--trace") from None

    config = ClusterConfig(
        profiles=[profiles[i % len(profiles)] for i in range(instances)],
        policy=policies[0],
        router=router,
        noise_sigma=noise,
        seed=seed,
        pd=PdConfig(num_prefill=prefill_instances) if prefill_instances else None,
        rules=ENGINE_RULES[engine_rules],
        workflow_history=workflow_history == "on",
    )
    results: list[dict[str, Any]] = []
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        for level in levels:
            try:
                workload = build_workload(
                    table,
                    rate_scale=level.rate_scale,
                    rps=level.rps,
                    duration_s=duration,
                    seed=seed,
                    reference_profile=profiles[0],
                    lengths=lengths,
                    length_error=error,
                )
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--trace") from None
            task = bar.add_task(f"{level.label}", total=len(policies))

            def advance(
                name: str, fraction: float, task: TaskID = task, label: str = level.label
            ) -> None:
                bar.update(
                    task,
                    description=f"{name} @ {label}",
                    completed=policies.index(name) + fraction,
                )

            for summary in compare_policies(workload, config, policies, progress=advance):
                if level.rate_scale is not None:
                    summary["rate_scale"] = level.rate_scale
                else:
                    summary["rps"] = level.rps
                results.append(summary)
            bar.remove_task(task)

    _print_table(results)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"results": results}, indent=2) + "\n")
        console.print(f"wrote {json_out}")
    if plot is not None:
        from priority.sim.plot import plot_gain_vs_load

        plot_gain_vs_load(results, plot, title=f"{trace} · {instances}× {profile} · {router}")
        console.print(f"wrote {plot}")


def _print_table(results: list[dict[str, Any]]) -> None:
    tiers = sorted({name for r in results for name in r["per_tier"]})
    table = Table(title="tiergate sim: TDG ratio = priority-weighted on-time tokens / ideal")
    headers = ["load", "policy", "TDG", *(f"TDG {t}" for t in tiers), "SLO att."]
    headers += ["TTFT p50/p99 s", "TPOT p50/p99 ms", "finished"]
    for col in headers:
        table.add_column(col, justify="left" if col in ("policy", "load") else "right")
    for r in results:
        load = f"{r['rate_scale']:g}x" if "rate_scale" in r else f"{r['rps']:g}/s"
        per_tier = [
            f"{r['per_tier'][t]['tdg_ratio']:.3f}" if t in r["per_tier"] else "-" for t in tiers
        ]
        table.add_row(
            load,
            r["policy"],
            f"{r['tdg_ratio']:.3f}",
            *per_tier,
            f"{r['slo_attainment']:.3f}",
            f"{r['ttft_p50_s']:.2f}/{r['ttft_p99_s']:.2f}",
            f"{1e3 * r['tpot_p50_s']:.0f}/{1e3 * r['tpot_p99_s']:.0f}",
            f"{r['finished']}/{r['submitted']}",
        )
    Console(width=max(Console().width, 120)).print(table)
