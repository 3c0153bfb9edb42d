"""``tiergate db``: migrate, inspect and seed the schema."""

from __future__ import annotations

from typing import Annotated

import typer

from gateway.cli._common import actor, console, fail, transaction
from gateway.cli.keys import print_new_key
from gateway.db import crud, migrate
from gateway.db.errors import DomainError
from gateway.db.security import server_secret
from gateway.db.seed import DEMO_TENANT, seed_defaults
from gateway.settings import get_settings

db_app = typer.Typer(help="Database schema: migrate, inspect, seed.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="target revision")] = "head",
) -> None:
    """Migrate the schema up to REVISION (default: the newest)."""
    migrate.upgrade(get_settings().database_url, revision)
    console.print(f"database at {', '.join(migrate.current_revisions()) or 'base'}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="target revision ('base' = empty)")],
) -> None:
    """Migrate the schema down to REVISION."""
    try:
        migrate.downgrade(revision, get_settings().database_url)
    except DomainError as exc:  # a migration refusing to strand data (e.g. stored profiles)
        raise fail(exc.message) from None
    console.print(f"database at {', '.join(migrate.current_revisions()) or 'base'}")


@db_app.command("current")
def db_current() -> None:
    """Show the schema revision of the database and the newest one available."""
    current = migrate.current_revisions(get_settings().database_url)
    heads = migrate.head_revisions()
    console.print(f"current: {', '.join(current) or 'base (not migrated)'}")
    console.print(f"head:    {', '.join(heads)}")


@db_app.command("seed")
def db_seed() -> None:
    """Create the default tiers and the demo tenant if missing; issue a demo key if it has none."""
    with transaction() as session:
        result = seed_defaults(session, actor=actor())
        created_key = None
        if result.demo_key_needed:
            created_key = crud.create_key(
                session,
                actor=actor(),
                tenant=DEMO_TENANT,
                secret=server_secret(get_settings()),
                name="demo",
            )
    tiers = ", ".join(result.created_tiers) or "none (all present)"
    console.print(f"tiers created: {tiers}")
    console.print(f"demo tenant: {'created' if result.created_demo_tenant else 'present'}")
    if created_key is not None:
        print_new_key(DEMO_TENANT, created_key.plaintext)
