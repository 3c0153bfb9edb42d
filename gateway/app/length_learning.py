"""The gateway learns its own length model: ``TIERGATE_LENGTHS_LEARN``.

* **Samples.** Each request that finishes (``ok``, one sequence) is handed to the
  :class:`~gateway.db.length_samples.SampleWriter` with the
  :class:`~priority.lengths.features.RequestFeatures` built for its prediction, with the row
  the prediction hashed (reused: a request is featurized once); the writer's thread stores them
  (hashed features, never the prompt text unless ``TIERGATE_LENGTHS_STORE_PROMPTS``). Samples
  are recorded whether or not a model is loaded, so the first model can be trained.
* **Training.** Every worker checks every ``poll_s`` whether training is due: no published
  version yet, or the newest is older than ``TIERGATE_LENGTHS_TRAIN_INTERVAL_S``. One worker
  trains: it must hold the training lock — a session advisory lock on PostgreSQL (one trainer
  per database, whatever the replicas), an exclusive ``flock`` on ``<models>/.train.lock``
  elsewhere (SQLite: every process on one data directory) — and re-checks under it, so a worker
  that waited behind another's training sees the fresh version and skips. The forest grows in a
  child process (``spawn``; it opens its own database connection), so neither the event loop
  nor the GIL of the serving process is held for the minutes a large fit takes.
* **Serving.** A worker loads a version newer than the one it serves beside the serving one and
  swaps it in (:class:`~priority.lengths.serving.PredictorHandle`); a training or load that
  fails leaves the served model in place (``tiergate_length_trainings{outcome="failed"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gateway.app.metrics import GatewayMetrics
from gateway.length_models import Trained, newest, train_and_publish
from gateway.settings import Settings
from priority.lengths.model import ForestParams

if TYPE_CHECKING:
    from gateway.db.length_samples import SampleWriter
    from priority.lengths.serving import PredictorHandle

log = logging.getLogger(__name__)

ADVISORY_LOCK_KEY = 0x74696572_6C656E73  # "tierlens": one trainer per PostgreSQL database
TICK_S = 1.0
"""How often the learner copies the sample writer's counters into the metrics."""
DEFAULT_POLL_S = 30.0
"""How often a worker looks for a newer version (and whether training is due)."""


class TrainingLock:
    """Who may train now: a PostgreSQL advisory lock, else a file lock (module docstring).
    ``acquire`` and ``release`` block on I/O: call them in a thread."""

    def __init__(self, factory: sessionmaker[Session], root: Path) -> None:
        self._factory = factory
        self._root = root
        self._conn: Any = None
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another process holds it."""
        bind = self._factory.kw.get("bind")
        if bind is not None and bind.dialect.name == "postgresql":
            conn = bind.connect()
            got = conn.execute(
                text("SELECT pg_try_advisory_lock(:key)"), {"key": ADVISORY_LOCK_KEY}
            ).scalar_one()
            conn.commit()  # the lock is the session's, not the transaction's
            if got:
                self._conn = conn
            else:
                conn.close()
            return bool(got)
        self._root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._root / ".train.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_LOCK_KEY})
                conn.commit()
            conn.close()  # closing the session releases it in any case
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # releases the flock


class LengthLearner:
    """One worker's part of learning: samples' metrics, the training check, the newest model.

    ``in_process``: fit in a thread of this process instead of a child (tests; a platform
    without ``spawn``).
    """

    def __init__(
        self,
        *,
        handle: PredictorHandle,
        samples: SampleWriter | None,
        metrics: GatewayMetrics,
        factory: sessionmaker[Session],
        database_url: str,
        root: Path,
        interval_s: float,
        min_samples: int,
        max_rows: int,
        keep: int,
        params: ForestParams,
        poll_s: float = DEFAULT_POLL_S,
        in_process: bool = False,
    ) -> None:
        self.handle = handle
        self.samples = samples
        self.metrics = metrics
        self.factory = factory
        self.database_url = database_url
        self.root = root
        self.interval_s = interval_s
        self.min_samples = min_samples
        self.max_rows = max_rows
        self.keep = keep
        self.params = params
        self.poll_s = poll_s
        self.in_process = in_process
        self.loaded: str | None = None
        """The folder name of the published version served (None: none, or an operator's)."""
        self.trainings: dict[str, int] = {"ok": 0, "skipped": 0, "failed": 0}
        self._exported = {"written": 0, "dropped": 0}
        self._served: str | None = None

    # -- serving the newest version -------------------------------------------------------

    async def poll(self) -> bool:
        """Serve the newest published version if it is not the one served; True on a swap.
        A version that does not load is logged and the served model stays."""
        folder = await asyncio.to_thread(newest, self.root)
        if folder is None or folder.name == self.loaded:
            return False
        try:
            version = await asyncio.to_thread(self.handle.load, folder)
        except Exception as exc:
            log.error("length model %s does not load (%s); keeping the served one", folder, exc)
            self.loaded = folder.name  # not retried until a newer one is published
            return False
        self.loaded = folder.name
        self.show_version()
        log.info("length model %s now served (from %s)", version, folder)
        return True

    def show_version(self) -> None:
        """Point ``tiergate_length_model_info`` at the version the handle serves."""
        version = self.handle.version
        if version == self._served:
            return
        if self._served is not None:
            self.metrics.length_model.labels(self._served).set(0)
        if version is not None:
            self.metrics.length_model.labels(version).set(1)
        self._served = version

    # -- training -------------------------------------------------------------------------

    def due(self) -> bool:
        """No version published yet, or the newest is ``interval_s`` old (a file's mtime)."""
        if self.interval_s <= 0:
            return False
        folder = newest(self.root)
        if folder is None:
            return True
        try:
            age = time.time() - folder.stat().st_mtime
        except OSError:
            return True
        return age >= self.interval_s

    async def train(self) -> str:
        """Train if due and this worker gets the lock; the outcome: ``ok``, ``skipped`` (too
        few samples), ``failed``, or ``idle`` (not due, or another worker trains)."""
        lock = TrainingLock(self.factory, self.root)
        if not await asyncio.to_thread(lock.acquire):
            return "idle"
        try:
            if not await asyncio.to_thread(self.due):  # another worker trained meanwhile
                return "idle"
            started = time.monotonic()
            try:
                trained = await self._fit()
            except Exception:
                log.exception("length model training failed; the served model stays")
                return self._count("failed")
            if trained is None:
                return self._count("skipped")
            log.info(
                "length model %s trained on %d samples (%d censored at max_tokens) in %.1f s",
                trained.version,
                trained.rows,
                trained.censored,
                time.monotonic() - started,
            )
        finally:
            await asyncio.to_thread(lock.release)
        await self.poll()
        return self._count("ok")

    async def _fit(self) -> Trained | None:
        call = functools.partial(
            train_and_publish,
            self.database_url,
            self.root,
            params=self.params,
            limit=self.max_rows,
            min_samples=self.min_samples,
            keep=self.keep,
        )
        if self.in_process:
            return await asyncio.to_thread(call)
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Trained | None] = loop.create_future()

        def settle(value: Any, error: BaseException | None = None) -> None:
            if not result.done():
                if error is not None:
                    result.set_exception(error)
                else:
                    result.set_result(value)

        pool = multiprocessing.get_context("spawn").Pool(1)
        try:
            pool.apply_async(
                call,
                callback=lambda value: loop.call_soon_threadsafe(settle, value),
                error_callback=lambda exc: loop.call_soon_threadsafe(settle, None, exc),
            )
            return await result
        finally:  # done: the child is idle; cancelled (shutdown): the fit stops with it
            await asyncio.shield(asyncio.to_thread(pool.terminate))

    def _count(self, outcome: str) -> str:
        self.trainings[outcome] += 1
        self.metrics.length_trainings.labels(outcome).inc()
        return outcome

    # -- the background task --------------------------------------------------------------

    def export(self) -> None:
        """Copy the sample writer's counters into ``tiergate_length_samples``."""
        if self.samples is None:
            return
        for name, value in (("written", self.samples.written), ("dropped", self.samples.dropped)):
            delta = value - self._exported[name]
            if delta > 0:
                self.metrics.length_samples.labels(name).inc(delta)
            self._exported[name] = value

    async def run(self) -> None:
        """Until cancelled: export every :data:`TICK_S`; every ``poll_s`` serve the newest
        version and train if due. A failing round is logged; the next one runs."""
        next_poll = time.monotonic() + self.poll_s
        try:
            while True:
                await asyncio.sleep(TICK_S if self.samples is not None else self.poll_s)
                self.export()
                if time.monotonic() < next_poll:
                    continue
                next_poll = time.monotonic() + self.poll_s
                try:
                    await self.poll()
                    if await asyncio.to_thread(self.due):
                        await self.train()
                except Exception:
                    log.exception("length learning round failed; trying again next round")
        finally:
            self.export()


async def start_learning(
    config: Settings,
    factory: sessionmaker[Session],
    secret: str | bytes,
    metrics: GatewayMetrics,
    handle: PredictorHandle,
) -> tuple[SampleWriter, LengthLearner]:
    """The sample writer and learner of ``TIERGATE_LENGTHS_LEARN``, serving the newest version
    published under ``<data_dir>/lengths/`` if there is one (else the handle's model stays)."""
    from gateway.db.length_samples import SampleWriter

    key = secret.encode() if isinstance(secret, str) else secret
    samples = SampleWriter(
        factory,
        tenant_key=hashlib.sha256(b"tiergate length samples\0" + key).digest(),
        store_prompts=config.lengths_store_prompts,
        max_rows=config.lengths_sample_rows,
    )
    learner = LengthLearner(
        handle=handle,
        samples=samples,
        metrics=metrics,
        factory=factory,
        database_url=config.database_url,
        root=config.data_path / "lengths",
        interval_s=config.lengths_train_interval_s,
        min_samples=config.lengths_min_samples,
        max_rows=config.lengths_sample_rows,
        keep=config.lengths_keep_versions,
        params=ForestParams(n_estimators=config.lengths_train_trees),
        poll_s=min(DEFAULT_POLL_S, config.lengths_train_interval_s or DEFAULT_POLL_S),
    )
    await learner.poll()
    learner.show_version()
    return samples, learner
