"""Serving the gateway: migrate and seed the database, say how to call it, run uvicorn.

The gateway serves the backends a :data:`BackendsSource` starts and yields, or, without one, the
backends table. What starts four emulated engines for ``tiergate serve`` (the embedded default
of ``make run``) lives above the gateway, in :mod:`tiergate_cli`: the gateway never imports the
emulated engine (``engine_emulated/``), so it runs unchanged in front of real vLLM engines.

Metrics are served on an operator listener of their own (:mod:`gateway.app.operator`):
``tiergate serve`` always turns it on, at ``TIERGATE_METRICS_ADDR`` or 127.0.0.1:9464 — or a
free port when a gateway beside this one holds 9464 — and prints where it is.

``--workers N`` (``TIERGATE_WORKERS``; default one per CPU, at most 8): with N > 1 this process
binds the API port, starts what the gateway routes to, and supervises N worker processes that
serve the port (:mod:`gateway.workers`), serving their merged metrics itself; with N = 1 it
serves the app itself, as before. Either way SIGTERM drains the gateway before it exits
(:mod:`gateway.graceful`).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import logging
import logging.config
import shlex
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import uvicorn
from rich.console import Console
from uvicorn.config import LOG_LEVELS, LOGGING_CONFIG

from gateway.app.app import create_app
from gateway.app.backends import BackendSpec
from gateway.app.http_limits import http_options
from gateway.db import migrate
from gateway.db.crud import list_backends, operators
from gateway.db.crud.keys import create_key
from gateway.db.security import server_secret
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.embedded import bind
from gateway.graceful import DrainingServer
from gateway.settings import Settings, get_settings, join_addr, split_addr
from gateway.workers import (
    BACKLOG,
    Supervisor,
    WorkerSpec,
    default_workers,
    multiprocess_metrics,
)

BackendsSource = Callable[[], AbstractAsyncContextManager[list[BackendSpec] | None]]
"""Starts what the gateway routes to on the serving loop and yields its specs (None: the
backends table); leaving the context stops it, after the gateway has stopped."""

console = Console(stderr=True)

DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_METRICS_PORT = 9464
"""``tiergate serve``'s operator listener when none is configured: this machine only."""


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


def served_model(settings: Settings) -> str | None:
    """The model a first request should name when the backends table is served
    (``--no-emulated``): that of the first enabled backend; None if none is enabled."""
    factory = make_session_factory(make_engine(settings.database_url))
    with factory() as session:
        rows = list_backends(session, enabled=True, limit=1)
        return rows[0].model if rows else None


def prepare_operator(settings: Settings) -> str | None:
    """On the first start without ``TIERGATE_ADMIN_KEY``: issue the dashboard's operator
    credential (stored only as its keyed hash) and return it, to be printed once. None when an
    admin key is configured or a credential exists (``tiergate admin reset-credential`` makes
    a new one)."""
    if settings.admin_key is not None and settings.admin_key.get_secret_value():
        return None
    factory = make_session_factory(make_engine(settings.database_url))
    with factory.begin() as session:
        if operators.has_credential(session):
            return None
        issued = operators.create_credential(
            session, actor=f"serve:{getpass.getuser()}", secret=server_secret(settings)
        )
        return issued.plaintext


def metrics_address(configured: str | None) -> str:
    """Where ``tiergate serve`` serves ``/metrics``, as a concrete ``host:port``.

    The configured address as given (port 0: a free port, chosen now so that it can be
    printed); unset: 127.0.0.1:9464, or a free port on 127.0.0.1 when 9464 is taken, so that
    ``make run SERVE_ARGS="--port 8001"`` still starts a second gateway beside the first. A
    configured address that is taken is not replaced: starting fails and says so.
    """
    if configured is not None:
        host, port = split_addr(configured)
        if port != 0:
            return join_addr(host, port)
        with bind(host, 0) as probe:
            return join_addr(host, int(probe.getsockname()[1]))
    try:
        probe = bind(DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT)
    except OSError:
        probe = bind(DEFAULT_METRICS_HOST, 0)
    with probe:
        return join_addr(DEFAULT_METRICS_HOST, int(probe.getsockname()[1]))


def try_command(base: str, model: str) -> str:
    """A first request as a shell command: ``$KEY`` in double quotes so the shell expands it."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 32}
    )
    return (
        f"curl {shlex.quote(base + '/v1/chat/completions')} "
        '-H "Authorization: Bearer $KEY" -H "Content-Type: application/json" '
        f"-d {shlex.quote(body)}"
    )


def announce(
    settings: Settings,
    *,
    base: str,
    demo_key: str | None,
    model: str | None,
    operator_credential: str | None = None,
) -> None:
    """Where the gateway listens, the demo key (printed once, on stdout) and a first request;
    the dashboard's URL and, on its first start, the operator credential (once, on stdout)."""
    console.print(f"[bold]tiergate[/bold] gateway on {base} (database {settings.database_url})")
    if settings.ui:
        console.print(f"Admin dashboard: {base}/ui/")
        if operator_credential is not None:
            console.print(
                "Dashboard sign-in credential (also the admin API's bearer; shown once, store "
                "it now; `tiergate admin reset-credential` replaces a lost one):"
            )
            print(operator_credential, flush=True)
        elif settings.admin_key is not None and settings.admin_key.get_secret_value():
            console.print("Sign in to the dashboard with TIERGATE_ADMIN_KEY.")
        else:
            console.print(
                "Sign in with the operator credential printed on the first start "
                "(lost: [bold]tiergate admin reset-credential[/bold])."
            )
    if settings.metrics_addr is not None:
        host, port = split_addr(settings.metrics_addr)
        shown = join_addr("127.0.0.1" if host in ("0.0.0.0", "::") else host, port)
        console.print(f"Prometheus metrics (operators only): http://{shown}/metrics")
    if demo_key is not None:
        console.print("Demo API key for tenant [bold]demo[/bold] (shown once, store it now):")
        print(demo_key, flush=True)
    else:
        console.print(
            "The demo tenant already has a key; make another with: "
            "[bold]tiergate keys create --tenant demo[/bold]"
        )
    if model is None:
        console.print(
            "No backend is enabled: add an engine with [bold]tiergate backends add[/bold] "
            "(or the dashboard's Backends page), then send requests for its model."
        )
    else:
        key_source = "the demo key above" if demo_key is not None else "a key of the demo tenant"
        console.print(f"Set KEY to {key_source} (KEY=tg-...), then")
        # one line, never wrapped, no markup: it must work when pasted into a shell
        line = f"Try: {try_command(base, model)}"
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if (settings.admin_key is None or not settings.admin_key.get_secret_value()) and not (
        settings.ui
    ):
        console.print("Admin API (/admin/v1) is off: set TIERGATE_ADMIN_KEY to enable it.")
    elif settings.admin_key is None or not settings.admin_key.get_secret_value():
        console.print(
            "Admin API (/admin/v1): send the operator credential as its bearer, or set "
            "TIERGATE_ADMIN_KEY."
        )
    workers = settings.workers or 1
    if workers > 1:
        limits = (
            "exact, shared through Redis"
            if settings.redis_url
            else f"each worker enforces limit // {workers} of a limit of at least {workers}, "
            "smaller ones are counted once for all workers (no TIERGATE_REDIS_URL)"
        )
        console.print(f"{workers} worker processes; tenant limits: {limits}.")


async def run(
    settings: Settings,
    *,
    host: str,
    port: int,
    log_level: str,
    backends: BackendsSource | None = None,
) -> None:
    """Serve the gateway in this process until SIGTERM or SIGINT has drained it, inside
    ``backends``' context when given."""
    source = backends() if backends is not None else contextlib.nullcontext(None)
    async with source as specs:
        app = create_app(settings, backends=specs)
        server = DrainingServer(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level=log_level,
                access_log=False,
                backlog=BACKLOG,
                **http_options(settings),  # header limits, proxy trust (security)
            ),
            app.state.drain,
            drain_s=settings.shutdown_drain_s,
            shutdown_delay_s=settings.shutdown_delay_s,
        )
        await server.serve()


async def run_workers(
    settings: Settings,
    *,
    host: str,
    port: int,
    log_level: str,
    workers: int,
    backends: BackendsSource | None = None,
) -> int:
    """Serve the gateway with ``workers`` processes on one port until SIGTERM or SIGINT has
    drained them; returns the exit status (:class:`~gateway.workers.Supervisor`)."""
    sock = bind(host, port)  # first: a port that is taken fails before anything starts
    sock.listen(BACKLOG)
    source = backends() if backends is not None else contextlib.nullcontext(None)
    try:
        async with source as specs, multiprocess_metrics(settings.metrics_addr) as path:
            _configure_logging(log_level)  # after the backends: emulated engines set their own
            spec = WorkerSpec(
                settings.model_copy(update={"metrics_addr": None, "workers": workers}),
                list(specs) if specs is not None else None,
                log_level,
            )
            return await Supervisor(spec, sock, workers, metrics_path=path).run()
    finally:
        sock.close()


def _configure_logging(log_level: str) -> None:
    """uvicorn's log format and level for the supervisor's own lines (workers set their own)."""
    logging.config.dictConfig(LOGGING_CONFIG)
    level = LOG_LEVELS.get(log_level, logging.INFO)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(level)
    access = logging.getLogger("uvicorn.access")  # off, as for the API (``access_log=False``)
    access.handlers = []
    access.propagate = False


def serve(
    *,
    host: str,
    port: int,
    log_level: str,
    model: str | None,
    backends: BackendsSource | None = None,
    metrics_addr: str | None = None,
    workers: int | None = None,
) -> int:
    """Prepare the database, announce, and serve until stopped (``model``: for the example;
    None: the backends table's, :func:`served_model`); returns the exit status.

    ``metrics_addr`` (``--metrics-addr``) overrides ``TIERGATE_METRICS_ADDR``; see
    :func:`metrics_address` for the default. ``workers`` (``--workers``) overrides
    ``TIERGATE_WORKERS``; see :func:`~gateway.workers.default_workers` for the default.
    """
    settings = get_settings()
    chosen = metrics_address(metrics_addr if metrics_addr is not None else settings.metrics_addr)
    count = workers or settings.workers or default_workers()
    settings = settings.model_copy(update={"metrics_addr": chosen, "workers": count})
    demo_key = prepare_database(settings)
    credential = prepare_operator(settings) if settings.ui else None
    if model is None:
        model = served_model(settings)
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    announce(settings, base=base, demo_key=demo_key, model=model, operator_credential=credential)
    with contextlib.suppress(KeyboardInterrupt):  # a signal while starting: nothing to drain
        if count == 1:
            asyncio.run(run(settings, host=host, port=port, log_level=log_level, backends=backends))
        else:
            return asyncio.run(
                run_workers(
                    settings,
                    host=host,
                    port=port,
                    log_level=log_level,
                    workers=count,
                    backends=backends,
                )
            )
    return 0
