"""Bearer-key authentication with a short-lived cache in front of the database.

A hit costs one HMAC and a dict lookup; only a miss reaches the database (in a worker thread,
and concurrent misses for one key share one lookup). Entries live at most ``ttl_s`` (≤ 2 s) and
never past the key's own expiry, so a revocation made anywhere takes effect within ``ttl_s``;
the admin API calls :meth:`AuthCache.invalidate` to make it immediate in this process. Refusals
are cached too (same TTL), so a flood of bad keys costs the database one query per key per TTL.
Entries are keyed by the key's HMAC: the cache never holds a plaintext key.

Refresh-ahead: a key in use is re-read in the background once its entry is half its TTL old,
while requests go on using the still-valid entry — so a busy key never makes a request wait for
the database (without it, one request per key per TTL paid a database round trip in its TTFT).
An entry is still never used past its TTL. Lookups that started before an :meth:`invalidate`
do not store their (possibly stale) result.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.crud import authenticate
from gateway.db.identity import KeyIdentity
from gateway.db.models import ApiKey, Tenant, utcnow
from gateway.db.security import display_prefix, hash_key, parse_prefix
from gateway.errors import ApiError, unauthorized

log = logging.getLogger(__name__)

MAX_ENTRIES = 100_000


@dataclass(frozen=True, slots=True)
class _Entry:
    identity: KeyIdentity | None
    refusal: str | None  # the 401 message when identity is None
    expires_mono: float
    refresh_mono: float
    """After this (half the TTL), a use triggers a background re-read."""


class AuthCache:
    """Resolve ``Authorization: Bearer tg-...`` to a :class:`KeyIdentity`, or raise 401.

    ``clock`` (seconds, monotonic) dates the entries' refresh and expiry times. It is injectable
    (and a public attribute, for a cache the app built) so that tests step over a TTL instead of
    sleeping through it; the database worker thread reads it too, so it must be thread-safe.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        secret: str | bytes,
        *,
        ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < ttl_s <= 2.0:
            raise ValueError("ttl_s must be in (0, 2] so that revocations apply within seconds")
        self._factory = session_factory
        self._secret = secret
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self._pending: dict[str, asyncio.Future[_Entry]] = {}
        self._used: set[int] = set()  # key ids seen since the last touch flush
        self._generation = 0  # bumped by invalidate(): older lookups must not store results
        self._refreshing: set[asyncio.Task[None]] = set()

    def invalidate(self, key_prefix: str | None = None) -> None:
        """Forget one key's cached identity (by prefix, ``abcd1234`` or ``tg-abcd1234``) or all.

        Also drops cached refusals when ``key_prefix`` is None. Synchronous and cheap, so both
        sync and async callers use it directly.
        """
        self._generation += 1
        if key_prefix is None:
            self._entries.clear()
            return
        prefix = key_prefix.removeprefix("tg-").split("-", 1)[0]
        for digest, entry in list(self._entries.items()):
            if entry.identity is not None and entry.identity.key_prefix == prefix:
                del self._entries[digest]

    async def authenticate(self, authorization: str | None) -> KeyIdentity:
        """The identity of an ``Authorization`` header value; :class:`ApiError` 401 if refused."""
        key = _bearer(authorization)
        digest = hash_key(self._secret, key)
        now = self.clock()
        entry = self._entries.get(digest)
        if entry is None or entry.expires_mono <= now:
            entry = await self._lookup(digest, key)
        elif entry.refresh_mono <= now and digest not in self._pending:
            self._refresh(digest, key)
        if entry.identity is None:
            raise unauthorized(entry.refusal or "invalid API key")
        self._used.add(entry.identity.key_id)
        return entry.identity

    async def _lookup(self, digest: str, key: str) -> _Entry:
        pending = self._pending.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
        self._pending[digest] = future
        generation = self._generation
        try:
            entry = await asyncio.to_thread(self._load, key)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()  # waiters retry on their own next call
            else:
                future.set_exception(exc)
                future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            self._pending.pop(digest, None)
        future.set_result(entry)
        if generation == self._generation:  # else an invalidation raced this read: don't keep it
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()  # crude but bounded; a refill costs one query per key
            self._entries[digest] = entry
        return entry

    def _refresh(self, digest: str, key: str) -> None:
        """Re-read one key in the background (refresh-ahead); failures leave the entry to
        expire on its own."""

        async def refresh() -> None:
            try:
                await self._lookup(digest, key)
            except Exception as exc:
                log.warning("background refresh of an API key failed: %s", type(exc).__name__)

        task = asyncio.get_running_loop().create_task(refresh())
        self._refreshing.add(task)
        task.add_done_callback(self._refreshing.discard)

    def _load(self, key: str) -> _Entry:
        """Database lookup (worker thread); on refusal, a second query says why."""
        now_wall, now_mono = utcnow(), self.clock()
        with self._factory() as session:
            identity = authenticate(session, self._secret, key, now=now_wall, touch=False)
            if identity is not None:
                expires = now_mono + self.ttl_s
                if identity.expires_at is not None:
                    left = (identity.expires_at - now_wall).total_seconds()
                    expires = min(expires, now_mono + left)
                return _Entry(identity, None, expires, now_mono + self.ttl_s / 2)
            refusal = self._why_refused(session, key, now_wall)
        return _Entry(None, refusal, now_mono + self.ttl_s, now_mono + self.ttl_s)

    def _why_refused(self, session: Session, key: str, now: datetime) -> str:
        prefix = parse_prefix(key)
        if prefix is None:
            return "Incorrect API key provided: keys look like tg-<prefix>-<secret>."
        shown = display_prefix(prefix)
        row = session.execute(
            select(ApiKey.revoked_at, ApiKey.expires_at, Tenant.status, Tenant.name)
            .join(Tenant, ApiKey.tenant_id == Tenant.id)
            .where(ApiKey.key_hash == hash_key(self._secret, key))
        ).first()
        if row is None:
            return f"Incorrect API key provided: {shown}-****."
        revoked_at, expires_at, status, tenant = row
        if revoked_at is not None and revoked_at <= now:
            return f"API key {shown}-**** has been revoked."
        if expires_at is not None and expires_at <= now:
            return f"API key {shown}-**** expired at {expires_at.isoformat()}."
        if status != "active":
            return f"API key {shown}-**** belongs to tenant {tenant!r}, which is {status}."
        return f"API key {shown}-**** is not valid."

    def flush_last_used(self) -> int:
        """Write ``last_used_at`` of the keys used since the last flush (a background task's job,
        so the request path never writes to the database). Returns how many keys were touched."""
        used, self._used = self._used, set()
        if not used:
            return 0
        with self._factory.begin() as session:
            session.execute(
                update(ApiKey).where(ApiKey.id.in_(sorted(used))).values(last_used_at=utcnow())
            )
        return len(used)


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise unauthorized(
            "You didn't provide an API key. Provide it in the Authorization header as "
            "'Authorization: Bearer YOUR_KEY'."
        )
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise unauthorized(
            "Malformed Authorization header: expected 'Authorization: Bearer YOUR_KEY'."
        )
    return key


__all__ = ["ApiError", "AuthCache"]
