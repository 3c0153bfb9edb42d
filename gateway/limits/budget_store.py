"""Where budget counters live: in process, or in Redis for every gateway process at once.

A counter is one integer of nano-units per (budget, period): its key names the period's start,
so a new period starts from a fresh counter and the old one expires by itself. Each operation
is atomic over every counter it names (a request is charged to its tenant's and its key's
budgets together, or to neither):

* :meth:`BudgetStore.reserve` — if every counter has room for its amount, add them all, else
  add nothing and say which counter refused;
* :meth:`BudgetStore.add` — add (or, settling a reservation, subtract) amounts unconditionally;
* :meth:`BudgetStore.cancel` — undo an operation whose answer never came, if Redis ran it.

An operation may name an *op* key (the same hash tag as its counters): Redis then runs it at most
once — a replay after a lost answer is a no-op if the first call ran — and remembers it
``MARKER_TTL_S``, so an operation that timed out can be replayed (its spend happened) or
cancelled (it did not) exactly when Redis answers again, whether or not Redis ran the call
that timed out (a server that froze runs what it had received when it thaws).

A counter that does not exist yet starts from a *seed*, what the usage records already show
spent in the period (a budget created mid-period, a gateway restarted without Redis).
"""

from __future__ import annotations

import hashlib
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

EXPIRY_MARGIN_S = 86_400
"""A counter outlives its period by a day: settlements of requests that straddle the end land
in a counter that still exists."""


MARKER_TTL_S = 600
"""How long Redis remembers that an operation ran: an outage longer than this may count an
operation whose answer was lost twice (see :mod:`gateway.limits.budget`)."""


@dataclass(frozen=True, slots=True)
class Charge:
    """One counter's part of an operation."""

    key: str
    nanos: int
    limit: int
    seed: int
    expires_at: float
    """Unix time after which the counter may go (its period's end plus a margin)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Which charge had no room, and what its counter held."""

    index: int
    spent: int


class BudgetStore(ABC):
    """Budget counters; every method atomic over the counters it names."""

    shared = False
    """True where other processes share the counters (Redis): the store can be away."""

    @abstractmethod
    async def reserve(
        self, charges: Sequence[Charge], op: str | None = None
    ) -> list[int] | Refusal:
        """Add every charge if each fits (``spent + nanos <= limit`` and ``spent < limit``);
        the counters' new values, or the first :class:`Refusal` (nothing added). With ``op``,
        at most once."""

    @abstractmethod
    async def add(self, charges: Sequence[Charge], op: str | None = None) -> list[int]:
        """Add each charge's ``nanos`` (negative: give back); the counters' new values. With
        ``op``, at most once: a replay of an operation that ran changes nothing."""

    async def cancel(self, charges: Sequence[Charge], op: str) -> list[int]:
        """Take back ``op``'s charges if it ran, and make sure it never runs later."""
        raise NotImplementedError

    async def values(self, keys: Sequence[str]) -> list[int | None]:
        """Several counters' values (None: does not exist), in one round trip."""
        return [await self.spent(key) for key in keys]

    async def ping(self) -> None:  # noqa: B027 - an in-process store is always there
        """Raise if the store cannot be reached."""

    @abstractmethod
    async def spent(self, key: str) -> int | None:
        """A counter's value (None: it does not exist)."""

    @abstractmethod
    async def first(self, key: str, expires_at: float) -> bool:
        """True for the first caller of ``key`` (until it expires), False for every later one:
        a soft threshold is told once per period, whichever process sees it first."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Close connections the store owns."""


class MemoryBudgetStore(BudgetStore):
    """Counters in this process: exact for one process (one event loop: nothing runs between
    the check and the add)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._values: dict[str, tuple[int, float]] = {}

    def _value(self, charge: Charge) -> int:
        found = self._values.get(charge.key)
        if found is None or found[1] <= self._clock():
            return charge.seed
        return found[0]

    async def reserve(
        self, charges: Sequence[Charge], op: str | None = None
    ) -> list[int] | Refusal:
        values = [self._value(c) for c in charges]
        for i, (charge, value) in enumerate(zip(charges, values, strict=True)):
            if value >= charge.limit or value + charge.nanos > charge.limit:
                return Refusal(i, value)
        return self._apply(charges, values)

    async def add(self, charges: Sequence[Charge], op: str | None = None) -> list[int]:
        return self._apply(charges, [self._value(c) for c in charges])

    def _apply(self, charges: Sequence[Charge], values: list[int]) -> list[int]:
        out = []
        for charge, value in zip(charges, values, strict=True):
            new = value + charge.nanos
            self._values[charge.key] = (new, charge.expires_at)
            out.append(new)
        if len(self._values) > 100_000:  # forget expired periods now and then
            now = self._clock()
            self._values = {k: v for k, v in self._values.items() if v[1] > now}
        return out

    async def first(self, key: str, expires_at: float) -> bool:
        found = self._values.get(key)
        if found is not None and found[1] > self._clock():
            return False
        self._values[key] = (1, expires_at)
        return True

    async def spent(self, key: str) -> int | None:
        found = self._values.get(key)
        return None if found is None or found[1] <= self._clock() else found[0]


# KEYS: counters, then the operation's marker. ARGV: per counter (nanos, limit, seed, expire-at
# unix seconds), then the mode ("reserve" checks every counter first; "add" adds
# unconditionally; "cancel" takes back what the marked operation added, if it ran), then the
# marker's lifetime in seconds. A marker that exists makes "reserve" and "add" no-ops (a replay
# of an operation that ran); "cancel" leaves one that says so. A missing counter starts from its
# seed. Lua numbers are doubles: exact up to 2^53 nano-units (9 million currency units in one
# period); INCRBY keeps the stored value exact beyond that.
_SCRIPT = """
local n = #KEYS - 1
local mode = ARGV[4 * n + 1]
local marker = KEYS[n + 1]
local ttl = ARGV[4 * n + 2]
local values = {}
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v then values[i] = tonumber(v) else values[i] = tonumber(ARGV[4 * i - 1]) end
end
local done = redis.call('GET', marker)
if mode == 'cancel' then
  local out = {}
  for i = 1, n do
    if done == 'ran' and redis.call('EXISTS', KEYS[i]) == 1 then
      out[i] = redis.call('DECRBY', KEYS[i], ARGV[4 * i - 3])
    else
      out[i] = tostring(values[i])
    end
  end
  redis.call('SET', marker, 'cancelled', 'EX', ttl)
  return out
end
if done then
  local out = {}
  for i = 1, n do out[i] = tostring(values[i]) end
  return out
end
if mode == 'reserve' then
  for i = 1, n do
    local nanos, limit = tonumber(ARGV[4 * i - 3]), tonumber(ARGV[4 * i - 2])
    if values[i] >= limit or values[i] + nanos > limit then return {-i, tostring(values[i])} end
  end
end
local out = {}
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 0 then redis.call('SET', KEYS[i], ARGV[4 * i - 1]) end
  out[i] = redis.call('INCRBY', KEYS[i], ARGV[4 * i - 3])
  redis.call('EXPIREAT', KEYS[i], ARGV[4 * i])
end
if ttl ~= '0' then redis.call('SET', marker, 'ran', 'EX', ttl) end
return out
"""
_SHA = hashlib.sha1(_SCRIPT.encode()).hexdigest()


class RedisBudgetStore(BudgetStore):
    """Counters in Redis, shared by every gateway process: each operation is one Lua script.

    Keys of one operation are one tenant's (``{tenant:<id>}`` hash tag): a Redis Cluster keeps
    them in one slot, as a script's keys must be."""

    shared = True

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        owns_client: bool = False,
        marker_ttl_s: int = MARKER_TTL_S,
    ) -> None:
        self._client = client
        self._owns = owns_client
        self.marker_ttl_s = marker_ttl_s

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 0.25) -> RedisBudgetStore:
        client = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        return cls(client, owns_client=True)

    async def _run(self, charges: Sequence[Charge], mode: str, op: str | None) -> Any:
        # without an op the marker is a key of the counters' slot that is never written
        keys = [c.key for c in charges] + [op or f"{charges[0].key}:no-op"]
        args: list[str] = []
        for c in charges:
            args += [str(c.nanos), str(c.limit), str(c.seed), str(math.ceil(c.expires_at))]
        args += [mode, str(self.marker_ttl_s if op else 0)]
        try:
            return await self._client.evalsha(_SHA, len(keys), *keys, *args)
        except NoScriptError:
            return await self._client.eval(_SCRIPT, len(keys), *keys, *args)

    async def reserve(
        self, charges: Sequence[Charge], op: str | None = None
    ) -> list[int] | Refusal:
        if not charges:
            return []
        result = await self._run(charges, "reserve", op)
        first = int(result[0])
        if first < 0:
            return Refusal(-first - 1, int(float(result[1])))
        return [int(v) for v in result]

    async def add(self, charges: Sequence[Charge], op: str | None = None) -> list[int]:
        if not charges:
            return []
        return [int(v) for v in await self._run(charges, "add", op)]

    async def cancel(self, charges: Sequence[Charge], op: str) -> list[int]:
        if not charges:
            return []
        return [int(v) for v in await self._run(charges, "cancel", op)]

    async def values(self, keys: Sequence[str]) -> list[int | None]:
        if not keys:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.get(key)
            found = await pipe.execute()
        return [None if v is None else int(v) for v in found]

    async def ping(self) -> None:
        await self._client.ping()

    async def first(self, key: str, expires_at: float) -> bool:
        return bool(await self._client.set(key, 1, nx=True, exat=math.ceil(expires_at)))

    async def spent(self, key: str) -> int | None:
        value = await self._client.get(key)
        return None if value is None else int(value)

    async def aclose(self) -> None:
        if self._owns:
            await self._client.aclose()
