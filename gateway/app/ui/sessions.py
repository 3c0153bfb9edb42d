"""The dashboard's session cookie, its CSRF token, and the back-off after failed sign-ins.

The session itself is a database row (:mod:`gateway.db.crud.operators`), so every worker
process and replica sees it. The CSRF token is ``HMAC(server secret, session token)``: bound to
the session, never stored, and unguessable without both the cookie and the server secret. A
page puts it in every form (``csrf_token``) and htmx sends it as ``x-csrf-token``.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import deque
from dataclasses import dataclass

from fastapi import Request, Response

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
_MAX_CLIENTS = 10_000


@dataclass(frozen=True, slots=True)
class Operator:
    """Who is signed in to this request's session."""

    name: str
    session_id: int
    csrf_token: str

    @property
    def actor(self) -> str:
        """The audit log's actor for a change made through the dashboard."""
        return f"admin-ui:{self.name}"

    def __repr__(self) -> str:
        return f"Operator(name={self.name!r}, session_id={self.session_id}, csrf_token=<hidden>)"


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

    Kept per process (with N workers an address gets N times as many).
    """

    def __init__(self, failures: int = SIGNIN_FAILURES, window_s: float = SIGNIN_WINDOW_S) -> None:
        self.failures = failures
        self.window_s = window_s
        self._seen: dict[str, deque[float]] = {}
        self._attempts: dict[tuple[str, bytes], tuple[int, float]] = {}
        """(address, digest of the attempt) -> (failures in a row, time of the last)."""
        self._lock = threading.Lock()

    @staticmethod
    def _key(client: str, attempt: str) -> tuple[str, bytes]:
        return client, hashlib.sha256(attempt.encode()).digest()[:16]

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._seen.get(client)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._seen[client]
        return times

    def retry_after(
        self, client: str, attempt: str, *, guessable: bool = False, now: float | None = None
    ) -> float | None:
        """Seconds until ``attempt`` from ``client`` is checked, or None if it is now."""
        now = time.monotonic() if now is None else now
        with self._lock:
            wait = 0.0
            seen = self._attempts.get(self._key(client, attempt))
            if seen is not None:
                count, last = seen
                wait = last + min(SIGNIN_MAX_BACKOFF_S, 2.0 ** (count - 1)) - now
            if guessable:
                times = self._recent(client, now)
                if len(times) >= self.failures:
                    wait = max(wait, times[0] + self.window_s - now)
            return wait if wait > 0 else None

    def failed(
        self, client: str, attempt: str, *, guessable: bool = True, now: float | None = None
    ) -> None:
        """Count a failure of ``attempt`` (and, if ``guessable``, against the address)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._bound(now)
            key = self._key(client, attempt)
            count, last = self._attempts.pop(key, (0, now))
            if now - last > self.window_s + SIGNIN_MAX_BACKOFF_S:
                count = 0  # a long quiet: start over
            self._attempts[key] = (count + 1, now)
            if guessable:
                self._seen.setdefault(client, deque()).append(now)

    def _bound(self, now: float) -> None:
        """At most :data:`_MAX_CLIENTS` of each, the stale ones dropped first, then the oldest."""
        cutoff = now - self.window_s - SIGNIN_MAX_BACKOFF_S
        if len(self._attempts) >= _MAX_CLIENTS:
            for key in [k for k, (_, last) in self._attempts.items() if last <= cutoff]:
                del self._attempts[key]
            while len(self._attempts) >= _MAX_CLIENTS:
                del self._attempts[next(iter(self._attempts))]
        if len(self._seen) >= _MAX_CLIENTS:
            for old in [c for c, t in self._seen.items() if not t or t[-1] <= cutoff]:
                del self._seen[old]
            while len(self._seen) >= _MAX_CLIENTS:
                del self._seen[next(iter(self._seen))]
