"""``tiergate profile``: fit latency profiles from measured batch tables, list shipped ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from priority.profiles import EngineConfig, available_profiles, load_profile
from priority.profiles.fit import fit_profile, mape, mape_by_kind, predict
from priority.profiles.table import read_rows

profile_app = typer.Typer(
    help="Latency profiles: fit Eqs. 4-7 to a measured batch table, list shipped profiles.",
    no_args_is_help=True,
)


@profile_app.command("fit")
def fit(
    csv_path: Annotated[
        Path, typer.Argument(metavar="CSV", exists=True, dir_okay=False, help="profile table")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="profile JSON to write")],
    name: Annotated[str | None, typer.Option(help="profile name (default: CSV stem)")] = None,
    hardware: Annotated[str, typer.Option(help="device the table was measured on")] = "unknown",
    model: Annotated[str, typer.Option(help="model the table was measured with")] = "unknown",
    tp: Annotated[int, typer.Option(min=1, help="tensor-parallel degree")] = 1,
    prefill_kv_term: Annotated[
        bool, typer.Option("--prefill-kv-term", help="fit xLLM's extra d_p*l_kv prefill term")
    ] = False,
    holdout: Annotated[
        float, typer.Option(min=0.0, max=0.95, help="fraction of rows held out for MAPE")
    ] = 0.2,
    seed: Annotated[int, typer.Option(help="seed of the train/held-out split")] = 0,
) -> None:
    """Fit a profile table (CSV) and write the profile JSON; prints the held-out MAPE."""
    try:
        rows = read_rows(csv_path)
    except (ValueError, KeyError) as exc:
        raise typer.BadParameter(str(exc), param_hint="CSV") from None
    if not rows:
        raise typer.BadParameter("the table has no rows", param_hint="CSV")
    profile = fit_profile(
        rows,
        name=name or csv_path.stem,
        hardware=hardware,
        model=model,
        tensor_parallel=tp,
        engine=EngineConfig(),
        provenance={
            "kind": "measured",
            "table": str(csv_path),
            "sources": sorted({r.meta.get("source", "") for r in rows} - {""}),
            "note": "engine limits are defaults: the gateway and the plugin read the engine's own",
        },
        prefill_kv_term=prefill_kv_term,
        holdout_fraction=holdout,
        seed=seed,
    )
    profile.save(output)
    held = profile.fit["heldout_mape"]
    held_text = "n/a (no held-out rows)" if held is None else f"{held:.2%}"
    console = Console()
    console.print(
        f"fitted {profile.fit['rows']} rows ({profile.fit['heldout_rows']} held out): "
        f"held-out MAPE {held_text}, all-rows MAPE {profile.fit['all_rows_mape']:.2%}"
    )
    console.print(f"wrote {output}")


@profile_app.command("eval")
def evaluate(
    profile_name: Annotated[str, typer.Argument(metavar="PROFILE", help="name or JSON path")],
    csv_path: Annotated[
        Path, typer.Argument(metavar="CSV", exists=True, dir_okay=False, help="measured table")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """How well a profile predicts a measured table (e.g. a shipped profile on your GPU)."""
    try:
        profile = load_profile(profile_name)
        rows = read_rows(csv_path)
    except (ValueError, KeyError) as exc:
        raise typer.BadParameter(str(exc)) from None
    if not rows:
        raise typer.BadParameter("the table has no rows", param_hint="CSV")
    predicted = predict(profile.coefficients, rows)
    ratios = sorted(float(p / r.latency_s) for p, r in zip(predicted, rows, strict=True))
    by_kind = mape_by_kind(profile.coefficients, rows)
    result = {
        "profile": profile.name,
        "rows": len(rows),
        "mape": mape(profile.coefficients, rows),
        "mape_by_kind": by_kind,
        "predicted_over_measured_median": ratios[len(ratios) // 2],
    }
    if as_json:
        typer.echo(json.dumps(result))
        return
    kinds = ", ".join(f"{k} {v:.2%}" for k, v in by_kind.items())
    Console().print(
        f"{profile.name} on {len(rows)} measured rows: MAPE {result['mape']:.2%} ({kinds}); "
        f"predicted/measured median {ratios[len(ratios) // 2]:.3f}"
    )


@profile_app.command("from-steps")
def from_steps(
    log_path: Annotated[
        Path,
        typer.Argument(
            metavar="STEPLOG", exists=True, dir_okay=False, help="TIERGATE_STEP_LOG of an engine"
        ),
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="profile JSON to write")],
    prior: Annotated[
        str, typer.Option(help="profile to start from (terms the steps leave unseen keep it)")
    ] = "h100-llama3.1-8b",
    name: Annotated[str | None, typer.Option(help="profile name (default: the log's stem)")] = None,
    hardware: Annotated[str, typer.Option(help="device the engine ran on")] = "unknown",
    model: Annotated[str, typer.Option(help="model the engine served")] = "unknown",
    tp: Annotated[int, typer.Option(min=1, help="tensor-parallel degree")] = 1,
    holdout: Annotated[
        float, typer.Option(min=0.05, max=0.95, help="last fraction of steps held out for MAPE")
    ] = 0.3,
) -> None:
    """Build a profile from a running vLLM's recorded steps (a new model or card)."""
    from priority.profiles.from_steps import profile_from_steps
    from priority.profiles.steps import read_steps

    try:
        start = load_profile(prior)
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--prior") from None
    steps = list(read_steps(log_path))
    try:
        profile = profile_from_steps(
            steps,
            start,
            name=name or log_path.stem,
            hardware=hardware,
            model=model,
            tensor_parallel=tp,
            source=str(log_path),
            holdout=holdout,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="STEPLOG") from None
    profile.save(output)
    fit = profile.fit
    Console().print(
        f"{fit['steps']} steps ({fit['heldout_steps']} held out): held-out MAPE "
        f"{fit['heldout_mape']:.2%} (the prior {start.name}: {fit['prior_heldout_mape']:.2%})"
    )
    Console().print(f"wrote {output}")


@profile_app.command("list")
def list_profiles() -> None:
    """Shipped profiles with their key numbers."""
    console = Console()
    table = Table(title="shipped latency profiles")
    for col, justify in (
        ("name", "left"),
        ("hardware", "left"),
        ("model", "left"),
        ("TP", "right"),
        ("decode step @128 (ms)", "right"),
        ("prefill 2048 (s)", "right"),
        ("KV tokens", "right"),
        ("held-out MAPE", "right"),
        ("kind", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name in available_profiles():
        p = load_profile(name)
        est = p.estimator()
        held = p.fit.get("heldout_mape")
        table.add_row(
            p.name,
            p.hardware,
            p.model,
            str(p.tensor_parallel),
            f"{est.batch_time(decode_kv=[128]) * 1e3:.2f}",
            f"{est.batch_time(prefill=[(2048, 0)]):.3f}",
            f"{p.engine.num_kv_blocks * p.engine.block_size:,}",
            "-" if held is None else f"{held:.1%}",
            str(p.provenance.get("kind", "?")).split(":")[0].split(" (")[0],
        )
    console.print(table)
