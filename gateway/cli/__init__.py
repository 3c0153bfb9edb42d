"""Admin command line: ``tiergate db|tiers|tenants|keys|backends|profiles|prices|budgets|usage|
operators``.

Every command works on ``TIERGATE_DATABASE_URL`` through the same CRUD functions as the admin
API, so the CLI and the API cannot disagree on rules, and every change is audited with actor
``cli:<os user>``. Bad input (unknown tier, duplicate name, bad profile, ...) exits with code 2
and one precise line on stderr; a database that is busy, unreachable or behind exits 1.

One module per resource; :mod:`gateway.cli._common` holds what they share.

``tiergate profiles`` (plural, like the other database-backed groups) manages the latency
profiles stored in the gateway's database; ``tiergate profile`` (singular, from
:mod:`priority.cli.profile`) fits profile files and lists the shipped ones, with no database.
"""

from __future__ import annotations

import typer

from gateway.cli._common import actor, console, err_console
from gateway.cli.admin import admin_app
from gateway.cli.backends import backends_app
from gateway.cli.db import db_app
from gateway.cli.keys import keys_app
from gateway.cli.lengths import register_lengths
from gateway.cli.operators import operators_app
from gateway.cli.profiles import profiles_app
from gateway.cli.spend import budgets_app, prices_app
from gateway.cli.tenants import tenants_app
from gateway.cli.tiers import tiers_app
from gateway.cli.usage import usage

__all__ = ["actor", "console", "err_console", "register", "register_lengths"]


def register(app: typer.Typer) -> None:
    """Mount the admin commands on the ``tiergate`` app."""
    app.add_typer(db_app, name="db")
    app.add_typer(tiers_app, name="tiers")
    app.add_typer(tenants_app, name="tenants")
    app.add_typer(keys_app, name="keys")
    app.add_typer(backends_app, name="backends")
    app.add_typer(profiles_app, name="profiles")
    app.add_typer(prices_app, name="prices")
    app.add_typer(budgets_app, name="budgets")
    app.command("usage")(usage)
    app.add_typer(admin_app, name="admin")
    app.add_typer(operators_app, name="operators")
