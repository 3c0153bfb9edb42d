"""The operator listener: the gateway's ``/metrics`` on an address of its own, not the API port.

The exposition names backends and tiers, and tenants where the operator turns tenant labels on;
whoever reaches the API port must not read it. So it is served only on ``metrics_addr``
(``TIERGATE_METRICS_ADDR``), which ``tiergate serve`` binds to 127.0.0.1 unless told otherwise.
In Kubernetes that is a container port Prometheus scrapes and the Service never exposes:
nothing to authenticate, no token to rotate (``docs/gateway-design.md``, "Metrics").

The listener is a second uvicorn server on the gateway's own event loop, started and stopped by
the app's lifespan, so every way of running the app gets it, and a scrape reads the gateway's
state on the loop that owns it (no locks, no thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.app.state import GatewayState
from gateway.embedded import Listening, bind
from gateway.errors import http_error
from gateway.settings import split_addr

SHUTDOWN_TIMEOUT_S = 2
"""A scrape takes milliseconds; a stuck one must not hold up the gateway's shutdown."""

log = logging.getLogger("uvicorn.error")  # beside the API server's "Uvicorn running on ..."


def render_metrics(state: GatewayState) -> bytes:
    """The exposition, with the gauges that are sampled rather than counted brought up to date."""
    state.metrics.queue_depth.set(state.queue.queued)
    state.metrics.in_flight.set(state.queue.in_flight)
    state.pool.export_all()
    return state.metrics.render()


def operator_app(state: GatewayState) -> Starlette:
    """``GET /metrics``, and a 404 in the gateway's error dialect for anything else."""

    async def metrics(_: Request) -> Response:
        return Response(render_metrics(state), media_type=CONTENT_TYPE_LATEST)

    async def error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return http_error(exc).response()

    return Starlette(
        routes=[Route("/metrics", metrics, methods=["GET"])],
        exception_handlers={HTTPException: error},
    )


class _InnerServer(uvicorn.Server):
    """A uvicorn server inside the gateway's: signals are the API server's to handle, and its
    "Started/Finished server process" lines would only repeat the API server's."""

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        if not self.config.loaded:
            self.config.load()
        self.lifespan = self.config.lifespan_class(self.config)
        await self.startup(sockets=sockets)
        if not self.should_exit:
            await self.main_loop()
        if self.started:
            await self.shutdown(sockets=sockets)


class MetricsListener(Listening):
    """The operator listener, serving :func:`operator_app` on ``host:port`` of this loop."""

    def __init__(self, state: GatewayState, host: str, port: int) -> None:
        self.host = host
        try:
            self._sock = bind(host, port)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot serve metrics on {host}:{port} ({exc.strerror}); choose another "
                "address with TIERGATE_METRICS_ADDR or tiergate serve --metrics-addr",
            ) from exc
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            operator_app(state),
            lifespan="off",
            access_log=False,
            log_config=None,  # uvicorn's logging is the API server's to configure, not ours
            timeout_graceful_shutdown=SHUTDOWN_TIMEOUT_S,
        )
        self._server = _InnerServer(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def metrics_url(self) -> str:
        """Where Prometheus scrapes."""
        return f"{self.url}/metrics"

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[self._sock])
        )
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the metrics listener stopped while starting")
            await asyncio.sleep(0.005)
        log.info("Serving /metrics for operators on %s", self.metrics_url)

    async def stop(self) -> None:
        if self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._sock.close()


@contextlib.asynccontextmanager
async def metrics_listener(
    state: GatewayState, addr: str | None
) -> AsyncIterator[MetricsListener | None]:
    """Serve ``/metrics`` on ``addr`` while the context is open; ``None``: no listener."""
    if addr is None:
        yield None
        return
    listener = MetricsListener(state, *split_addr(addr))
    try:
        await listener.start()
        yield listener
    finally:
        await listener.stop()
