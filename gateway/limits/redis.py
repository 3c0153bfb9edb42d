"""Redis rate limiter: the same sliding logs, shared by every gateway process.

Each operation is ONE Lua script, so Redis runs the check and the take with nothing in between —
no other process can slip a request through a gap. Scripts are called with EVALSHA and fall back
to EVAL (which also caches them) when the server does not know them yet, e.g. after a restart.
Time is the Redis server's ``TIME``, one clock for all processes (tests may inject a clock).

Keys, per tenant (``{tenant}`` is a hash tag, so one tenant's keys share a Redis Cluster slot, as
a script's keys must)::

    <prefix>:{<tenant>}:log     sorted set  reservation id -> admitted at (the sliding log)
    <prefix>:{<tenant>}:tokens  hash        reservation id -> tokens counted (ids in the log)
    <prefix>:{<tenant>}:total   string      sum of ``tokens`` (kept by the scripts)
    <prefix>:{<tenant>}:slots   sorted set  reservation id -> slot lease expiry

Every write refreshes the keys' expiry, so an idle tenant's keys vanish by themselves.

Faults: every call is bounded by short socket timeouts (``timeout_s``) and retried once, on a
fresh connection, only after a *connection* error (a pooled connection Redis closed, e.g. after a
restart); anything else reaches the caller at once, and
:class:`~gateway.limits.failover.FailoverRateLimiter` turns it into degraded mode. The reserve
script is idempotent in its id, so that retry can never count a request twice.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from gateway.limits.base import (
    Limits,
    RateLimiter,
    RejectReason,
    Reservation,
    Usage,
    check_tokens,
    rejection,
    too_large_for_tpm,
)
from gateway.limits.memory import LocalEntry

DEFAULT_PREFIX = "tiergate"
DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_TIMEOUT_S = 0.25
"""Socket connect and read timeout: a script takes well under a millisecond, so a quarter of a
second means Redis is unreachable or stuck, and the caller should stop waiting for it."""
POOL_TIMEOUT_S = 1.0  # longest wait for a free connection before the call fails
HEALTH_CHECK_INTERVAL_S = 30  # a connection idle this long is pinged before it is used
RESEED_CHUNK = 1000  # entries per re-seed script call

# Shared prologue: the clock, then forget what left the window and slots whose lease ran out.
# KEYS: log, tokens, total, slots. ARGV[1]: now ('' = server time), ARGV[2]: window seconds.
_PROLOGUE = """
local function num(x) return string.format('%.17g', x) end  -- Lua's default keeps 14 digits
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local window = tonumber(ARGV[2])
local cutoff = now - window
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(cutoff))
if #old > 0 then
  local freed = 0
  for i = 1, #old, 1000 do  -- chunks: unpack() is bounded by the Lua stack
    local ids = {unpack(old, i, math.min(i + 999, #old))}
    for _, v in ipairs(redis.call('HMGET', KEYS[2], unpack(ids))) do
      freed = freed + (tonumber(v) or 0)
    end
    redis.call('HDEL', KEYS[2], unpack(ids))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', num(cutoff))
  redis.call('DECRBY', KEYS[3], freed)
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', num(now))
"""

# ARGV[3..9]: rpm, tpm, max concurrency ('' = unlimited), tokens, slot ttl seconds, id, and
# '1' when the caller itself admitted requests within the window (so an empty log means lost data).
# Returns {1, admitted at, requests, tokens} when taken ({1, admitted at} when this id was
# already taken: a retried call), {0, reason, retry_after ('' = never), requests, tokens} when
# not, {2} when the log is empty but should not be; requests and tokens: the window's, with
# this request when taken (what the degraded mode budgets from: gateway.limits.failover).
_RESERVE = (
    _PROLOGUE
    + """
local rpm, tpm, maxc = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens, ttl, id = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local seen = redis.call('ZSCORE', KEYS[1], id)
if seen then return {1, seen} end
local count = redis.call('ZCARD', KEYS[1])
if count == 0 and ARGV[9] == '1' then return {2} end
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
if rpm and count >= rpm then
  local entry = redis.call('ZRANGE', KEYS[1], count - rpm, count - rpm, 'WITHSCORES')
  return {0, 'rate_limit_rpm', num(tonumber(entry[2]) + window - now), count, total}
end
if tpm then
  if tokens > tpm then return {0, 'rate_limit_tpm', ''} end
  local need = total + tokens - tpm
  if need > 0 then
    for i = 0, count - 1, 1000 do
      local entries = redis.call('ZRANGE', KEYS[1], i, i + 999, 'WITHSCORES')
      local ids = {}
      for j = 1, #entries, 2 do ids[#ids + 1] = entries[j] end
      local counted = redis.call('HMGET', KEYS[2], unpack(ids))
      for j = 1, #ids do
        need = need - (tonumber(counted[j]) or 0)
        if need <= 0 then
          return {0, 'rate_limit_tpm', num(tonumber(entries[2 * j]) + window - now), count, total}
        end
      end
    end
    return {0, 'rate_limit_tpm', num(window), count, total}
  end
end
if maxc and redis.call('ZCARD', KEYS[4]) >= maxc then
  return {0, 'concurrency', '', count, total}
end
redis.call('ZADD', KEYS[1], num(now), id)
redis.call('HSET', KEYS[2], id, tokens)
redis.call('INCRBY', KEYS[3], tokens)
redis.call('ZADD', KEYS[4], num(now + ttl), id)
local window_ms = math.ceil(window * 1000) + 1000
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], window_ms) end
local slots_ms = math.ceil(ttl * 1000) + 1000
if redis.call('PTTL', KEYS[4]) < slots_ms then redis.call('PEXPIRE', KEYS[4], slots_ms) end
return {1, num(now), count + 1, total + tokens}
"""
)

# KEYS: log, tokens, total, slots. ARGV[1]: id, ARGV[2]: tokens to count.
_RECONCILE = """
redis.call('ZREM', KEYS[4], ARGV[1])
local counted = redis.call('HGET', KEYS[2], ARGV[1])
if counted then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('INCRBY', KEYS[3], tonumber(ARGV[2]) - tonumber(counted))
end
return 1
"""

# KEYS: slots. ARGV[1]: now ('' = server time), ARGV[2]: lease seconds, ARGV[3..]: ids.
# Extends the leases of slots still held; a slot released meanwhile stays released (XX).
_RENEW = """
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local ttl = tonumber(ARGV[2])
local expiry = string.format('%.17g', now + ttl)
for i = 3, #ARGV do redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i]) end
local slots_ms = math.ceil(ttl * 1000) + 1000
if redis.call('PTTL', KEYS[1]) < slots_ms then redis.call('PEXPIRE', KEYS[1], slots_ms) end
return 1
"""

# ARGV[3]: lease seconds, then groups of 4: id, age seconds ('' = slot only), tokens, held ('1').
# Puts one process's own entries back: new ones are added, known ones get this process's token
# count and slot state (it is the one that knows them). Idempotent.
_RESEED = (
    _PROLOGUE
    + """
local ttl = tonumber(ARGV[3])
local added = 0
for i = 4, #ARGV, 4 do
  local id, age, tokens, held = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  if age and now - age > cutoff then
    if redis.call('ZADD', KEYS[1], 'NX', num(now - age), id) == 1 then
      redis.call('HSET', KEYS[2], id, tokens)
      redis.call('INCRBY', KEYS[3], tokens)
      added = added + 1
    else
      local counted = tonumber(redis.call('HGET', KEYS[2], id) or tokens)
      redis.call('HSET', KEYS[2], id, tokens)
      redis.call('INCRBY', KEYS[3], tokens - counted)
    end
  end
  if held == '1' then
    redis.call('ZADD', KEYS[4], num(now + ttl), id)
  else
    redis.call('ZREM', KEYS[4], id)
  end
end
local window_ms = math.ceil(window * 1000) + 1000
for k = 1, 3 do
  if redis.call('EXISTS', KEYS[k]) == 1 then redis.call('PEXPIRE', KEYS[k], window_ms) end
end
local slots_ms = math.ceil(ttl * 1000) + 1000
if redis.call('PTTL', KEYS[4]) < slots_ms then redis.call('PEXPIRE', KEYS[4], slots_ms) end
return added
"""
)

# Returns {requests, tokens, in_flight}.
_USAGE = (
    _PROLOGUE
    + """
return {redis.call('ZCARD', KEYS[1]), tonumber(redis.call('GET', KEYS[3]) or '0'),
        redis.call('ZCARD', KEYS[4])}
"""
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Script:
    """A Lua script run by EVALSHA, falling back to EVAL when the server lacks it."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, client: aioredis.Redis, keys: list[str], args: list[str]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)


_RESERVE_SCRIPT = _Script(_RESERVE)
_RECONCILE_SCRIPT = _Script(_RECONCILE)
_USAGE_SCRIPT = _Script(_USAGE)
_RENEW_SCRIPT = _Script(_RENEW)
_RESEED_SCRIPT = _Script(_RESEED)


class WindowLost(Exception):
    """Redis has no window for a tenant this process admitted requests for: it lost its data
    (restarted without persistence, flushed, failed over to an empty replica)."""


def _limit_arg(value: int | None) -> str:
    return "" if value is None else str(value)


class RedisRateLimiter(RateLimiter):
    """Sliding-log limits in Redis, atomic across every process that shares the server."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], float] | None = None,
        owns_client: bool = False,
        **options: float,
    ) -> None:
        super().__init__(**options)
        self._client = client
        self._prefix = prefix
        self._clock = clock
        self._owns_client = owns_client
        self.last_window: dict[str, tuple[int, int]] = {}
        """Each tenant's window (requests, tokens) as the last reserve saw it."""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        **kwargs: Any,
    ) -> RedisRateLimiter:
        """A limiter with its own connection pool to ``url`` (closed by :meth:`aclose`).

        The pool *blocks* when all ``max_connections`` are busy: a burst waits a moment for a
        connection instead of failing with "too many connections" (redis-py's default pool).
        Connect and read are bounded by ``timeout_s``; a connection error is retried once at
        once on a new connection (a stale pooled one), never with backoff: a caller on the
        request path must learn of an outage in milliseconds, not after seconds of retries.
        """
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=POOL_TIMEOUT_S,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        return cls(aioredis.Redis(connection_pool=pool), owns_client=True, **kwargs)

    def keys(self, tenant: str) -> list[str]:
        """The tenant's keys: log, tokens, total, slots."""
        # Braces would break the hash tag; escape them (and the escape character) in the name.
        tag = tenant.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
        return [f"{self._prefix}:{{{tag}}}:{name}" for name in ("log", "tokens", "total", "slots")]

    def _now_arg(self) -> str:
        return "" if self._clock is None else repr(self._clock())

    async def reserve(
        self,
        tenant: str,
        limits: Limits,
        tokens: int,
        *,
        recent: bool = False,
        reservation_id: str | None = None,
    ) -> Reservation:
        """:meth:`RateLimiter.reserve`; ``recent``: the caller admitted requests for ``tenant``
        within the window, so an empty log raises :class:`WindowLost` instead of admitting;
        ``reservation_id``: the id to use (else a new one)."""
        check_tokens(tokens)
        if limits.tpm is not None and tokens > limits.tpm:
            raise too_large_for_tpm(tokens, limits.tpm)
        rid = reservation_id or uuid.uuid4().hex
        args = [
            self._now_arg(),
            repr(self.window_s),
            _limit_arg(limits.rpm),
            _limit_arg(limits.tpm),
            _limit_arg(limits.max_concurrency),
            str(tokens),
            repr(self.slot_ttl_s),
            rid,
            "1" if recent else "0",
        ]
        result = await _RESERVE_SCRIPT(self._client, self.keys(tenant), args)
        if int(result[0]) == 2:
            raise WindowLost(tenant)
        if len(result) == 5 or (len(result) == 4 and int(result[0]) == 1):
            self.last_window[tenant] = (int(result[-2]), int(result[-1]))
        if int(result[0]) == 1:
            now = float(_text(result[1]))
            return Reservation(rid, tenant, tokens, now, now + self.slot_ttl_s)
        reason = RejectReason(_text(result[1]))
        retry_text = _text(result[2])
        retry: float | None = float(retry_text) if retry_text else None
        if reason is RejectReason.CONCURRENCY:
            retry = self.concurrency_retry_after_s
        raise rejection(reason, retry, limits)

    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        check_tokens(actual_tokens)
        args = [reservation.reservation_id, str(actual_tokens)]
        await _RECONCILE_SCRIPT(self._client, self.keys(reservation.tenant), args)

    async def usage(self, tenant: str) -> Usage:
        args = [self._now_arg(), repr(self.window_s)]
        requests, tokens, in_flight = await _USAGE_SCRIPT(self._client, self.keys(tenant), args)
        return Usage(int(requests), int(tokens), int(in_flight))

    async def renew(self, tenant: str, reservation_ids: list[str]) -> None:
        """Extend the leases of ``tenant``'s slots still held (the heartbeat of live requests)."""
        if reservation_ids:
            args = [self._now_arg(), repr(self.slot_ttl_s), *reservation_ids]
            await _RENEW_SCRIPT(self._client, self.keys(tenant)[3:], args)

    async def reseed(self, tenant: str, entries: list[LocalEntry]) -> int:
        """Put this process's own entries for ``tenant`` back; returns how many were missing."""
        added = 0
        for start in range(0, len(entries), RESEED_CHUNK):
            args = [self._now_arg(), repr(self.window_s), repr(self.slot_ttl_s)]
            for entry in entries[start : start + RESEED_CHUNK]:
                age = "" if entry.age_s is None else repr(entry.age_s)
                args += [entry.reservation_id, age, str(entry.tokens), "1" if entry.held else "0"]
            added += int(await _RESEED_SCRIPT(self._client, self.keys(tenant), args))
        return added

    async def ping(self) -> None:
        """Raise unless Redis answers."""
        await self._client.ping()

    async def server_id(self) -> str:
        """The server's ``run_id``; new after a restart (forgetting, if not persistent)."""
        try:
            info = await self._client.info("server")
        except ResponseError:  # INFO not allowed to this user (ACL): alive, restarts unseen
            await self._client.ping()
            return ""
        return str(info.get("run_id", ""))

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose(close_connection_pool=True)
