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
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

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
from gateway.limits.memory import InMemoryRateLimiter

DEFAULT_PREFIX = "tiergate"
DEFAULT_MAX_CONNECTIONS = 32
POOL_TIMEOUT_S = 5.0  # longest wait for a free connection before the call fails

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

# ARGV[3..8]: rpm, tpm, max concurrency ('' = unlimited), tokens, slot ttl seconds, id.
# Returns {1, now} when taken, {0, reason, retry_after ('' = never)} when not.
_RESERVE = (
    _PROLOGUE
    + """
local rpm, tpm, maxc = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens, ttl, id = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local count = redis.call('ZCARD', KEYS[1])
if rpm and count >= rpm then
  local entry = redis.call('ZRANGE', KEYS[1], count - rpm, count - rpm, 'WITHSCORES')
  return {0, 'rate_limit_rpm', num(tonumber(entry[2]) + window - now)}
end
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
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
          return {0, 'rate_limit_tpm', num(tonumber(entries[2 * j]) + window - now)}
        end
      end
    end
    return {0, 'rate_limit_tpm', num(window)}
  end
end
if maxc and redis.call('ZCARD', KEYS[4]) >= maxc then
  return {0, 'concurrency', ''}
end
redis.call('ZADD', KEYS[1], num(now), id)
redis.call('HSET', KEYS[2], id, tokens)
redis.call('INCRBY', KEYS[3], tokens)
redis.call('ZADD', KEYS[4], num(now + ttl), id)
local window_ms = math.ceil(window * 1000) + 1000
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], window_ms) end
local slots_ms = math.ceil(ttl * 1000) + 1000
if redis.call('PTTL', KEYS[4]) < slots_ms then redis.call('PEXPIRE', KEYS[4], slots_ms) end
return {1, num(now)}
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

    @classmethod
    def from_url(
        cls, url: str, *, max_connections: int = DEFAULT_MAX_CONNECTIONS, **kwargs: Any
    ) -> RedisRateLimiter:
        """A limiter with its own connection pool to ``url`` (closed by :meth:`aclose`).

        The pool *blocks* when all ``max_connections`` are busy: a burst waits a moment for a
        connection instead of failing with "too many connections" (redis-py's default pool).
        """
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=POOL_TIMEOUT_S
        )
        return cls(aioredis.Redis(connection_pool=pool), owns_client=True, **kwargs)

    def keys(self, tenant: str) -> list[str]:
        """The tenant's keys: log, tokens, total, slots."""
        # Braces would break the hash tag; escape them (and the escape character) in the name.
        tag = tenant.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
        return [f"{self._prefix}:{{{tag}}}:{name}" for name in ("log", "tokens", "total", "slots")]

    def _now_arg(self) -> str:
        return "" if self._clock is None else repr(self._clock())

    async def reserve(self, tenant: str, limits: Limits, tokens: int) -> Reservation:
        check_tokens(tokens)
        if limits.tpm is not None and tokens > limits.tpm:
            raise too_large_for_tpm(tokens, limits.tpm)
        rid = uuid.uuid4().hex
        args = [
            self._now_arg(),
            repr(self.window_s),
            _limit_arg(limits.rpm),
            _limit_arg(limits.tpm),
            _limit_arg(limits.max_concurrency),
            str(tokens),
            repr(self.slot_ttl_s),
            rid,
        ]
        result = await _RESERVE_SCRIPT(self._client, self.keys(tenant), args)
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

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose(close_connection_pool=True)


def make_rate_limiter(redis_url: str | None, **options: Any) -> RateLimiter:
    """Redis-backed limits when ``redis_url`` is set (``TIERGATE_REDIS_URL``), else in-process.

    ``options`` go to the limiter (``window_s``, ``slot_ttl_s``, ``prefix`` for Redis, ...).
    """
    if redis_url:
        return RedisRateLimiter.from_url(redis_url, **options)
    options.pop("prefix", None)
    return InMemoryRateLimiter(**options)
