"""The scheduling core's command line: ``sim``, ``profile`` and ``lengths``
(``python -m priority.cli``).

It imports no web framework and nothing of the gateway, so the core and the engine plugins
(installed beside vLLM without the web stack) can run ``python -m priority.cli profile fit``.
The ``tiergate`` console script (:mod:`tiergate_cli`, above the core) mounts these same
commands with :func:`register` and adds the gateway's.
"""

from __future__ import annotations

import typer

from priority.cli.lengths import lengths_app
from priority.cli.profile import profile_app
from priority.cli.sim import sim


def register(app: typer.Typer) -> None:
    """Mount the core's commands (``sim``, ``profile``, ``lengths``) on ``app``."""
    app.command("sim")(sim)
    app.add_typer(profile_app, name="profile")
    app.add_typer(lengths_app, name="lengths")


app = typer.Typer(
    help="tiergate's scheduling core: the cluster simulator, latency profiles, length predictor.",
    no_args_is_help=True,
    add_completion=False,
)
register(app)

__all__ = ["app", "register"]
