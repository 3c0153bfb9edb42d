"""The usage writer's overflow on local disk: records the database could not take in time.

When the database is unreachable for longer than the in-memory buffer lasts, or the gateway
stops while it is, the records go here instead of being dropped: append-only JSON lines under
``<data_dir>/usage-spool/``, one ``fsync`` per appended batch, so a record the writer counts as
spooled survives a crash of the process (a torn last line, from a crash in mid-write of a batch
that was never confirmed, is skipped and counted). The spool is bounded in bytes: a batch that
would take the directory past ``max_bytes`` is refused (the writer then drops and counts it);
nothing else is ever dropped.

Segments are files of their own (``usage-<ns>-<pid>-<random>.jsonl``, oldest first by name).
The segment a process appends to is held under an exclusive ``flock`` for as long as it is
open, and a segment is replayed only by whoever takes that lock, so several gateway processes
sharing one data directory never replay a segment another is still writing, nor one twice at
once; a crashed process's lock goes with it, and its segments are replayed by the next
process that looks. Replaying inserts with ``ON CONFLICT DO NOTHING`` (the writer's job): a
segment replayed twice, or in part before a failure, never duplicates a record.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

SUFFIX = ".jsonl"
SEGMENT_MAX_BYTES = 64 << 20
"""An active segment past this is closed and a new one started: replay reads one at a time."""
DATETIME_FIELDS = frozenset({"created_at"})
"""Row fields stored as ISO 8601 text and read back as timezone-aware datetimes."""
DECIMAL_FIELDS = frozenset({"cost"})
"""Row fields stored as decimal text (exact) and read back as Decimals."""


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    return value


def encode(row: dict[str, Any]) -> bytes:
    """One JSON line for ``row`` (a usage record's column values)."""
    plain = {k: _plain(v) for k, v in row.items()}
    return json.dumps(plain, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """The row of one line :func:`encode` wrote; ``ValueError`` if it is not one."""
    row = json.loads(line)
    if not isinstance(row, dict):
        raise ValueError("a spool line must be a JSON object")
    for name in DATETIME_FIELDS & row.keys():
        if row[name] is not None:
            row[name] = datetime.fromisoformat(row[name])
    for name in DECIMAL_FIELDS & row.keys():
        if row[name] is not None:
            row[name] = Decimal(row[name])
    return row


class Segment:
    """A spool file this process holds the lock of, for replay: read it, then remove it."""

    def __init__(self, path: Path, handle: IO[bytes]) -> None:
        self.path = path
        self._handle = handle
        self.torn = 0
        """Lines that were not a whole record (a crash in mid-append): skipped."""

    def batches(self, size: int) -> Iterator[list[dict[str, Any]]]:
        """The segment's rows, ``size`` at a time, streamed (a segment may be large)."""
        self._handle.seek(0)
        batch: list[dict[str, Any]] = []
        for line in self._handle:
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("a line cut short")
                batch.append(decode(line))
            except ValueError:
                self.torn += 1
                continue
            if len(batch) >= size:
                yield batch
                batch = []
        if batch:
            yield batch

    def remove(self) -> None:
        """Delete the segment (every row of it is in the database) and let go of it."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.release()

    def release(self) -> None:
        """Let go of the segment, keeping it for a later replay."""
        self._handle.close()  # closing the file releases its flock


class UsageSpool:
    """Append rows to, and claim segments for replay from, one spool directory.

    Used from one thread (the usage writer's); the lock files make it safe across processes.
    """

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._active: IO[bytes] | None = None
        self._active_path: Path | None = None
        self._active_bytes = 0
        self._own: dict[Path, int] = {}  # segments this process wrote and has not replayed
        self._pending = 0  # their records (an int: other threads read it, never the dict)
        self.bytes = self._scan_bytes()
        """Bytes in the directory's segments, as of the last append, claim or replay."""

    @property
    def pending_records(self) -> int:
        """Records this process spooled that are not replayed yet."""
        return self._pending

    def current_bytes(self) -> int:
        """Bytes in the directory's segments now (another process may have replayed some);
        safe from any thread."""
        return self._scan_bytes()

    def has_segments(self) -> bool:
        """Whether any segment is on disk (this process's or another's)."""
        return bool(self._segment_paths())

    def append(self, rows: Sequence[dict[str, Any]]) -> int:
        """Append ``rows`` durably (one ``fsync``); returns how many were taken: all of them, or
        none when they would take the directory past ``max_bytes``."""
        if not rows:
            return 0
        data = b"".join(encode(row) for row in rows)
        self.bytes = self._scan_bytes()
        if self.bytes + len(data) > self.max_bytes:
            return 0
        handle = self._segment_for(len(data))
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
        self._active_bytes += len(data)
        self.bytes += len(data)
        assert self._active_path is not None
        self._own[self._active_path] = self._own.get(self._active_path, 0) + len(rows)
        self._pending += len(rows)
        return len(rows)

    def rotate(self) -> None:
        """Close the segment being appended to, so that a replay can claim it."""
        if self._active is not None:
            self._active.close()
        self._active = self._active_path = None
        self._active_bytes = 0

    def claim(self) -> Iterator[Segment]:
        """Each segment no other process holds, oldest first, locked while the caller has it.

        The caller must :meth:`Segment.remove` or :meth:`Segment.release` each one it is given.
        """
        for gone in [p for p in self._own if not p.exists()]:  # replayed by another process
            self._pending -= self._own.pop(gone)
        for path in self._segment_paths():
            if path == self._active_path:
                continue
            segment = self._try_lock(path)
            if segment is not None:
                yield segment

    def forget(self, segment: Segment) -> None:
        """Account for ``segment`` having been replayed and removed."""
        self._pending -= self._own.pop(segment.path, 0)
        self.bytes = self._scan_bytes()

    def close(self) -> None:
        self.rotate()

    # -- files ---------------------------------------------------------------------------

    def _segment_for(self, size: int) -> IO[bytes]:
        if self._active is not None and self._active_bytes + size <= SEGMENT_MAX_BYTES:
            return self._active
        self.rotate()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = f"usage-{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        path = self.directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: no one else can hold it yet
        self._fsync_directory()  # the new name survives a crash too
        self._active, self._active_path = os.fdopen(fd, "ab"), path
        return self._active

    def _try_lock(self, path: Path) -> Segment | None:
        try:
            handle = path.open("rb")
        except FileNotFoundError:  # replayed and removed by another process meanwhile
            return None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # being written, or replayed, by another process
            handle.close()
            return None
        if os.fstat(handle.fileno()).st_nlink == 0:  # removed between our open and lock
            handle.close()
            return None
        return Segment(path, handle)

    def _segment_paths(self) -> list[Path]:
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        return [self.directory / n for n in names if n.endswith(SUFFIX)]

    def _scan_bytes(self) -> int:
        total = 0
        for path in self._segment_paths():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
