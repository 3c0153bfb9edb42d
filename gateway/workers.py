"""``tiergate serve --workers N``: N gateway processes behind one port, and their supervisor.

The supervising process (the one ``tiergate serve`` started) has prepared the database, started
what the gateway routes to (the emulated fleet, when serving the embedded default) and bound
the API socket once. It then starts N workers, each serving the same listening socket with its
own event loop (``uvicorn.Server(...).serve(sockets=[sock])``), and serves the workers' merged
``/metrics`` itself (:mod:`gateway.app.multiproc`).

* **One inherited socket, not SO_REUSEPORT.** The port is bound once and never unbound while
  the supervisor lives, so a restarted worker serves it at once and a bind error is reported
  before any worker starts. The kernel hands each new connection to whichever worker accepts
  first, so a busy worker takes fewer; SO_REUSEPORT would hash connections to workers whatever
  their load, and drop the connections queued on a worker that dies.
* **Spawned, not forked.** The supervisor already runs threads (database pool, the emulated
  engines' event loop); forking a threaded process copies locks held by other threads. A
  spawned worker imports afresh, which is also what puts prometheus_client in multiprocess mode
  (``PROMETHEUS_MULTIPROC_DIR`` is set before the first worker starts).
* **Supervision.** A worker that exits while the supervisor is not stopping is started again,
  after 0.5 s, doubling up to :data:`MAX_BACKOFF_S` while it keeps failing within
  :data:`STABLE_S`; one that fails before any worker ever served (a broken configuration) stops
  the whole server with status 1. A worker whose supervisor disappears drains and exits.
* **Shared prefill queues.** The supervisor creates one shared-memory table
  (:mod:`gateway.app.shared_queue`) in which each worker publishes, per backend, the prefills it
  dispatched there and has not seen a first token for; every worker's router adds the others'
  to its view of each backend. A worker's rows are zeroed when it exits.
* **Shared workflows and small limits.** A second set of tables
  (:mod:`gateway.app.shared_state`): workflows, and the tenant limits below N, so that a
  workflow's later call or a tenant's next request finds the same state on any worker.
* **Shutdown.** SIGTERM or SIGINT: the supervisor closes its copy of the socket and sends each
  worker SIGTERM; each drains (:mod:`gateway.graceful`: readiness false, no new connections,
  in-flight requests finish within ``TIERGATE_SHUTDOWN_DRAIN_S``, usage flushed) and exits 0. A
  worker still running :data:`EXIT_GRACE_S` after its drain bound is killed. A second signal
  tells the workers to stop waiting for their requests (they still flush usage).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import uvicorn

from gateway.app import multiproc, shared_queue, shared_state
from gateway.app.backends import BackendSpec
from gateway.app.http_limits import http_options
from gateway.app.multiproc import forget_process
from gateway.app.operator import MetricsListener, multiprocess_operator_app
from gateway.graceful import ABORT_GRACE_S, SIGNALS, DrainingServer
from gateway.settings import Settings, split_addr

log = logging.getLogger("uvicorn.error")

MAX_DEFAULT_WORKERS = 8
"""The default is one worker per CPU this process may use, at most this many."""
BACKLOG = 4096
"""Connections the kernel queues on the API socket (also while workers start)."""
BASE_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
STABLE_S = 10.0
"""A worker that served this long before exiting is restarted without delay growth."""
JOIN_TIMEOUT_S = 5.0
EXIT_GRACE_S = 30.0
"""After its drain bound, how long a stopping worker may take to flush usage and exit."""


def default_workers() -> int:
    """One per CPU this process may run on (its affinity, e.g. a container's cpuset), at most
    :data:`MAX_DEFAULT_WORKERS`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker serves (pickled to each spawned worker)."""

    settings: Settings
    backends: list[BackendSpec] | None
    log_level: str


@contextlib.asynccontextmanager
async def multiprocess_metrics(addr: str | None) -> AsyncIterator[str]:
    """A fresh multiprocess directory for the workers to be started in the context (yielded),
    and the operator listener serving their merged metrics on ``addr`` (None: none).

    ``PROMETHEUS_MULTIPROC_DIR`` is set in this process's environment, which spawned workers
    inherit; this process's own metrics, if any, stay in memory (prometheus_client chose when it
    was imported).
    """
    path = tempfile.mkdtemp(prefix="tiergate-metrics-")
    previous = os.environ.get(multiproc.ENV)
    os.environ[multiproc.ENV] = path
    try:
        if addr is None:
            yield path
            return
        listener = MetricsListener(multiprocess_operator_app(path), *split_addr(addr))
        await listener.start()
        try:
            yield path
        finally:
            await listener.stop()
    finally:
        if previous is None:
            os.environ.pop(multiproc.ENV, None)
        else:
            os.environ[multiproc.ENV] = previous
        shutil.rmtree(path, ignore_errors=True)


# ---- the worker process -------------------------------------------------------------------


@dataclass(frozen=True)
class SharedSlot:
    """Where a worker publishes its queued prefills: the table's name, size and its row."""

    table: str
    workers: int
    slot: int
    state: str = ""
    """The directory of the workers' other shared tables (:mod:`gateway.app.shared_state`)."""


def worker_main(
    spec: WorkerSpec, sock: socket.socket, ready: Connection, shared: SharedSlot | None = None
) -> None:
    """A worker: the gateway app on the inherited socket until SIGTERM (or its supervisor
    goes away); says when it serves by sending its pid on ``ready``."""
    from gateway.app.app import create_app  # after spawn: prometheus_client in multiprocess mode

    if shared is not None:  # before the app: its backend pool publishes there
        shared_queue.join(shared.table, shared.workers, shared.slot, os.getpid())
        if shared.state:  # workflows and small limits, whichever worker a request reaches
            shared_state.join(shared.state, shared.workers, shared.slot)

    early: list[int] = []  # a stop before the server's own handlers are in place is kept
    for sig in SIGNALS:
        signal.signal(sig, lambda received, _: early.append(received))
    settings = spec.settings
    app = create_app(settings, backends=spec.backends)
    server = DrainingServer(
        uvicorn.Config(
            app,
            log_level=spec.log_level,
            access_log=False,
            lifespan="on",
            backlog=BACKLOG,
            **http_options(settings),  # header limits, proxy trust (security)
        ),
        app.state.drain,
        drain_s=settings.shutdown_drain_s,
        shutdown_delay_s=settings.shutdown_delay_s,
    )
    _run(_serve_worker(server, sock, ready, early))


async def _serve_worker(
    server: DrainingServer, sock: socket.socket, ready: Connection, early: list[int]
) -> None:
    loop = asyncio.get_running_loop()
    parent = multiprocessing.parent_process()
    if parent is not None and parent.sentinel is not None:
        sentinel = parent.sentinel

        def orphaned() -> None:  # readable: the supervisor is gone (killed), nobody will stop us
            loop.remove_reader(sentinel)
            log.warning("the supervisor is gone: draining")
            server.begin_shutdown()

        loop.add_reader(sentinel, orphaned)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
        if early:
            server.begin_shutdown()
    if server.started:
        with contextlib.suppress(OSError):
            ready.send(os.getpid())
    ready.close()
    await task


def _run(main: Any) -> None:
    """Run on uvloop when installed (uvicorn's own choice)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


# ---- the supervisor -----------------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    slot: int
    process: BaseProcess
    ready_conn: Connection
    ready_at: float | None = None
    exited: bool = False


class Supervisor:
    """Starts ``count`` workers on ``sock``, keeps them running, stops them on a signal."""

    def __init__(
        self,
        spec: WorkerSpec,
        sock: socket.socket,
        count: int,
        *,
        metrics_path: str | None = None,
    ) -> None:
        self.spec = spec
        self.sock = sock
        self.count = count
        self.metrics_path = metrics_path
        self.workers: dict[int, _Worker] = {}
        """By slot: the worker running (or last run) in each."""
        self.failures = [0] * count
        self.stopping = False
        self.failed = False
        self.ever_served = False
        self._announced = False
        self.killed = 0
        self._ctx = multiprocessing.get_context("spawn")
        self._restarts: dict[int, asyncio.TimerHandle] = {}
        self._done: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self.shared: shared_queue.PrefillTable | None = None
        """The workers' shared prefill table, while :meth:`run` runs."""
        self.state: shared_state.SharedState | None = None
        """The workers' shared workflows and small limits, while :meth:`run` runs."""
        self.on_ready: Callable[[list[int]], None] | None = None
        """Called once with the workers' pids when all of them serve."""

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers.values() if w.process.pid and not w.exited]

    async def run(self) -> int:
        """Supervise until stopped; 0 when every worker drained and exited cleanly."""
        self._loop = loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        self.shared = shared_queue.PrefillTable.create(self.count)
        self.state = shared_state.SharedState.create(self.count)
        try:
            for slot in range(self.count):
                self._start(slot)
            await self._done.wait()
        finally:
            self.shared.close()
            self.shared = None
            self.state.close()
            self.state = None
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            if self._kill_timer is not None:
                self._kill_timer.cancel()
        clean = all(_clean_exit(w) for w in self.workers.values())
        return 0 if clean and not self.failed and not self.killed else 1

    def stop(self) -> None:
        """Drain every worker and end :meth:`run` (what SIGTERM does)."""
        if self.stopping:
            return
        self.stopping = True
        for handle in self._restarts.values():
            handle.cancel()
        self._restarts.clear()
        self.sock.close()  # the workers hold their own copies until they stop accepting
        live = [w for w in self.workers.values() if not w.exited]
        log.info("stopping %d worker(s): draining", len(live))
        for worker in live:
            _signal(worker, signal.SIGTERM)
        settings = self.spec.settings
        bound = settings.shutdown_delay_s + settings.shutdown_drain_s + ABORT_GRACE_S
        assert self._loop is not None
        self._kill_timer = self._loop.call_later(bound + EXIT_GRACE_S, self._kill_all)
        self._check_done()

    def _on_signal(self, sig: int) -> None:
        if not self.stopping:
            self.stop()
            return
        log.info("second signal: workers stop waiting for requests in flight")
        for worker in self.workers.values():
            if not worker.exited:
                _signal(worker, signal.SIGINT)

    def _kill_all(self) -> None:
        for worker in self.workers.values():
            if not worker.exited:
                log.error("worker %s did not exit in time: killed", worker.process.pid)
                self.killed += 1
                worker.process.kill()

    def _start(self, slot: int) -> None:
        self._restarts.pop(slot, None)
        if self.stopping:
            return
        receive, send = self._ctx.Pipe(duplex=False)
        assert self.shared is not None and self.state is not None
        shared = SharedSlot(self.shared.name, self.count, slot, str(self.state.directory))
        process = self._ctx.Process(
            target=worker_main,
            args=(self.spec, self.sock, send, shared),
            name=f"tiergate-worker-{slot}",
        )
        process.start()
        send.close()
        worker = _Worker(slot, process, receive)
        self.workers[slot] = worker
        assert self._loop is not None
        self._loop.add_reader(receive.fileno(), self._on_ready, worker)
        self._loop.add_reader(process.sentinel, self._on_exit, worker)

    def _on_ready(self, worker: _Worker) -> None:
        assert self._loop is not None
        self._loop.remove_reader(worker.ready_conn.fileno())
        try:
            worker.ready_conn.recv()
        except (EOFError, OSError):  # exited before serving: _on_exit tells
            return
        finally:
            worker.ready_conn.close()
        worker.ready_at = time.monotonic()
        self.ever_served = True
        if not self._announced and self._all_ready():
            self._announced = True
            log.info("%d workers serving (pids %s)", self.count, self.pids)
            if self.on_ready is not None:
                self.on_ready(self.pids)

    def _all_ready(self) -> bool:
        return len(self.workers) == self.count and all(
            w.ready_at is not None for w in self.workers.values()
        )

    def _on_exit(self, worker: _Worker) -> None:
        assert self._loop is not None
        self._loop.remove_reader(worker.process.sentinel)
        if not worker.ready_conn.closed:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(worker.ready_conn.fileno())
            worker.ready_conn.close()
        worker.process.join(JOIN_TIMEOUT_S)  # its sentinel says it is ending: reap it
        worker.exited = True
        if self.shared is not None:  # its queued prefills are no one's now
            self.shared.clear_worker(worker.slot)
        if self.state is not None:  # and the concurrency slots it held are free
            self.state.worker_exited(worker.slot)
        pid, code = worker.process.pid, worker.process.exitcode
        if self.metrics_path is not None and pid is not None:
            forget_process(pid, self.metrics_path)
        if self.stopping:
            log.info("worker %s exited (status %s)", pid, code)
            self._check_done()
            return
        served = worker.ready_at is not None
        if not served and not self.ever_served:
            log.error("worker %s failed to start (status %s): stopping", pid, code)
            self.failed = True
            self.stop()
            return
        stable = served and time.monotonic() - (worker.ready_at or 0.0) >= STABLE_S
        self.failures[worker.slot] = 1 if stable else self.failures[worker.slot] + 1
        delay = min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2 ** (self.failures[worker.slot] - 1))
        log.error(
            "worker %s exited unexpectedly (status %s): restarting in %.1f s", pid, code, delay
        )
        self._restarts[worker.slot] = self._loop.call_later(delay, self._start, worker.slot)

    def _check_done(self) -> None:
        if self.stopping and all(w.exited for w in self.workers.values()):
            assert self._done is not None
            self._done.set()


def _clean_exit(worker: _Worker) -> bool:
    """Exited 0, or ended by SIGTERM while still importing (before it could serve anything)."""
    code = worker.process.exitcode
    return code == 0 or (code == -signal.SIGTERM and worker.ready_at is None)


def _signal(worker: _Worker, sig: int) -> None:
    pid = worker.process.pid
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
