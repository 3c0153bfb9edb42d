"""``tiergate backends``: register, list, enable and disable the engines the gateway routes to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy.orm import Session

from gateway.cli._common import actor, console, fail, print_table, read_document, transaction
from gateway.db import crud
from gateway.db.models import BACKEND_KINDS

backends_app = typer.Typer(help="Inference backends the gateway routes to.", no_args_is_help=True)


@backends_app.command("add")
def backends_add(
    name: Annotated[str, typer.Argument(help="backend name")],
    url: Annotated[str, typer.Option(help="base URL, e.g. http://10.0.0.5:8000")],
    model: Annotated[str, typer.Option(help="model name the backend serves")],
    profile: Annotated[
        str,
        typer.Option(
            help="latency profile: a shipped or stored name (`tiergate profiles list`), or a "
            "profile JSON file, stored first under its own name"
        ),
    ],
    kind: Annotated[str, typer.Option(help=f"one of {', '.join(BACKEND_KINDS)}")] = "vllm",
) -> None:
    """Register a backend."""
    with transaction() as session:
        backend = crud.create_backend(
            session,
            actor=actor(),
            name=name,
            base_url=url,
            model=model,
            profile=_backend_profile(session, profile),
            kind=kind,
        )
    console.print(f"added backend [bold]{backend.name}[/] → {backend.base_url}")


@backends_app.command("list")
def backends_list() -> None:
    """List backends."""
    with transaction() as session:
        rows = [
            (b.name, b.base_url, b.model, b.profile, b.kind, b.enabled)
            for b in crud.list_backends(session)
        ]
    print_table("backends", ("name", "url", "model", "profile", "kind", "enabled"), rows)


@backends_app.command("disable")
def backends_disable(name: Annotated[str, typer.Argument(help="backend name")]) -> None:
    """Stop routing to a backend (kept for later)."""
    with transaction() as session:
        crud.set_backend_enabled(session, name, False, actor=actor())
    console.print(f"disabled backend [bold]{name}[/]")


@backends_app.command("enable")
def backends_enable(name: Annotated[str, typer.Argument(help="backend name")]) -> None:
    """Route to a disabled backend again."""
    with transaction() as session:
        crud.set_backend_enabled(session, name, True, actor=actor())
    console.print(f"enabled backend [bold]{name}[/]")


def _backend_profile(session: Session, value: str) -> str:
    """The profile name a new backend references: a known name as given, or the name of the
    profile JSON file ``value`` names, imported in the same transaction (once per document)."""
    if crud.is_known_profile(session, value):
        return value
    path = Path(value)
    if not path.is_file():
        if path.suffix == ".json" or os.sep in value:
            raise fail(f"no profile is named {value!r} and no such profile file exists")
        return value  # the backend's validation reports the unknown name, listing known ones
    stored = crud.ensure_profile(session, read_document(path), actor=actor())
    console.print(f"using stored profile [bold]{stored.name}[/] from {value}")
    return stored.name
