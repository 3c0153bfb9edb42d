"""Agent workflows: many calls, one end-to-end deadline, state shared by every gateway process.

A workflow (a *compound* request) is named by the client (``x-tiergate-workflow-id``)
and created by its first call, which sets the deadline (``x-tiergate-workflow-deadline-ms``,
from that call's arrival). Later calls of the same id inherit it and get the next stage number
(0, 1, …); the gateway gives each call a sub-deadline, its share of the time left
(:mod:`gateway.app.kinds`). Ids are per tenant: one tenant can neither see nor join another's.

Where the state lives:

* **Redis** when ``TIERGATE_REDIS_URL`` is set (:class:`RedisWorkflowStore`): one hash per
  workflow, created and counted by one Lua script (create-if-absent and the stage increment are
  atomic, so two gateways racing on a first call make one workflow, and no two calls share a
  stage); times are Redis's ``TIME``, one clock for every gateway.
* **the workers' shared memory** without Redis under ``tiergate serve --workers N``
  (:class:`SharedWorkflowStore`, :mod:`gateway.app.shared_state`): a fixed table every worker
  maps, changed under a lock the kernel releases if its holder dies, so a workflow's later
  calls find it whichever worker the kernel hands their connection to;
* **process memory** with one process (:class:`MemoryWorkflowStore`).

A workflow is kept :data:`DEFAULT_TTL_S` past its deadline, so a late call is told the workflow
*expired* (409) rather than that it is *unknown* (400); after that its id is forgotten and a call
with a deadline header starts a new workflow under it (ids should be unique, a UUID for example).

**Redis outage** (:class:`FailoverWorkflowStore`), the limiter's rule
(:mod:`gateway.limits.failover`): never a 500 and never a wait on a dead Redis. The first failed
call switches to per-process state, which mirrors every workflow Redis answered for, so a
process keeps serving the workflows it has seen; Redis is tried again after a backoff
(:data:`RETRY_MIN_S` doubling to :data:`RETRY_MAX_S`). A call of a workflow this process never
saw cannot be told apart from an unknown id while Redis is away, so it is *served* — as a
request of its tier's default kind — not refused (:class:`WorkflowUnavailable`). Every degraded
call is counted (:attr:`FailoverWorkflowStore.degraded_calls`; exported by the app as
``tiergate_workflow_degraded_calls_total{outcome}``, :mod:`gateway.app.kinds`) and each
switch is logged.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import RedisError

if TYPE_CHECKING:
    from gateway.app.shared_state import SharedFile

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 3600.0
"""How long a workflow is kept after its deadline (``TIERGATE_WORKFLOW_TTL_S``)."""
MAX_LOCAL_WORKFLOWS = 100_000
"""Per-process bound on workflows kept in memory; past it the ones that expire first go."""
RETRY_MIN_S = 0.25
RETRY_MAX_S = 2.0


@dataclass(frozen=True, slots=True)
class WorkflowCall:
    """One call joining a workflow: its stage and the workflow's time, as the store saw it."""

    workflow_id: str
    stage: int
    """0 for the call that created the workflow, then 1, 2, … in the order calls arrived."""
    deadline_ms: float
    """The workflow's end-to-end deadline, as its first call set it."""
    remaining_ms: float
    """Time left to that deadline at this call's arrival (> 0)."""
    created: bool
    key: str = ""
    """The tenant-scoped key (``tenant:id``) the store knows the workflow by."""


class WorkflowUnknown(Exception):
    """No such workflow (never created, or forgotten after its TTL) and no deadline to start it."""


class WorkflowExpired(Exception):
    """The workflow's deadline has passed (its state is still kept)."""

    def __init__(self, late_ms: float) -> None:
        super().__init__(f"expired {late_ms:.0f} ms ago")
        self.late_ms = late_ms


class WorkflowUnavailable(WorkflowUnknown):
    """Unknown to this process while Redis is away: maybe another gateway's workflow."""


class WorkflowStore(Protocol):
    @property
    def mode(self) -> str:
        """``local``, ``redis`` or ``degraded-local`` (Redis away)."""
        ...

    async def join(self, key: str, deadline_ms: float | None) -> WorkflowCall:
        """Join workflow ``key`` (tenant-scoped), creating it with ``deadline_ms`` if absent."""
        ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class _Entry:
    deadline_unix_ms: float
    total_ms: float
    calls: int


class MemoryWorkflowStore:
    """Workflows in this process (no Redis, or the failover's mirror)."""

    mode = "local"

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_entries: int = MAX_LOCAL_WORKFLOWS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_ms = ttl_s * 1e3
        self.max_entries = max_entries
        self._clock = clock
        self._items: dict[str, _Entry] = {}

    def _now_ms(self) -> float:
        return self._clock() * 1e3

    async def join(self, key: str, deadline_ms: float | None) -> WorkflowCall:
        now = self._now_ms()
        entry = self._items.get(key)
        if entry is not None and now >= entry.deadline_unix_ms + self.ttl_ms:
            del self._items[key]
            entry = None
        created = entry is None
        if entry is None:
            if deadline_ms is None:
                raise WorkflowUnknown(key)
            entry = self._add(key, _Entry(now + deadline_ms, deadline_ms, 0), now)
        return _call(key, entry, now, created)

    def mirror(self, key: str, call: WorkflowCall) -> None:
        """Record what Redis answered, for a later outage (the local clock, from now)."""
        now = self._now_ms()
        entry = self._items.get(key)
        if entry is None:
            self._add(key, _Entry(now + call.remaining_ms, call.deadline_ms, call.stage + 1), now)
        else:
            entry.calls = max(entry.calls, call.stage + 1)

    def _add(self, key: str, entry: _Entry, now: float) -> _Entry:
        if len(self._items) >= self.max_entries:
            self._prune(now)
        self._items[key] = entry
        return entry

    def _prune(self, now: float) -> None:
        """Drop forgotten workflows; if still full, the tenth that expires first."""
        ttl = self.ttl_ms
        self._items = {k: e for k, e in self._items.items() if now < e.deadline_unix_ms + ttl}
        if len(self._items) >= self.max_entries:
            by_expiry = sorted(self._items, key=lambda k: self._items[k].deadline_unix_ms)
            for k in by_expiry[: max(1, self.max_entries // 10)]:
                del self._items[k]

    def __len__(self) -> int:
        return len(self._items)

    async def aclose(self) -> None:
        self._items.clear()


def _call(key: str, entry: _Entry, now_ms: float, created: bool) -> WorkflowCall:
    remaining = entry.deadline_unix_ms - now_ms
    if remaining <= 0:
        raise WorkflowExpired(-remaining)
    stage = entry.calls
    entry.calls += 1
    return WorkflowCall(_workflow_id(key), stage, entry.total_ms, remaining, created, key)


def _workflow_id(key: str) -> str:
    return key.split(":", 1)[-1]


SHARED_BUCKETS = 8192
SHARED_WAYS = 16
"""The shared table: a workflow's key hashes to one bucket of :data:`SHARED_WAYS` rows
(131,072 workflows per host; a full bucket drops the workflow whose deadline is earliest)."""
_KEY_WORDS = 2  # a 128-bit hash of ``tenant:id``, as two int64 (0, 0 = an empty row)
_DEADLINE, _TOTAL, _CALLS = range(3)
_VALUE_WORDS = 3
SHARED_TABLE_BYTES = SHARED_BUCKETS * SHARED_WAYS * 8 * (_KEY_WORDS + _VALUE_WORDS)


class SharedWorkflowStore:
    """Workflows in the table every worker of one ``tiergate serve`` maps (no Redis).

    The same rules as :class:`MemoryWorkflowStore` (wall-clock times, one clock per host), each
    join one critical section under the table's lock. A workflow is found by a 128-bit hash of
    its tenant-scoped key; a new row's key is written last, so a worker that dies mid-write
    leaves nothing half-found.
    """

    mode = "shared-memory"

    def __init__(
        self,
        table: SharedFile,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.table = table
        self.ttl_ms = ttl_s * 1e3
        self._clock = clock
        words = SHARED_BUCKETS * SHARED_WAYS
        self._keys: np.ndarray = np.ndarray(
            (SHARED_BUCKETS, SHARED_WAYS, _KEY_WORDS), dtype=np.int64, buffer=table.buffer
        )
        self._values: np.ndarray = np.ndarray(
            (SHARED_BUCKETS, SHARED_WAYS, _VALUE_WORDS),
            dtype=np.float64,
            buffer=table.buffer,
            offset=words * _KEY_WORDS * 8,
        )
        self.evicted = 0
        """Live workflows this process dropped from a full bucket (a warning is logged)."""

    async def join(self, key: str, deadline_ms: float | None) -> WorkflowCall:
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        high = int.from_bytes(digest[:8], "little", signed=True)
        low = int.from_bytes(digest[8:], "little", signed=True)
        if high == 0 and low == 0:
            low = 1
        bucket = int.from_bytes(digest[:8], "little") % SHARED_BUCKETS
        with self.table.locked():
            now = self._clock() * 1e3
            keys, values = self._keys[bucket], self._values[bucket]
            found = np.flatnonzero((keys[:, 0] == high) & (keys[:, 1] == low))
            row = int(found[0]) if found.size else -1
            if row >= 0 and now >= values[row, _DEADLINE] + self.ttl_ms:
                keys[row] = 0  # forgotten after its TTL
                row = -1
            created = row < 0
            if created:
                if deadline_ms is None:
                    raise WorkflowUnknown(key)
                row = self._free_row(keys, values, now)
                values[row] = (now + deadline_ms, deadline_ms, 0.0)
                keys[row] = (high, low)  # last: a half-written row is not found
            entry = _Entry(
                float(values[row, _DEADLINE]), float(values[row, _TOTAL]), int(values[row, _CALLS])
            )
            call = _call(key, entry, now, created)  # raises WorkflowExpired before counting
            values[row, _CALLS] = entry.calls
        return call

    def _free_row(self, keys: np.ndarray, values: np.ndarray, now: float) -> int:
        empty = (keys[:, 0] == 0) & (keys[:, 1] == 0)
        forgotten = now >= values[:, _DEADLINE] + self.ttl_ms
        free = np.flatnonzero(empty | forgotten)
        if free.size:
            return int(free[0])
        row = int(np.argmin(values[:, _DEADLINE]))
        self.evicted += 1
        log.warning("workflow table: a bucket is full, the workflow that expires first is dropped")
        return row

    async def aclose(self) -> None:
        """The table is the supervisor's: it closes and removes it."""


# KEYS[1]: the workflow's hash. ARGV: deadline ms ('' = join only), TTL ms after the deadline.
# Returns {status, stage, remaining ms, total ms, created}: status 0 ok, 1 unknown, 2 expired.
_JOIN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local deadline = tonumber(redis.call('HGET', KEYS[1], 'deadline'))
local created = 0
if not deadline then
  if ARGV[1] == '' then return {1, 0, '0', '0', 0} end
  deadline = now + tonumber(ARGV[1])
  redis.call('HSET', KEYS[1], 'deadline', tostring(deadline), 'total', ARGV[1], 'calls', 0)
  redis.call('PEXPIRE', KEYS[1], math.ceil(deadline - now + tonumber(ARGV[2])))
  created = 1
end
local total = redis.call('HGET', KEYS[1], 'total')
if now >= deadline then return {2, 0, tostring(deadline - now), total, 0} end
local stage = redis.call('HINCRBY', KEYS[1], 'calls', 1) - 1
return {0, stage, tostring(deadline - now), total, created}
"""


class RedisWorkflowStore:
    """Workflows in Redis, seen by every gateway process that shares the server."""

    mode = "redis"

    def __init__(
        self, client: aioredis.Redis, *, prefix: str = "tiergate", ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        self._client = client
        self._prefix = prefix
        self.ttl_ms = ttl_s * 1e3
        self._sha: str | None = None

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 0.25, **kwargs: Any) -> RedisWorkflowStore:
        """A store with its own small pool; connect and read bounded by ``timeout_s``."""
        client = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, max_connections=64
        )
        return cls(client, **kwargs)

    def redis_key(self, key: str) -> str:
        tenant, _, workflow = key.partition(":")
        return f"{self._prefix}:wf:{{{tenant}}}:{workflow}"

    async def join(self, key: str, deadline_ms: float | None) -> WorkflowCall:
        args = ["" if deadline_ms is None else repr(float(deadline_ms)), repr(self.ttl_ms)]
        reply = await self._client.eval(_JOIN, 1, self.redis_key(key), *args)
        status, stage, remaining, total, created = reply
        if status == 1:
            raise WorkflowUnknown(key)
        if status == 2:
            raise WorkflowExpired(-float(remaining))
        return WorkflowCall(
            _workflow_id(key), int(stage), float(total), float(remaining), bool(created), key
        )

    async def aclose(self) -> None:
        await self._client.aclose()


class FailoverWorkflowStore:
    """Redis while it answers; this process's mirror while it does not (module docstring)."""

    def __init__(
        self,
        shared: RedisWorkflowStore,
        *,
        local: MemoryWorkflowStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self.local = local or MemoryWorkflowStore(ttl_s=shared.ttl_ms / 1e3)
        self._clock = clock
        self._retry_at = 0.0
        self._backoff = RETRY_MIN_S
        self.degraded = False
        self.degraded_calls = 0
        """Calls answered from this process's state because Redis could not be reached."""

    @property
    def mode(self) -> str:
        return "degraded-local" if self.degraded else "redis"

    async def join(self, key: str, deadline_ms: float | None) -> WorkflowCall:
        if not self.degraded or self._clock() >= self._retry_at:
            try:
                call = await self.shared.join(key, deadline_ms)
            except (WorkflowUnknown, WorkflowExpired):
                self._recovered()
                raise
            except (RedisError, OSError, TimeoutError) as exc:
                self._trip(exc)
            else:
                self._recovered()
                self.local.mirror(key, call)
                return call
        self.degraded_calls += 1
        try:
            return await self.local.join(key, deadline_ms)
        except WorkflowUnknown:
            raise WorkflowUnavailable(key) from None

    def _trip(self, exc: BaseException) -> None:
        if not self.degraded:
            log.warning(
                "workflow store: Redis unreachable (%s); per-process workflow state until it "
                "answers",
                type(exc).__name__,
            )
            self._backoff = RETRY_MIN_S
        else:
            self._backoff = min(RETRY_MAX_S, self._backoff * 2)
        self.degraded = True
        self._retry_at = self._clock() + self._backoff

    def _recovered(self) -> None:
        if self.degraded:
            log.info(
                "workflow store: Redis answers again (%d calls served locally meanwhile)",
                self.degraded_calls,
            )
            self.degraded = False

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.shared.aclose()
        await self.local.aclose()


def make_workflow_store(
    redis_url: str | None,
    *,
    prefix: str = "tiergate",
    ttl_s: float = DEFAULT_TTL_S,
    timeout_s: float = 0.25,
    table: SharedFile | None = None,
) -> WorkflowStore:
    """Redis-backed with per-process failover when ``redis_url`` is set; else the workers'
    shared ``table`` when there is one (several workers), else in this process's memory."""
    if redis_url:
        shared = RedisWorkflowStore.from_url(
            redis_url, timeout_s=timeout_s, prefix=prefix, ttl_s=ttl_s
        )
        return FailoverWorkflowStore(shared)
    if table is not None:
        return SharedWorkflowStore(table, ttl_s=ttl_s)
    return MemoryWorkflowStore(ttl_s=ttl_s)
