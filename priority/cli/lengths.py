"""``tiergate lengths``: train the output-length predictor from JSONL, evaluate a saved one.

scikit-learn and ``quantile-forest`` are imported inside the commands, so ``--help`` (and the
rest of the core's CLI) works where they are not installed; a command that needs them says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

lengths_app = typer.Typer(
    help="Output-length predictor (quantile regression forest): train, evaluate.",
    no_args_is_help=True,
)
console = Console(stderr=True)

DataFile = Annotated[
    Path,
    typer.Option(
        "--data",
        exists=True,
        dir_okay=False,
        help="JSONL: one {prompt, output_tokens, model} object a line.",
    ),
]


def _need_forest() -> None:
    try:
        import quantile_forest  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as exc:
        console.print(
            f"[red]the length predictor needs scikit-learn and quantile-forest ({exc.name} is "
            "missing): pip install quantile-forest[/red]"
        )
        raise typer.Exit(2) from None


@contextmanager
def tree_progress(trees: int) -> Iterator[Callable[[int, int], None]]:
    """A progress bar of the forest's trees on stderr; yields the fit's ``progress`` callback
    (also ``tiergate lengths train-db``'s, in the gateway's CLI)."""
    with Progress(
        TextColumn("[bold]growing trees"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("trees", total=trees)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@lengths_app.command("train")
def train_command(
    data: DataFile,
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="model folder to write")],
    trees: Annotated[int, typer.Option(min=1, max=2000, help="trees in the forest")] = 100,
    min_leaf: Annotated[int, typer.Option(min=1, help="least training rows per leaf")] = 5,
    seed: Annotated[int, typer.Option(help="random seed of the forest")] = 0,
    source: Annotated[
        str | None, typer.Option(help="data source recorded in the manifest (default: --data)")
    ] = None,
) -> None:
    """Train a predictor on a JSONL file and save it (forest.npz + manifest.json) in --out."""
    _need_forest()
    from priority.lengths.model import ForestParams
    from priority.lengths.train import read_rows, train

    try:
        rows = read_rows(data)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--data") from None
    if not rows:
        raise typer.BadParameter("the file has no rows", param_hint="--data")
    params = ForestParams(n_estimators=trees, min_samples_leaf=min_leaf, random_state=seed)
    with tree_progress(trees) as progress:
        predictor = train(rows, params=params, data_source=source or str(data), progress=progress)
    version = predictor.save(out)
    console.print(f"trained on {len(rows)} rows; wrote {out} (version {version})")


@lengths_app.command("eval")
def eval_command(
    model: Annotated[
        Path, typer.Option("--model", exists=True, file_okay=False, help="saved model folder")
    ],
    data: DataFile,
    quantile: Annotated[
        float, typer.Option("--quantile", min=0.01, max=0.99, help="bound quantile q")
    ] = 0.95,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Coverage, pinball loss, tightness and per-request prediction time on held-out rows."""
    _need_forest()
    from priority.lengths.evaluate import evaluate, predictor_bounder
    from priority.lengths.model import LengthPredictor, ModelFormatError
    from priority.lengths.train import read_rows

    try:
        predictor = LengthPredictor.load(model)
    except ModelFormatError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    try:
        rows = read_rows(data)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--data") from None
    if not rows:
        raise typer.BadParameter("the file has no rows", param_hint="--data")
    result = evaluate(predictor_bounder(predictor, quantile), rows, quantile)
    if as_json:
        typer.echo(json.dumps(result.to_json()))
        return
    console.print(f"model {predictor.version}, q = {quantile}")
    for key, value in result.to_json().items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        console.print(f"  {key:>17}: {text}")
