"""``tiergate lengths train-db``: train the length predictor from the gateway's stored samples.

The core's ``tiergate lengths train`` reads JSONL with prompt text and never imports the
gateway; the gateway's samples hold hashed feature vectors instead of prompts, so training from
them is this command, mounted beside the core's in the same ``lengths`` group by
:mod:`tiergate_cli`. It reads ``TIERGATE_DATABASE_URL`` (``length_samples``, written while
``TIERGATE_LENGTHS_LEARN`` is on) and writes a model folder as ``train`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy.exc import SQLAlchemyError

from gateway.cli._common import console, database_failure, fail
from gateway.db.session import make_engine, make_session_factory
from gateway.length_models import train_from_samples
from gateway.settings import get_settings
from priority.cli.lengths import tree_progress
from priority.lengths.model import ForestParams


def train_db_command(
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="model folder to write")],
    trees: Annotated[int, typer.Option(min=1, max=2000, help="trees in the forest")] = 100,
    min_leaf: Annotated[int, typer.Option(min=1, help="least training rows per leaf")] = 5,
    seed: Annotated[int, typer.Option(help="random seed of the forest")] = 0,
    limit: Annotated[
        int, typer.Option(min=1, help="train on the newest LIMIT samples")
    ] = 10_000_000,
    min_samples: Annotated[int, typer.Option(min=1, help="refuse with fewer samples")] = 100,
    stop_only: Annotated[
        bool,
        typer.Option(
            "--stop-only/--with-censored",
            help="train on requests that ended on their own only, or also on those stopped at "
            "their max_tokens (kept at that cap: the default, as the periodic trainer does)",
        ),
    ] = False,
) -> None:
    """Train a predictor on the gateway's length samples and save it in --out."""
    url = get_settings().database_url
    params = ForestParams(n_estimators=trees, min_samples_leaf=min_leaf, random_state=seed)
    engine = make_engine(url)
    try:
        with tree_progress(trees) as progress:
            result = train_from_samples(
                make_session_factory(engine),
                params=params,
                limit=limit,
                min_samples=min_samples,
                censored=not stop_only,
                progress=progress,
            )
    except SQLAlchemyError as exc:
        raise database_failure(exc, url) from None
    finally:
        engine.dispose()
    if result is None:
        raise fail(
            f"fewer than {min_samples} length samples stored: turn TIERGATE_LENGTHS_LEARN on "
            "and let the gateway serve traffic first"
        )
    predictor, rows, censored = result
    version = predictor.save(out)
    console.print(
        f"trained on {rows} samples ({censored} stopped at max_tokens); wrote {out} "
        f"(version {version})"
    )


def register_lengths(lengths_app: typer.Typer) -> None:
    """Mount ``train-db`` on the core's ``lengths`` group."""
    lengths_app.command("train-db")(train_db_command)
