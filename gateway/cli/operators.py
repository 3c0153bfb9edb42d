"""``tiergate operators``: named operators with roles — list, create (credential shown once),
set-role, reset, delete.

A role is ``owner`` (everything, operators included), ``operator`` (tiers, tenants, keys,
backends, profiles), ``viewer`` (reads only) or ``tenant_admin`` (one tenant's keys and usage;
``--tenant`` names it). Each operator's credential (``tgop-...``) signs in to the dashboard and
is the admin API's bearer; only its keyed hash is stored, under the server secret ``tiergate
serve`` uses. Every change is audited with actor ``cli:<os user>``. This is also the way back
in for whoever holds the database: the last owner cannot be deleted or demoted here either, and
``tiergate admin reset-credential`` issues an owner's credential.
"""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy.orm import Session

from gateway.cli._common import actor, console, print_table, transaction
from gateway.db import crud
from gateway.db.crud import operators
from gateway.db.models import OPERATOR_ROLES
from gateway.db.security import server_secret
from gateway.settings import get_settings

operators_app = typer.Typer(
    help="Named operators with roles (credentials shown once, stored hashed).",
    no_args_is_help=True,
)

ROLE_HELP = f"one of {', '.join(OPERATOR_ROLES)}"
SHOWN_TIME = "%Y-%m-%d %H:%M"


def _tenant_id(session: Session, tenant: str | None) -> int | None:
    return crud.get_tenant(session, tenant).id if tenant is not None else None


def _print_credential(name: str, role: str, plaintext: str, quiet: bool) -> None:
    if not quiet:
        console.print(
            f"Credential of operator [bold]{name}[/] ({role}) — shown once, hand it over now "
            "(dashboard sign-in and admin API bearer):"
        )
    typer.echo(plaintext)  # raw, on its own line


@operators_app.command("list")
def operators_list() -> None:
    """List operators with their roles (never a credential)."""
    with transaction() as session:
        rows = [
            (
                o.name,
                o.role,
                o.tenant.name if o.tenant is not None else None,
                o.created_at.strftime(SHOWN_TIME),
                o.last_used_at.strftime(SHOWN_TIME) if o.last_used_at else None,
            )
            for o in operators.list_operators(session)
        ]
    columns = ("name", "role", "tenant", "created (UTC)", "last sign-in (UTC)")
    print_table("operators", columns, rows)


@operators_app.command("create")
def operators_create(
    name: Annotated[str, typer.Argument(help="the operator's name (the audit log's)")],
    role: Annotated[str, typer.Option(help=ROLE_HELP)],
    tenant: Annotated[str | None, typer.Option(help="a tenant_admin's tenant")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the credential")] = False,
) -> None:
    """Add an operator and print its credential ONCE (only its hash is stored)."""
    with transaction() as session:
        issued = operators.create_credential(
            session,
            actor=actor(),
            secret=server_secret(get_settings()),
            name=name,
            role=role,
            tenant=_tenant_id(session, tenant),
        )
        plaintext, role = issued.plaintext, issued.row.role
    _print_credential(name, role, plaintext, quiet)


@operators_app.command("set-role")
def operators_set_role(
    name: Annotated[str, typer.Argument(help="operator name")],
    role: Annotated[str, typer.Option(help=ROLE_HELP)],
    tenant: Annotated[str | None, typer.Option(help="a tenant_admin's tenant")] = None,
) -> None:
    """Change an operator's role; it applies to its next request."""
    with transaction() as session:
        operators.set_role(
            session, name, actor=actor(), role=role, tenant=_tenant_id(session, tenant)
        )
    console.print(f"operator {name} is now a {role}" + (f" of {tenant}" if tenant else ""))


@operators_app.command("reset")
def operators_reset(
    name: Annotated[str, typer.Argument(help="operator name")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the credential")] = False,
) -> None:
    """Issue a new credential (printed once); the old one and its sessions end at once."""
    with transaction() as session:
        operators.get_operator(session, name)
        issued = operators.reset_credential(
            session, actor=actor(), secret=server_secret(get_settings()), name=name
        )
        plaintext, role = issued.plaintext, issued.row.role
    _print_credential(name, role, plaintext, quiet)


@operators_app.command("delete")
def operators_delete(name: Annotated[str, typer.Argument(help="operator name")]) -> None:
    """Delete an operator: its credential stops working and its sessions end."""
    with transaction() as session:
        operators.delete_operator(session, name, actor=actor())
    console.print(f"deleted operator {name}")
