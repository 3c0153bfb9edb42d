"""The dashboard's session cookie, its CSRF token, and the back-off after failed sign-ins.

The session itself is a database row (:mod:`gateway.db.crud.operators`), so every worker
process and replica sees it. The CSRF token is ``HMAC(server secret, session token)``: bound to
the session, never stored, and unguessable without both the cookie and the server secret. A
page puts it in every form (``csrf_token``) and htmx sends it as ``x-csrf-token``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from dataclasses import dataclass

import numpy as np
from fastapi import Request, Response

from gateway.app.admin.roles import Principal
from gateway.app.shared_state import SharedFile

SESSION_COOKIE = "tiergate_session"
COOKIE_PATH = "/ui"
_CSRF_LABEL = b"tiergate csrf v1:"

SIGNIN_FAILURES = 10
"""Failed guesses of a guessable secret (a short admin key) an address may make per
:data:`SIGNIN_WINDOW_S` before it gets 429 (:class:`SignInLimiter`)."""
STRONG_ADMIN_KEY_CHARS = 32
"""An admin key at least this long is taken as unguessable, like an operator credential (its
sign-in is never limited per address): 32 characters is ``openssl rand -hex 16``."""
SIGNIN_WINDOW_S = 60.0
SIGNIN_MAX_BACKOFF_S = 60.0
"""The longest a value that failed waits before it is checked again from the same address."""


@dataclass(frozen=True, slots=True)
class Operator:
    """Who is signed in to this request's session."""

    name: str
    session_id: int
    csrf_token: str
    principal: Principal
    """Its role (and a tenant admin's tenant), read from its credential on every request."""

    @property
    def actor(self) -> str:
        """The audit log's actor for a change made through the dashboard."""
        return f"admin-ui:{self.name}"

    def __repr__(self) -> str:
        role = self.principal.role.value
        return (
            f"Operator(name={self.name!r}, role={role!r}, session_id={self.session_id}, "
            "csrf_token=<hidden>)"
        )


def csrf_token(secret: str | bytes, session_token: str) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, _CSRF_LABEL + session_token.encode(), hashlib.sha256).hexdigest()


def set_session_cookie(request: Request, response: Response, token: str) -> None:
    """HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it), Path=/ui
    (the API never sees it), Secure when the dashboard is served over https. No Max-Age: the
    browser forgets it when it closes; the server's idle expiry ends it before that."""
    response.set_cookie(
        SESSION_COOKIE,
        token,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_session_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        SESSION_COOKIE,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


SIGNIN_BUCKETS = 2048
SIGNIN_WAYS = 8
"""The failure table: an (address) or (address, value) key hashes to one bucket of this many
rows (16,384 keys); a full bucket forgets the key whose last failure is oldest."""
_COUNT, _LAST, _RING = 0, 1, 2


def signin_table_bytes(failures: int = SIGNIN_FAILURES) -> int:
    """The size of a failure table whose address rows keep ``failures`` times."""
    return SIGNIN_BUCKETS * SIGNIN_WAYS * 8 * (2 + _RING + failures)


class SignInLimiter:
    """Failed sign-ins, kept so that a stranger cannot lock the operator out.

    * **Per (address, attempt).** A value that failed from an address is refused unchecked
      for a while if tried again from there: 1 s after its first failure, doubling with each
      one to :data:`SIGNIN_MAX_BACKOFF_S` (a script retrying a stale credential). Any *other*
      value is checked, so the right credential passes at once, whatever else was tried.
    * **Per address, for guessable secrets only.** An operator credential is 256 random bits and
      cannot be guessed, so guessing one needs no limit (and a limit would only be a way to lock
      its holder out). A short ``TIERGATE_ADMIN_KEY`` can be guessed: attempts that could only
      match it (``guessable``) get ``failures`` per ``window_s`` per address, then 429.

    The failures live in a fixed table of hashed keys (no address or value is kept): the
    workers' shared one under ``tiergate serve --workers N``
    (:mod:`gateway.app.shared_state`), so every worker sees every failure; else one of this
    process's own.
    """

    def __init__(
        self,
        failures: int = SIGNIN_FAILURES,
        window_s: float = SIGNIN_WINDOW_S,
        *,
        table: SharedFile | None = None,
    ) -> None:
        self.failures = failures
        self.window_s = window_s
        self.table = table or SharedFile.private(signin_table_bytes(failures))
        self._keys: np.ndarray = np.ndarray(
            (SIGNIN_BUCKETS, SIGNIN_WAYS, 2), dtype=np.int64, buffer=self.table.buffer
        )
        self._rows: np.ndarray = np.ndarray(
            (SIGNIN_BUCKETS, SIGNIN_WAYS, _RING + failures),
            dtype=np.float64,
            buffer=self.table.buffer,
            offset=SIGNIN_BUCKETS * SIGNIN_WAYS * 2 * 8,
        )

    @staticmethod
    def _key(*parts: str) -> tuple[int, int, int]:
        """(high, low, bucket) of a key: its parts, hashed."""
        digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=16).digest()
        high = int.from_bytes(digest[:8], "little", signed=True)
        low = int.from_bytes(digest[8:], "little", signed=True) or 1
        return high, low, int.from_bytes(digest[:8], "little") % SIGNIN_BUCKETS

    def _row(self, key: tuple[int, int, int], *, create: bool) -> np.ndarray | None:
        high, low, bucket = key
        keys, rows = self._keys[bucket], self._rows[bucket]
        found = np.flatnonzero((keys[:, 0] == high) & (keys[:, 1] == low))
        if found.size:
            return rows[int(found[0])]
        if not create:
            return None
        empty = np.flatnonzero((keys[:, 0] == 0) & (keys[:, 1] == 0))
        way = int(empty[0]) if empty.size else int(np.argmin(rows[:, _LAST]))
        rows[way, _COUNT] = 0.0
        rows[way, _LAST] = -math.inf
        rows[way, _RING:] = -math.inf
        keys[way] = (high, low)
        return rows[way]

    def retry_after(
        self, client: str, attempt: str, *, guessable: bool = False, now: float | None = None
    ) -> float | None:
        """Seconds until ``attempt`` from ``client`` is checked, or None if it is now."""
        now = time.monotonic() if now is None else now
        with self.table.locked():
            wait = 0.0
            pair = self._row(self._key("attempt", client, attempt), create=False)
            if pair is not None and pair[_COUNT] > 0:
                backoff = min(SIGNIN_MAX_BACKOFF_S, 2.0 ** (pair[_COUNT] - 1))
                wait = float(pair[_LAST]) + backoff - now
            if guessable:
                address = self._row(self._key("address", client), create=False)
                if address is not None:
                    recent = address[_RING:][address[_RING:] > now - self.window_s]
                    if recent.size >= self.failures:
                        wait = max(wait, float(recent.min()) + self.window_s - now)
            return wait if wait > 0 else None

    def failed(
        self, client: str, attempt: str, *, guessable: bool = True, now: float | None = None
    ) -> None:
        """Count a failure of ``attempt`` (and, if ``guessable``, against the address)."""
        now = time.monotonic() if now is None else now
        with self.table.locked():
            pair = self._row(self._key("attempt", client, attempt), create=True)
            assert pair is not None
            if now - pair[_LAST] > self.window_s + SIGNIN_MAX_BACKOFF_S:
                pair[_COUNT] = 0.0  # a long quiet: start over
            pair[_COUNT] += 1.0
            pair[_LAST] = now
            if guessable:
                address = self._row(self._key("address", client), create=True)
                assert address is not None
                ring = address[_RING:]
                ring[int(np.argmin(ring))] = now  # the oldest of the last ``failures``
                address[_LAST] = now
