"""The ``tiergate`` command line."""

from __future__ import annotations

import typer

from gateway.cli import register as register_admin_commands
from gateway.engine_sim.cli import engine_sim_command
from gateway.serve import serve_command
from priority.cli.profile import profile_app
from priority.cli.sim import sim

app = typer.Typer(
    help="tiergate: SLO-aware, multi-priority LLM serving — simulator, profiles and tools.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("sim")(sim)
app.add_typer(profile_app, name="profile")
app.command("serve")(serve_command)
app.command("engine-sim")(engine_sim_command)
register_admin_commands(app)

__all__ = ["app"]
