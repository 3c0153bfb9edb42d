"""``tiergate serve``: the embedded default, runnable on a fresh machine with no configuration.

SQLite (migrated and seeded), four emulated engines in this process on free ports (two Ascend
910B and two A100 profiles serving one model name, so GoRouting really chooses between hardware),
and the gateway on port 8000. With ``--no-emulated`` it serves the backends table instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
from typing import Annotated

import typer
import uvicorn
from rich.console import Console

from gateway.app.app import create_app
from gateway.app.backends import BackendSpec
from gateway.db import migrate
from gateway.db.crud.keys import create_key
from gateway.db.security import server_secret
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.engine_sim.serve import EngineSpec, serve_engines, stop_engines
from gateway.settings import Settings, get_settings
from priority.policies import POLICY_NAMES

EMULATED_FLEET = ("910b-qwen2-7b", "910b-qwen2-7b", "a100-qwen2-7b", "a100-qwen2-7b")
MODEL_NAME = "qwen2-7b"
"""The one model name the emulated fleet serves (clients ask for this)."""

console = Console(stderr=True)


def prepare_database(settings: Settings) -> str | None:
    """Migrate and seed; returns a new demo key if the demo tenant had none (shown once)."""
    migrate.upgrade(settings.database_url)
    factory = make_session_factory(make_engine(settings.database_url))
    actor = f"serve:{getpass.getuser()}"
    with factory.begin() as session:
        seeded = seed_defaults(session, actor=actor)
        if not seeded.demo_key_needed:
            return None
        created = create_key(
            session, actor=actor, tenant="demo", secret=server_secret(settings), name="demo"
        )
        return created.plaintext


async def run(
    settings: Settings, *, host: str, port: int, policy: str, emulated: bool, log_level: str
) -> None:
    engines = []
    backends: list[BackendSpec] | None = None
    if emulated:
        specs = [
            EngineSpec(profile=profile, policy=policy, model_name=MODEL_NAME, seed=i)
            for i, profile in enumerate(EMULATED_FLEET)
        ]
        engines = await serve_engines(specs)
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
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, backends=backends),
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
        )
    )
    try:
        await server.serve()
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
) -> None:
    """Run the gateway (embedded default: SQLite + four emulated engines, seeded tiers)."""
    if policy not in POLICY_NAMES:
        raise typer.BadParameter(
            f"unknown policy {policy!r}; known: {', '.join(POLICY_NAMES)}", param_hint="--policy"
        )
    settings = get_settings()
    demo_key = prepare_database(settings)
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    console.print(f"[bold]tiergate[/bold] gateway on {base} (database {settings.database_url})")
    if demo_key is not None:
        console.print("Demo API key for tenant [bold]demo[/bold] (shown once, store it now):")
        print(demo_key, flush=True)
    else:
        console.print(
            "The demo tenant already has a key; make another with: "
            "[bold]tiergate keys create --tenant demo[/bold]"
        )
    console.print(
        f"Try: curl {base}/v1/chat/completions -H 'Authorization: Bearer $KEY' "
        f"-H 'Content-Type: application/json' "
        f'-d \'{{"model": "{MODEL_NAME}", "messages": [{{"role": "user", '
        f'"content": "hello"}}], "max_tokens": 32}}\''
    )
    if settings.admin_key is None or not settings.admin_key.get_secret_value():
        console.print("Admin API (/admin/v1) is off: set TIERGATE_ADMIN_KEY to enable it.")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            run(
                settings,
                host=host,
                port=port,
                policy=policy,
                emulated=emulated,
                log_level=log_level,
            )
        )
