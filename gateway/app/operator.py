"""The operator listener: the gateway's ``/metrics`` on an address of its own, not the API port.

The exposition names backends and tiers, and tenants where the operator turns tenant labels on;
whoever reaches the API port must not read it. So it is served only on ``metrics_addr``
(``TIERGATE_METRICS_ADDR``), which ``tiergate serve`` binds to 127.0.0.1 unless told otherwise.
In Kubernetes that is a container port Prometheus scrapes and the Service never exposes:
nothing to authenticate, no token to rotate (``docs/gateway-design.md``, "Metrics").

The listener is a second uvicorn server on the gateway's own event loop, started and stopped by
the app's lifespan, so every way of running the app gets it, and a scrape reads the gateway's
state on the loop that owns it (no locks, no thread).

Under ``tiergate serve --workers N`` (N > 1) the workers' metrics live in prometheus_client's
multiprocess files (:mod:`gateway.app.multiproc`) and the supervising process serves them all,
merged, on the one operator listener (:func:`multiprocess_operator_app`); a worker then runs no
listener, only :func:`sample_gauges`, which writes the gauges read from the gateway's state
(queue depth, in flight, backend load) to its files every :data:`SAMPLE_INTERVAL_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.app.drain import Drain
from gateway.app.metrics import gauge
from gateway.app.multiproc import multiprocess_dir, render_multiprocess
from gateway.app.state import GatewayState
from gateway.embedded import Listening, bind
from gateway.errors import http_error
from gateway.settings import split_addr

SHUTDOWN_TIMEOUT_S = 2
"""A scrape takes milliseconds; a stuck one must not hold up the gateway's shutdown."""

SAMPLE_INTERVAL_S = 1.0
"""A worker's sampled gauges are at most this old in the merged exposition (a scrape is every
15 s or so)."""

log = logging.getLogger("uvicorn.error")  # beside the API server's "Uvicorn running on ..."


def update_sampled(state: GatewayState) -> None:
    """Bring the gauges that are sampled rather than counted up to date."""
    state.metrics.queue_depth.set(state.queue.queued)
    state.metrics.in_flight.set(state.queue.in_flight)
    state.metrics.queue_service_rate.set(state.queue.measured_rate() or 0.0)
    state.pool.export_all()


def render_metrics(state: GatewayState) -> bytes:
    """The exposition, with the sampled gauges brought up to date."""
    update_sampled(state)
    return state.metrics.render()


def operator_app(state: GatewayState) -> Starlette:
    """``GET /metrics`` of this gateway process, and a 404 in the gateway's error dialect for
    anything else."""
    return _metrics_app(lambda: render_metrics(state))


def multiprocess_operator_app(path: str) -> Starlette:
    """``GET /metrics`` merged over every worker writing to the multiprocess directory
    ``path`` (the supervising process of ``tiergate serve --workers N``)."""
    return _metrics_app(lambda: render_multiprocess(path))


def _metrics_app(render: Callable[[], bytes]) -> Starlette:
    async def metrics(_: Request) -> Response:
        return Response(render(), media_type=CONTENT_TYPE_LATEST)

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
    """The operator listener, serving ``app`` (:func:`operator_app`) on ``host:port`` of this
    loop."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
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
            app,
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
    state: GatewayState, addr: str | None, drain: Drain | None = None
) -> AsyncIterator[MetricsListener | None]:
    """Serve ``/metrics`` on ``addr`` while the context is open; ``None``: no listener (in a
    worker of several, the sampled gauges are written to the multiprocess files instead)."""
    if addr is None:
        if multiprocess_dir() is None:
            yield None
            return
        sampler = asyncio.get_running_loop().create_task(sample_gauges(state, drain))
        try:
            yield None
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        return
    listener = MetricsListener(operator_app(state), *split_addr(addr))
    try:
        await listener.start()
        yield listener
    finally:
        await listener.stop()


async def sample_gauges(state: GatewayState, drain: Drain | None = None) -> None:
    """Write this worker's sampled gauges every :data:`SAMPLE_INTERVAL_S` (the supervisor's
    listener reads them from the multiprocess files; nothing asks this process at scrape
    time), and how many requests it has taken (``tiergate_worker_requests``, one series per
    worker: how evenly the kernel spreads connections)."""
    taken = gauge(
        "tiergate_worker_requests",
        "HTTP requests this worker process has taken since it started (label pid).",
        registry=None,
        mode="liveall",
    )
    while True:
        try:
            update_sampled(state)
            if drain is not None:
                taken.set(drain.taken)
        except Exception:  # a metrics hiccup must not end the sampling
            log.exception("could not sample the gateway's gauges")
        await asyncio.sleep(SAMPLE_INTERVAL_S)
