"""``tiergate admin``: the dashboard's operator credential.

``reset-credential`` issues a new operator credential and prints it once: for a credential
lost after ``tiergate serve`` printed it, or one that may have leaked. The old credential stops
working at once and every dashboard session it signed in is ended; the operator keeps its role
(a name that has no credential yet gets an owner's: the way back in for whoever holds the
database; ``tiergate operators`` manages the others). The change is audited
(``operator_credential``, actor ``cli:<os user>``). Only the keyed hash is stored, under the
server secret ``tiergate serve`` uses (``TIERGATE_SECRET``, or the one in the data directory).
"""

from __future__ import annotations

from typing import Annotated

import typer

from gateway.cli._common import actor, console, transaction
from gateway.db.crud import operators
from gateway.db.security import server_secret
from gateway.settings import get_settings

admin_app = typer.Typer(help="The admin dashboard's operator credential.", no_args_is_help=True)


@admin_app.command("reset-credential")
def reset_credential(
    name: Annotated[
        str, typer.Option(help="operator name (the audit log's admin-ui:<name>)")
    ] = operators.DEFAULT_OPERATOR,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the credential")] = False,
) -> None:
    """Issue a new operator credential (printed once); the old one and its sessions end."""
    secret = server_secret(get_settings())
    with transaction() as session:
        issued = operators.reset_credential(session, actor=actor(), secret=secret, name=name)
        plaintext = issued.plaintext
    if quiet:
        print(plaintext)
        return
    console.print(
        f"New dashboard credential for operator [bold]{name}[/bold] (shown once, store it now; "
        "also the admin API's bearer). The previous one no longer works:"
    )
    print(plaintext)
