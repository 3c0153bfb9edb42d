"""Run the gateway app under uvicorn in a background thread (tests, benchmarks, scripts).

The socket is bound before the server starts, so the port (0 = a free one) is known at once
and cannot be taken in between. ``stop()`` runs the app's lifespan shutdown, which flushes the
usage writer: after it returns, every usage record is in the database.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn
from fastapi import FastAPI

from gateway.app.http_limits import http_options
from gateway.app.state import GatewayState
from gateway.embedded import EmbeddedServer, Listening, bind

STARTUP_TIMEOUT_S = 15.0


def served_options(app: FastAPI) -> dict[str, Any]:
    """The gateway app's own ``http_options`` (head limits, proxy trust: what ``tiergate serve``
    gives uvicorn); none for another app (a test's scripted engine)."""
    settings = getattr(app.state, "settings", None)
    return http_options(settings) if settings is not None else {}


class GatewayThread(Listening):
    """``with GatewayThread(create_app(...)) as gw: gw.base_url``."""

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, **options: Any
    ) -> None:
        """``options``: more of uvicorn's settings (``ssl_certfile``, ``ssl_keyfile``: a test
        engine served over https)."""
        self.app = app
        self.host = host
        self._sock = bind(host, port)
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
            **(served_options(app) | options),
        )
        self.server = EmbeddedServer(config)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def state(self) -> GatewayState:
        state: GatewayState = self.app.state.gateway
        return state

    def start(self) -> GatewayThread:
        self._thread = threading.Thread(target=self._run, name="tiergate-gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if self._error is not None or not self._thread.is_alive():
                raise RuntimeError("the gateway failed to start") from self._error
            if time.monotonic() > deadline:
                self.server.should_exit = True
                raise TimeoutError("the gateway did not start in time")
            time.sleep(0.01)
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self._sock]))
        except BaseException as exc:  # reported by start()
            self._error = exc

    def stop(self) -> None:
        if self._thread is None:
            return
        self.server.should_exit = True
        self._thread.join(timeout=STARTUP_TIMEOUT_S)
        self._thread = None
        self._sock.close()

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
