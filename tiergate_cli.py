"""The ``tiergate`` console script, assembled above every layer it mounts.

The layers point one way, so each one's commands live with it and meet only here: the scheduling
core's ``sim``, ``profile`` and ``lengths`` (:mod:`priority.cli`, no web stack), the gateway's
admin commands (:mod:`gateway.cli`) and its server (:mod:`gateway.serve`), and the emulated engine
(``engine_emulated/``), which the gateway itself never imports: ``tiergate engine-sim``, and
the four engines ``tiergate serve`` starts by default (:func:`emulated_fleet`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated

import typer
from rich.console import Console

from engine_emulated.cli import engine_sim_command
from engine_emulated.serve import EngineSpec, serve_engines, stop_engines
from gateway.app.backends import BackendSpec
from gateway.cli import register as register_admin_commands
from gateway.cli import register_lengths
from gateway.serve import serve
from gateway.settings import split_addr
from priority.cli import register as register_core_commands
from priority.cli.lengths import lengths_app
from priority.policies import POLICY_NAMES

EMULATED_FLEET = ("910b-qwen2-7b", "910b-qwen2-7b", "a100-qwen2-7b", "a100-qwen2-7b")
"""Two Ascend 910B and two A100 profiles serving one model, so GoRouting really chooses."""
MODEL_NAME = "qwen2-7b"
"""The one model name the emulated fleet serves (clients ask for this)."""

console = Console(stderr=True)


@asynccontextmanager
async def emulated_fleet(policy: str) -> AsyncIterator[list[BackendSpec]]:
    """Serve :data:`EMULATED_FLEET` on free ports of this loop; yields them as gateway backends."""
    specs = [
        EngineSpec(profile=profile, policy=policy, model_name=MODEL_NAME, seed=i)
        for i, profile in enumerate(EMULATED_FLEET)
    ]
    engines = await serve_engines(specs)
    try:
        backends = [
            BackendSpec(
                name=f"emulated-{i}-{spec.profile}",
                base_url=engine.url,
                model=MODEL_NAME,
                profile=str(spec.profile),
                kind="emulated",
            )
            for i, (spec, engine) in enumerate(zip(specs, engines, strict=True))
        ]
        for backend in backends:
            console.print(f"  emulated engine {backend.name} at {backend.base_url}")
        yield backends
    finally:
        await stop_engines(engines)


def serve_command(
    host: Annotated[str, typer.Option(help="Address the gateway binds.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Gateway port.")] = 8000,
    policy: Annotated[
        str, typer.Option(help=f"Policy of the emulated engines: {', '.join(POLICY_NAMES)}.")
    ] = "slide",
    emulated: Annotated[
        bool,
        typer.Option(
            "--emulated/--no-emulated",
            help="Serve four in-process emulated engines (default) or the backends table.",
        ),
    ] = True,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    metrics_addr: Annotated[
        str | None,
        typer.Option(
            help="host:port of the operator listener serving /metrics (not the API port). "
            "Default: TIERGATE_METRICS_ADDR, else 127.0.0.1:9464 (a free port if taken).",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Gateway worker processes behind the one port. Default: TIERGATE_WORKERS, "
            "else one per CPU, at most 8. Without TIERGATE_REDIS_URL each worker enforces "
            "1/N of every tenant limit.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the gateway (embedded default: SQLite + four emulated engines, seeded tiers)."""
    if policy not in POLICY_NAMES:
        raise typer.BadParameter(
            f"unknown policy {policy!r}; known: {', '.join(POLICY_NAMES)}", param_hint="--policy"
        )
    if metrics_addr is not None:
        try:
            split_addr(metrics_addr)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--metrics-addr") from exc
    status = serve(
        host=host,
        port=port,
        log_level=log_level,
        model=MODEL_NAME if emulated else None,  # else: what the backends table serves
        backends=partial(emulated_fleet, policy) if emulated else None,
        metrics_addr=metrics_addr,
        workers=workers,
    )
    if status:
        raise typer.Exit(status)


app = typer.Typer(
    help="tiergate: SLO-aware, multi-priority LLM serving — simulator, profiles and tools.",
    no_args_is_help=True,
    add_completion=False,
)
register_core_commands(app)
app.command("serve")(serve_command)
app.command("engine-sim")(engine_sim_command)
register_admin_commands(app)
register_lengths(lengths_app)  # the gateway's `lengths train-db`, beside the core's commands


def plain_help(typer_app: typer.Typer) -> None:
    """Click's own help formatter for ``typer_app`` and every group under it: it wraps the
    help text, where Rich's option table cuts option names short on an 80-column terminal
    (``--min-deadline-…``). Errors are then click's plain ``Error: ...`` lines too."""
    typer_app.rich_markup_mode = None
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            plain_help(group.typer_instance)


plain_help(app)

__all__ = ["EMULATED_FLEET", "MODEL_NAME", "app", "emulated_fleet"]

if __name__ == "__main__":
    app()
