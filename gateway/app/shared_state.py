"""State the workers of ``tiergate serve --workers N`` share without Redis, in shared memory.

The kernel hands each new connection to whichever worker accepts first, so a tenant's requests
land on any worker: state a request needs from an earlier one (a workflow's deadline and stage
count, a limit smaller than the number of workers, the dashboard's failed sign-ins) must be
seen by all of them. With
``TIERGATE_REDIS_URL`` it lives in Redis; without it, here: the supervisor creates one file per
table in a fresh directory (on ``/dev/shm`` where there is one, so the pages never touch a
disk), every worker maps it, and every read-modify-write runs under that file's lock.

* **A lock the kernel releases.** ``flock`` on the file, taken by each process on its own open
  file description: a worker killed while holding it (SIGKILL, the OOM killer) releases it when
  its descriptors close, so no other worker ever waits on a dead one. A thread lock inside each
  process serialises that process's own threads (``flock`` does not). A critical section is a
  few numpy operations on one small bucket of the table and never awaits: microseconds.
* **Torn writes are harmless.** A writer that dies mid-update leaves at most one row half
  written; each table writes a new row's key last, so a half-written row is not found.
* **Why not the database.** The embedded default is SQLite: a write per workflow call would
  serialise on its single writer lock with the usage writer, and a slow disk would add to every
  call's latency. Why not the supervisor as a server: a round trip over a pipe per call, and
  one more process every call depends on. Shared memory costs a lock and a copy.

Only the processes of one host share these tables; replicas behind a load balancer need Redis.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

WORKFLOWS_FILE = "workflows"
LIMITS_FILE = "limits"
SIGNIN_FILE = "signin"


class SharedFile:
    """A file mapped into this process, and the lock that guards every change to it."""

    def __init__(self, path: Path, size: int, *, owner: bool) -> None:
        self.path = path
        self.size = size
        self.owner = owner
        self._fd = os.open(path, os.O_RDWR)
        self.buffer = mmap.mmap(self._fd, size)
        self._thread_lock = threading.Lock()

    @classmethod
    def create(cls, path: Path, size: int) -> SharedFile:
        """A zero-filled file of ``size`` bytes (sparse: pages are allocated when written)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        return cls(path, size, owner=True)

    @classmethod
    def private(cls, size: int) -> SharedFile:
        """A table no other process maps (one process, or tests): same code, nothing shared."""
        directory = Path(tempfile.mkdtemp(prefix="tiergate-state-"))
        table = cls.create(directory / "table", size)
        os.unlink(table.path)  # gone from the file system; the mapping stays
        os.rmdir(directory)
        table.owner = False
        os.close(table._fd)  # no other process: the thread lock is the whole lock
        table._fd = -1
        return table

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive against every other process (and thread) using this table."""
        with self._thread_lock:
            if self._fd < 0:  # private
                yield
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # numpy views still exported: the OS unmaps
            self.buffer.close()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def _state_root() -> str | None:
    """``/dev/shm`` when it is a writable directory (memory, never disk), else the default."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


@dataclass
class SharedState:
    """The tables of one supervisor's workers: their directory, and this process's slot."""

    directory: Path
    workers: int
    workflows: SharedFile
    limits: SharedFile
    signin: SharedFile
    slot: int | None = None
    """This worker's slot (None: the supervisor)."""

    @classmethod
    def create(cls, workers: int) -> SharedState:
        """The supervisor's: a fresh directory with every table, zeroed."""
        from gateway.app.ui.sessions import signin_table_bytes
        from gateway.app.workflows import SHARED_TABLE_BYTES
        from gateway.limits.shared import table_bytes

        directory = Path(tempfile.mkdtemp(prefix="tiergate-state-", dir=_state_root()))
        return cls(
            directory,
            workers,
            SharedFile.create(directory / WORKFLOWS_FILE, SHARED_TABLE_BYTES),
            SharedFile.create(directory / LIMITS_FILE, table_bytes(workers)),
            SharedFile.create(directory / SIGNIN_FILE, signin_table_bytes()),
        )

    @classmethod
    def attach(cls, directory: str | Path, workers: int, slot: int) -> SharedState:
        from gateway.app.ui.sessions import signin_table_bytes
        from gateway.app.workflows import SHARED_TABLE_BYTES
        from gateway.limits.shared import table_bytes

        path = Path(directory)
        return cls(
            path,
            workers,
            SharedFile(path / WORKFLOWS_FILE, SHARED_TABLE_BYTES, owner=False),
            SharedFile(path / LIMITS_FILE, table_bytes(workers), owner=False),
            SharedFile(path / SIGNIN_FILE, signin_table_bytes(), owner=False),
            slot,
        )

    def worker_exited(self, slot: int) -> None:
        """The supervisor, when a worker exits: the concurrency slots it held are free."""
        from gateway.limits.shared import SharedLimitTable

        SharedLimitTable(self.limits, self.workers, slot=None).release_worker(slot)

    def close(self) -> None:
        self.workflows.close()
        self.limits.close()
        self.signin.close()
        if self.slot is None:
            shutil.rmtree(self.directory, ignore_errors=True)


_joined: SharedState | None = None


def join(directory: str, workers: int, slot: int) -> SharedState:
    """Attach this worker process to its supervisor's tables, as ``slot``."""
    global _joined
    _joined = SharedState.attach(directory, workers, slot)
    return _joined


def joined() -> SharedState | None:
    """This worker's shared tables, or None (one process: nothing to share)."""
    return _joined
