"""Bearer-key authentication with a short-lived cache in front of the database, that outlives
the database's outages for keys in use.

A hit costs one HMAC and a dict lookup; only a miss reaches the database (in a worker thread,
and concurrent misses for one key share one lookup). Entries live at most ``ttl_s`` (≤ 2 s) and
never past the key's own expiry, so a revocation made anywhere takes effect within ``ttl_s``;
the admin API calls :meth:`AuthCache.invalidate` to make it immediate in this process. Refusals
are cached too (same TTL), so a flood of bad keys costs the database one query per key per TTL.
Entries are keyed by the key's HMAC: the cache never holds a plaintext key.

Refresh-ahead: a key in use is re-read in the background once its entry is half its TTL old,
while requests go on using the still-valid entry — so a busy key never makes a request wait for
the database (without it, one request per key per TTL paid a database round trip in its TTFT).
Lookups that started before an :meth:`invalidate` do not store their (possibly stale) result.

Outages (``docs/operations/database-outage.md``): when the database cannot answer (any
SQLAlchemy error, :func:`~gateway.db.errors.classify`), a key the database accepted less than
``stale_s`` ago goes on authenticating as its last-good identity — past its TTL, so a
revocation, suspension or tier change made during the outage is not seen until the database
is back — except once the key's own ``expires_at`` has passed. A request for such a key never
waits long for a database that does not answer: after ``stale_wait_s`` (and at once while an
outage is known) it is served from the last-good identity while the lookup goes on in the
background. Refusals are never served stale: a key refused, or never seen, gets a 503
``database_unavailable`` with ``retry-after`` until the database answers. While an outage is
known, such keys are answered at once and the database is tried again at most every
``OUTAGE_RETRY_S``. Every ``PRELOAD_INTERVAL_S`` the cache also learns the keys any gateway
process used lately (:meth:`AuthCache.preload`), so that under several workers or replicas a
key in use authenticates during an outage on whichever process its request reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, joinedload, sessionmaker

from gateway.db.crud import authenticate
from gateway.db.errors import DatabaseFailure, classify, describe
from gateway.db.identity import KeyIdentity
from gateway.db.models import ApiKey, Tenant, utcnow
from gateway.db.security import display_prefix, hash_key, parse_prefix
from gateway.errors import (
    BUSY_RETRY_AFTER_S,
    DATABASE_BUSY,
    DATABASE_UNAVAILABLE,
    UNAVAILABLE_RETRY_AFTER_S,
    ApiError,
    database_error,
    unauthorized,
)

if TYPE_CHECKING:
    from gateway.app.state import GatewayState

log = logging.getLogger(__name__)

MAX_ENTRIES = 100_000
DEFAULT_STALE_S = 300.0
STALE_WAIT_S = 1.0
"""Longest a request for a key servable from its last-good identity waits for the database."""
OUTAGE_RETRY_S = 0.5
PRELOAD_INTERVAL_S = 10.0
"""How often :meth:`AuthCache.keep_warm` re-reads the keys in use (by any process)."""
"""While an outage is known: how often the database is tried again (by a refresh or a miss)."""
UNAUTHENTICATED = "unauthenticated"
"""The tier label of requests refused before a key resolved to a tier."""


@dataclass(frozen=True, slots=True)
class _Entry:
    identity: KeyIdentity | None
    refusal: str | None  # the 401 message when identity is None
    expires_mono: float
    refresh_mono: float
    """After this (half the TTL), a use triggers a background re-read."""
    loaded_mono: float
    """When the database gave this answer: an identity is servable until ``+ stale_s``."""


class AuthCache:
    """Resolve ``Authorization: Bearer tg-...`` to a :class:`KeyIdentity`, or raise 401 (503
    while the database cannot say).

    ``clock`` (seconds, monotonic) dates the entries' refresh, expiry and staleness. It is
    injectable (and a public attribute, for a cache the app built) so that tests step over a TTL
    instead of sleeping through it; the database worker thread reads it too, so it must be
    thread-safe. ``wall_clock`` (aware UTC datetimes) says when a key's own ``expires_at`` has
    passed while it is served stale.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        secret: str | bytes,
        *,
        ttl_s: float = 1.0,
        stale_s: float = DEFAULT_STALE_S,
        stale_wait_s: float = STALE_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if not 0 < ttl_s <= 2.0:
            raise ValueError("ttl_s must be in (0, 2] so that revocations apply within seconds")
        if stale_s < 0 or stale_wait_s < 0:
            raise ValueError("stale_s and stale_wait_s must be >= 0")
        self._factory = session_factory
        self._secret = secret
        self._keyed = hmac.new(
            secret.encode() if isinstance(secret, str) else secret, digestmod=hashlib.sha256
        )
        """The secret's HMAC state, set up once: a hit hashes its key on a copy of it (a new
        HMAC per request sets the key up again, most of what the hash costs)."""
        self.ttl_s = ttl_s
        self.stale_s = stale_s
        self.stale_wait_s = stale_wait_s
        self.clock = clock
        self.wall_clock = wall_clock
        self._entries: dict[str, _Entry] = {}
        self._pending: dict[str, asyncio.Task[_Entry]] = {}
        self._refreshing: set[asyncio.Task[_Entry]] = set()  # background lookups (tests wait)
        self._used: set[int] = set()  # key ids seen since the last touch flush
        self._generation = 0  # bumped by invalidate(): older lookups must not store results
        self._down_since: float | None = None  # the database's last answer was a failure
        self._next_try = 0.0  # while down: no new lookup for an uncached key before this
        self._last_error: SQLAlchemyError | None = None  # what the database last failed with
        self.stale_served = 0
        """Requests authenticated from a last-good identity while the database could not say."""
        self.unavailable_refused = 0
        """Requests answered 503 because the database could not say and nothing was servable."""

    @property
    def database_down(self) -> bool:
        """Whether the last lookup failed for the database (it has not answered since)."""
        return self._down_since is not None

    def can_serve_stale(self) -> bool:
        """Whether some key would still authenticate from the cache if the database is down."""
        now = self.clock()
        return any(
            e.identity is not None and now - e.loaded_mono <= self.stale_s
            for e in self._entries.values()
        )

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
        """The identity of an ``Authorization`` header value; :class:`ApiError` 401 if refused,
        503 if the database cannot say and no last-good identity is servable."""
        key = _bearer(authorization)
        digest = self._digest(key)
        now = self.clock()
        entry = self._entries.get(digest)
        if entry is not None and entry.expires_mono > now:
            if entry.refresh_mono <= now and digest not in self._pending:
                self._refresh(digest, key)
            return self._answer(entry)
        servable = entry if entry is not None and self._servable(entry, now) else None
        if self._down_since is not None:
            if servable is not None:  # a known outage: serve it now, ask in the background
                if digest not in self._pending and now >= self._next_try:
                    self._refresh(digest, key)
                return self._stale(servable)
            if now < self._next_try:
                self.unavailable_refused += 1
                raise _unavailable(self._last_error)
        lookup = self._start_lookup(digest, key)
        try:
            if servable is None:
                fresh = await asyncio.shield(lookup)
            else:
                fresh = await asyncio.wait_for(asyncio.shield(lookup), self.stale_wait_s)
        except TimeoutError:
            assert servable is not None
            return self._stale(servable)
        except SQLAlchemyError as exc:
            if servable is not None:
                return self._stale(servable)
            self.unavailable_refused += 1
            raise _unavailable(exc) from None
        return self._answer(fresh)

    def _digest(self, key: str) -> str:
        """``hash_key(secret, key)``: what the cache and the database key a key by."""
        mac = self._keyed.copy()
        mac.update(key.encode())
        return mac.hexdigest()

    def _answer(self, entry: _Entry) -> KeyIdentity:
        if entry.identity is None:
            raise unauthorized(entry.refusal or "invalid API key")
        self._used.add(entry.identity.key_id)
        return entry.identity

    def _servable(self, entry: _Entry, now: float) -> bool:
        return entry.identity is not None and now - entry.loaded_mono <= self.stale_s

    def _stale(self, entry: _Entry) -> KeyIdentity:
        """The last-good identity of ``entry``, unless the key's own expiry has passed."""
        identity = entry.identity
        assert identity is not None
        if identity.expires_at is not None and identity.expires_at <= self.wall_clock():
            shown = display_prefix(identity.key_prefix)
            raise unauthorized(
                f"API key {shown}-**** expired at {identity.expires_at.isoformat()}."
            )
        self.stale_served += 1
        self._used.add(identity.key_id)
        return identity

    # -- lookups ---------------------------------------------------------------------------

    def _start_lookup(self, digest: str, key: str) -> asyncio.Task[_Entry]:
        """The lookup of ``digest`` in flight, or a new one: one per key at a time, run to its
        end even when every request waiting for it has gone (the next one finds the result)."""
        pending = self._pending.get(digest)
        if pending is not None:
            return pending
        task = asyncio.get_running_loop().create_task(self._fetch(digest, key))
        self._pending[digest] = task

        def done(finished: asyncio.Task[_Entry]) -> None:
            if self._pending.get(digest) is finished:
                del self._pending[digest]
            if not finished.cancelled():
                finished.exception()  # retrieved: no "never retrieved" warning without waiters

        task.add_done_callback(done)
        return task

    async def _fetch(self, digest: str, key: str) -> _Entry:
        generation = self._generation
        try:
            entry = await asyncio.to_thread(self._load, key)
        except SQLAlchemyError as exc:
            self._database_failed(exc)
            raise
        self._database_answered()
        if generation == self._generation:  # else an invalidation raced this read: don't keep it
            if len(self._entries) >= MAX_ENTRIES:
                self._evict()
            self._entries[digest] = entry
        return entry

    def _refresh(self, digest: str, key: str) -> None:
        """Re-read one key in the background (refresh-ahead); a failure leaves the entry to
        expire, or to be served stale, on its own (the outage is logged once, not per key)."""
        task = self._start_lookup(digest, key)
        self._refreshing.add(task)
        task.add_done_callback(self._refreshing.discard)

    def _evict(self) -> None:
        """Make room: refusals and entries past any use first, everything only if that is not
        enough (crude but bounded; a refill costs one query per key)."""
        now = self.clock()
        for digest, entry in list(self._entries.items()):
            if entry.expires_mono <= now and not self._servable(entry, now):
                del self._entries[digest]
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()

    def _database_failed(self, exc: SQLAlchemyError) -> None:
        now = self.clock()
        self._next_try = now + OUTAGE_RETRY_S
        self._last_error = exc
        if self._down_since is None:
            self._down_since = now
            log.error(
                "API keys cannot be checked against the database (%s): keys it accepted in "
                "the last %.0f s are served from the cache until it answers",
                describe(exc),
                self.stale_s,
            )

    def _database_answered(self) -> None:
        if self._down_since is not None:
            log.warning(
                "API keys are checked against the database again (after %.1f s)",
                self.clock() - self._down_since,
            )
            self._down_since = None

    def _load(self, key: str) -> _Entry:
        """Database lookup (worker thread); on refusal, a second query says why."""
        now_wall, now_mono = utcnow(), self.clock()
        with self._factory() as session:
            identity = authenticate(  # a key under a previous secret: re-hashed, own commit
                session, self._secret, key, now=now_wall, touch=False, rehash_in=self._factory
            )
            if identity is not None:
                expires = now_mono + self.ttl_s
                if identity.expires_at is not None:
                    left = (identity.expires_at - now_wall).total_seconds()
                    expires = min(expires, now_mono + left)
                return _Entry(identity, None, expires, now_mono + self.ttl_s / 2, now_mono)
            refusal = self._why_refused(session, key, now_wall)
        end = now_mono + self.ttl_s
        return _Entry(None, refusal, end, end, now_mono)

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

    async def preload(self) -> int:
        """Learn the last-good identity of every key in use (``last_used_at`` within
        ``stale_s``, written by any gateway process), so that a key this process has not served
        yet still authenticates during an outage (with several workers or replicas, a key's
        requests land on any of them). Entries learnt so start expired: with the database up,
        a request still looks its key up as before; they only serve as the outage's fallback.
        Returns how many were learnt."""
        generation = self._generation
        try:
            found = await asyncio.to_thread(self._load_in_use)
        except SQLAlchemyError as exc:
            self._database_failed(exc)
            raise
        self._database_answered()
        if generation != self._generation:  # an invalidation raced this read: don't keep it
            return 0
        now, learnt = self.clock(), 0
        for digest, identity in found:
            entry = self._entries.get(digest)
            if entry is not None and entry.expires_mono > now:
                continue  # fresh: better than this
            if len(self._entries) >= MAX_ENTRIES:
                break
            self._entries[digest] = _Entry(identity, None, now, now, now)
            learnt += 1
        return learnt

    async def keep_warm(self, interval_s: float = PRELOAD_INTERVAL_S) -> None:
        """:meth:`preload` every ``interval_s`` until cancelled (a failure waits for the next)."""
        while True:
            with contextlib.suppress(SQLAlchemyError):  # the request path logs the outage
                await self.preload()
            await asyncio.sleep(interval_s)

    def _load_in_use(self) -> list[tuple[str, KeyIdentity]]:
        now = utcnow()
        with self._factory() as session:
            rows = session.execute(
                select(ApiKey, Tenant)
                .join(Tenant, ApiKey.tenant_id == Tenant.id)
                .options(joinedload(Tenant.tier))
                .where(
                    ApiKey.last_used_at >= now - timedelta(seconds=self.stale_s),
                    ApiKey.revoked_at.is_(None) | (ApiKey.revoked_at > now),
                    ApiKey.expires_at.is_(None) | (ApiKey.expires_at > now),
                    Tenant.status == "active",
                )
                .order_by(ApiKey.last_used_at.desc())
                .limit(MAX_ENTRIES // 2)
            ).all()
            return [(k.key_hash, KeyIdentity.from_rows(k, t, t.tier)) for k, t in rows]

    def flush_last_used(self) -> int:
        """Write ``last_used_at`` of the keys used since the last flush (a background task's job,
        so the request path never writes to the database). Returns how many keys were touched.
        Keys whose write failed (the database down) are kept for the next flush."""
        used, self._used = self._used, set()
        if not used:
            return 0
        try:
            with self._factory.begin() as session:
                session.execute(
                    update(ApiKey).where(ApiKey.id.in_(sorted(used))).values(last_used_at=utcnow())
                )
        except BaseException:
            self._used |= used
            raise
        return len(used)


async def authenticate_request(state: GatewayState, authorization: str | None) -> KeyIdentity:
    """:meth:`AuthCache.authenticate` for a generation request: a refusal (401, or 503 while
    the database cannot say) is counted in ``tiergate_requests_total`` (tier
    ``unauthenticated``) and ``tiergate_rejections_total`` (its code) before it is raised."""
    try:
        return await state.auth.authenticate(authorization)
    except ApiError as exc:
        metrics = state.metrics
        metrics.requests.labels("", UNAUTHENTICATED, str(exc.status)).inc()
        metrics.rejections.labels("", UNAUTHENTICATED, exc.code or "unauthorized").inc()
        raise


def _unavailable(exc: SQLAlchemyError | None) -> ApiError:
    """503 with ``retry-after`` for a key the database cannot check now (not logged per
    request: the outage is logged when it starts and ends). A schema that is not this code's is
    no outage: :func:`~gateway.errors.database_error` says so (500, logged)."""
    failure = classify(exc) if exc is not None else DatabaseFailure.UNAVAILABLE
    if exc is not None and failure is DatabaseFailure.SCHEMA:
        return database_error(exc)
    if failure is DatabaseFailure.BUSY:
        code, retry_after = DATABASE_BUSY, BUSY_RETRY_AFTER_S
        message = "the database is busy, so this API key cannot be checked now; retry shortly"
    else:
        code, retry_after = DATABASE_UNAVAILABLE, UNAVAILABLE_RETRY_AFTER_S
        message = "the database is unavailable, so this API key cannot be checked; retry later"
    return ApiError(503, message, code=code, headers={"retry-after": str(retry_after)})


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


__all__ = ["UNAUTHENTICATED", "ApiError", "AuthCache", "authenticate_request"]
