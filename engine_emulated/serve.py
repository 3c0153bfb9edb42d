"""Serving emulated engines: several uvicorn servers in one process, each on its own port.

``tiergate serve`` starts its engines with :func:`serve_engines` inside its own event loop;
synchronous callers (tests, scripts) use :class:`EngineThread`, which runs them on a private loop
in a daemon thread. Ports default to free ones picked by the OS (the socket is bound before the
server starts, so the port is known and cannot be taken in between), which lets two gateways
with their engines run side by side on one machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import uvicorn
from fastapi import FastAPI

from engine_emulated.app import DEFAULT_MAX_MODEL_LEN, EngineSim, create_engine_app
from gateway.embedded import EmbeddedServer, Listening, bind
from priority.profiles import Profile, load_profile

STARTUP_TIMEOUT_S = 10.0
GRACEFUL_SHUTDOWN_S = 2


@dataclass(frozen=True)
class EngineSpec:
    """One emulated engine to serve."""

    profile: str | Profile
    """A shipped profile name, a profile JSON path, or a :class:`Profile`."""
    policy: str
    model_name: str
    seed: int = 0
    noise_sigma: float = 0.0
    policy_params: Mapping[str, Any] | None = None
    time_scale: float = 1.0
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    port: int = 0
    """0: a free port chosen by the OS."""
    fault_injection: bool = False
    """Serve ``/fault-injection`` (tests and drills: :mod:`engine_emulated.faults`)."""

    def resolve_profile(self) -> Profile:
        return self.profile if isinstance(self.profile, Profile) else load_profile(self.profile)

    def create_app(self) -> FastAPI:
        return create_engine_app(
            self.resolve_profile(),
            self.policy,
            model_name=self.model_name,
            seed=self.seed,
            noise_sigma=self.noise_sigma,
            policy_params=dict(self.policy_params or {}),
            time_scale=self.time_scale,
            max_model_len=self.max_model_len,
            fault_injection=self.fault_injection,
        )


@dataclass(eq=False)
class RunningEngine(Listening):
    """A served engine: its app, its uvicorn server and where it listens."""

    spec: EngineSpec
    app: FastAPI
    server: uvicorn.Server
    host: str
    port: int
    task: asyncio.Task[None] = field(repr=False)

    @property
    def sim(self) -> EngineSim:
        sim: EngineSim = self.app.state.engine_sim
        return sim


async def serve_engine(
    spec: EngineSpec, host: str = "127.0.0.1", *, log_level: str = "warning"
) -> RunningEngine:
    """Start one engine's server on the running loop; returns once it accepts connections."""
    app = spec.create_app()
    sock = bind(host, spec.port, blocking=False)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = EmbeddedServer(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_S
    while not server.started:
        if task.done():
            sock.close()
            task.result()  # raises the startup error
            raise RuntimeError(f"engine server for {spec.model_name} exited during startup")
        if asyncio.get_running_loop().time() > deadline:
            server.should_exit = True
            raise TimeoutError(f"engine server for {spec.model_name} did not start")
        await asyncio.sleep(0.005)
    port = int(sock.getsockname()[1])
    return RunningEngine(spec=spec, app=app, server=server, host=host, port=port, task=task)


async def serve_engines(
    specs: Sequence[EngineSpec], host: str = "127.0.0.1", *, log_level: str = "warning"
) -> list[RunningEngine]:
    """Start every engine in ``specs`` (all or none: a failure stops those already started)."""
    started: list[RunningEngine] = []
    try:
        for spec in specs:
            started.append(await serve_engine(spec, host, log_level=log_level))
    except BaseException:
        await stop_engines(started)
        raise
    return started


async def stop_engines(engines: Sequence[RunningEngine]) -> None:
    """Stop the engines and their servers; open streams end at once."""
    for engine in engines:
        await engine.sim.engine.stop()  # ends open streams, so connections close promptly
        engine.server.should_exit = True
    for engine in engines:
        with contextlib.suppress(asyncio.CancelledError):
            await engine.task


class EngineThread:
    """Emulated engines served from a private event loop in a daemon thread.

    >>> with EngineThread([EngineSpec("a100-qwen2-7b", "slide", "qwen")]) as engines:
    ...     url = engines[0].base_url  # doctest: +SKIP
    """

    def __init__(
        self, specs: Sequence[EngineSpec], host: str = "127.0.0.1", *, log_level: str = "warning"
    ) -> None:
        self.specs = list(specs)
        self.host = host
        self.log_level = log_level
        self.engines: list[RunningEngine] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("EngineThread is not started")
        return self._loop

    def start(self) -> list[RunningEngine]:
        if self._thread is not None:
            raise RuntimeError("EngineThread already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name="tiergate-engine-sim", daemon=True
        )
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            serve_engines(self.specs, self.host, log_level=self.log_level), loop
        )
        try:
            self.engines = future.result(STARTUP_TIMEOUT_S * max(1, len(self.specs)))
        except BaseException:
            self._halt()
            raise
        return self.engines

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(stop_engines(self.engines), self._loop).result(
                STARTUP_TIMEOUT_S + GRACEFUL_SHUTDOWN_S
            )
        finally:
            self._halt()

    def _halt(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=STARTUP_TIMEOUT_S)
        if not loop.is_running():
            loop.close()

    def __enter__(self) -> list[RunningEngine]:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
