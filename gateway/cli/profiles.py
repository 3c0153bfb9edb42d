"""``tiergate profiles``: the latency profiles stored in the gateway's database.

``tiergate profile`` (singular, :mod:`priority.cli.profile`) fits profile files and lists the
shipped ones, with no database.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Column

from gateway.cli._common import actor, console, print_table, read_document, transaction
from gateway.db import crud

profiles_app = typer.Typer(
    help="Latency profiles stored in the gateway's database (import your calibrated ones here; "
    "`tiergate profile fit` makes them).",
    no_args_is_help=True,
)


@profiles_app.command("import")
def profiles_import(
    file: Annotated[Path, typer.Argument(help="profile JSON (`tiergate profile fit` output)")],
    name: Annotated[
        str | None, typer.Option(help="store under this name (default: the file's own name)")
    ] = None,
) -> None:
    """Store a latency profile in the database, so backends on any gateway can name it."""
    document = read_document(file)
    with transaction() as session:
        row = crud.import_profile(session, document, actor=actor(), name=name)
    console.print(f"imported profile [bold]{row.name}[/] from {file} (id {row.id})")


@profiles_app.command("list")
def profiles_list() -> None:
    """List the profiles backends can name: shipped ones and stored (custom) ones."""
    with transaction() as session:
        rows = [
            (
                e.name,
                e.source,
                e.profile.hardware,
                e.profile.model,
                e.profile.tensor_parallel,
                e.row.created_at.strftime("%Y-%m-%d %H:%M") if e.row is not None else None,
                e.row.created_by if e.row is not None else None,
            )
            for e in crud.profile_catalog(session)
        ]
    # the name is what backends are given: never cut it short, wrap the rest instead
    name = Column("name", no_wrap=True)
    columns = (name, "source", "hardware", "model", "TP", "created (UTC)", "created by")
    print_table("latency profiles", columns, rows)


@profiles_app.command("delete")
def profiles_delete(name: Annotated[str, typer.Argument(help="stored profile name")]) -> None:
    """Delete a stored profile that no backend uses."""
    with transaction() as session:
        crud.delete_profile(session, name, actor=actor())
    console.print(f"deleted profile [bold]{name}[/]")
