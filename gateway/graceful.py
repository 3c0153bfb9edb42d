"""The uvicorn server of ``tiergate serve``: SIGTERM drains the gateway instead of cutting it.

On the first SIGTERM or SIGINT: readiness goes false at once (:class:`~gateway.app.drain.Drain`),
new connections are still accepted for ``shutdown_delay_s`` (a load balancer needs a moment to
see the readiness change; 0 by default), then the listening socket closes and the requests in
flight have ``drain_s`` to finish. At that deadline the ones left are ended cleanly
(:meth:`Drain.abort_all`); uvicorn's own ``timeout_graceful_shutdown`` (``drain_s`` plus
:data:`ABORT_GRACE_S`) cancels anything that still holds on. Then the app's lifespan shutdown
runs — it flushes the usage writer — and the process exits with status 0.

Two changes to uvicorn's ``Server``, both for that last step: it re-raises the captured signal
after serving (the process would die *by* SIGTERM, status 143, not exit 0), and a second
Ctrl-C (``force_exit``) skips the lifespan shutdown, which would lose the usage records still
queued; here a forced exit skips only the waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from types import FrameType

import uvicorn

from gateway.app.drain import Drain

log = logging.getLogger("uvicorn.error")

ABORT_GRACE_S = 2.0
"""After the drain deadline: time for the clean endings to be written before uvicorn cancels."""
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` with the graceful shutdown described above."""

    def __init__(
        self, config: uvicorn.Config, drain: Drain, *, drain_s: float, shutdown_delay_s: float = 0
    ) -> None:
        config.timeout_graceful_shutdown = max(1, round(drain_s + ABORT_GRACE_S))
        super().__init__(config)
        self.drain = drain
        self.drain_s = drain_s
        self.shutdown_delay_s = shutdown_delay_s
        self._exit_at: float | None = None

    def begin_shutdown(self) -> None:
        """What the first signal does (also called by a worker whose supervisor went away)."""
        if self._exit_at is not None:
            return
        self.drain.begin()
        self._exit_at = time.monotonic() + self.shutdown_delay_s
        if self.shutdown_delay_s <= 0:
            self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._exit_at is None:
            self.begin_shutdown()
        elif sig == signal.SIGINT:  # a second Ctrl-C: stop waiting (usage is still flushed)
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self._exit_at is not None and time.monotonic() >= self._exit_at:
            self.should_exit = True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.drain.begin()  # also when uvicorn stops for another reason
        deadline = asyncio.get_running_loop().call_later(self.drain_s, self._abort_in_flight)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            deadline.cancel()
        if self.force_exit:  # uvicorn skipped the lifespan shutdown: usage must still flush
            await self.lifespan.shutdown()

    def _abort_in_flight(self) -> None:
        task = asyncio.ensure_future(self.drain.abort_all())
        self._abort_task = task  # referenced until done
