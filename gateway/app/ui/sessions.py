"""The dashboard's session cookie, its CSRF token, and the limit on failed sign-ins.

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
"""Failed sign-ins a client address may make per :data:`SIGNIN_WINDOW_S` before it gets 429."""
SIGNIN_WINDOW_S = 60.0
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
    """Failed sign-ins per client address in a sliding window (per process: with N workers an
    address gets at most N times the limit, still far too few to guess a 256-bit credential).
    """

    def __init__(self, failures: int = SIGNIN_FAILURES, window_s: float = SIGNIN_WINDOW_S) -> None:
        self.failures = failures
        self.window_s = window_s
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._seen.get(client)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._seen[client]
        return times

    def retry_after(self, client: str, now: float | None = None) -> float | None:
        """Seconds until ``client`` may try again, or None if it may now."""
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._recent(client, now)
            if len(times) < self.failures:
                return None
            return max(1.0, times[0] + self.window_s - now)

    def failed(self, client: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            if client not in self._seen and len(self._seen) >= _MAX_CLIENTS:
                cutoff = now - self.window_s
                for old in [c for c, t in self._seen.items() if not t or t[-1] <= cutoff]:
                    del self._seen[old]
                if len(self._seen) >= _MAX_CLIENTS:  # still full: forget the oldest
                    del self._seen[next(iter(self._seen))]
            self._seen.setdefault(client, deque()).append(now)
