"""``/ui/login`` and ``/ui/logout``: signing an operator in and out.

Sign-in takes ``TIERGATE_ADMIN_KEY`` or a stored operator credential (``tgop-...``, printed
once by ``tiergate serve`` on its first start, or by ``tiergate admin reset-credential``) — the
same secrets the admin API takes (:mod:`gateway.app.admin.credentials`). A tenant's API key is
refused with a message saying what it is for. A value that failed backs off per (value,
client address); guesses that could only match a short admin key are also limited per address
(:class:`~gateway.app.ui.sessions.SignInLimiter`, 429 past it); the right operator credential
is never refused for what others tried. A success starts a database
session (audited ``signin``), sets the cookie and goes where the operator was headed.

The sign-in form has no session to bind a CSRF token to; a cross-site POST to it is refused by
its ``Origin`` instead (a browser always sends one with a form POST).
"""

from __future__ import annotations

import asyncio
import math
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from gateway.app.admin.credentials import (
    Administrator,
    admin_key_configured,
    identify,
    looks_like_credential,
)
from gateway.app.state import GatewayState, StateDep
from gateway.app.ui.deps import (
    CsrfDep,
    OperatorDep,
    PublicRoute,
    SignInRequired,
    UiRoute,
    signed_in,
)
from gateway.app.ui.forms import read_form
from gateway.app.ui.render import error_page, home_of, redirect, render
from gateway.app.ui.sessions import (
    STRONG_ADMIN_KEY_CHARS,
    SignInLimiter,
    clear_session_cookie,
    set_session_cookie,
)
from gateway.db.crud import operators
from gateway.db.models import utcnow
from gateway.db.security import parse_prefix

public = APIRouter(route_class=PublicRoute)
private = APIRouter(route_class=UiRoute)
router = APIRouter()

HOME = "/ui/"
TENANT_KEY_REFUSED = (
    "This is a tenant API key (tg-…): it calls the /v1 API and cannot sign in to the "
    "dashboard. Sign in with the operator credential (tgop-…) that `tiergate serve` printed "
    "on its first start, or with TIERGATE_ADMIN_KEY."
)
WRONG_CREDENTIAL = (
    "Wrong credential: it is neither TIERGATE_ADMIN_KEY nor a current operator credential. "
    "Lost it? `tiergate admin reset-credential` prints a new one."
)


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a dashboard path only (never another site)."""
    if not target:
        return HOME
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/ui/") or "\\" in target:
        return HOME
    if parts.path.startswith(("/ui/login", "/ui/logout", "/ui/static")):
        return HOME
    return target


def _client(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def _guessable(state: GatewayState, presented: str) -> bool:
    """Whether ``presented`` could only match a short ``TIERGATE_ADMIN_KEY`` (the one secret
    an operator may choose weak): such attempts are limited per address. An operator
    credential cannot be guessed, so attempts shaped like one never are."""
    if looks_like_credential(presented) or not admin_key_configured(state.settings):
        return False
    key = state.settings.admin_key
    return key is not None and len(key.get_secret_value()) < STRONG_ADMIN_KEY_CHARS


def _cross_site(request: Request) -> bool:
    """A form POSTed from another origin (its ``Origin`` header names another host)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin == "null"
    parts = urlsplit(origin)
    return parts.netloc != request.headers.get("host", "")


def _form(
    request: Request, *, status_code: int, next_url: str, error: str | None = None, **extra: str
) -> HTMLResponse:
    errors = {"credential": error} if error else {}
    return render(
        request,
        "login.html",
        status_code=status_code,
        title="Sign in",
        next_url=next_url,
        errors=errors,
        headers=extra or None,
    )


@public.get("/login")
async def login_form(
    request: Request, next: Annotated[str | None, Query(max_length=2000)] = None
) -> Response:
    try:
        await signed_in(request)
    except SignInRequired:
        return _form(request, status_code=200, next_url=safe_next(next))
    return RedirectResponse(safe_next(next), status_code=303)


def _sign_in(state: GatewayState, who: Administrator, client: str) -> str:
    """Start a session (and sweep expired ones); returns the cookie's token."""
    with state.session_factory.begin() as session:
        operators.purge_expired_sessions(session, ttl_s=state.settings.ui_session_ttl_s)
        started = operators.start_session(
            session,
            secret=state.secret,
            operator=who.name,
            credential_id=who.credential_id,
            client=client,
            now=utcnow(),
        )
        return started.token


@public.post("/login")
async def login(request: Request, state: StateDep) -> Response:
    if _cross_site(request):
        return error_page(request, 403, "Sign-in forms are accepted from this site only.")
    limiter: SignInLimiter = request.app.state.ui_signin_limiter
    client = _client(request)
    values = await read_form(request)
    next_url = safe_next(values.get("next"))
    credential = values.get("credential", "").strip()
    if not credential:
        message = "credential: enter the operator credential or TIERGATE_ADMIN_KEY"
        return _form(request, status_code=400, next_url=next_url, error=message)
    guessable = _guessable(state, credential)
    wait = limiter.retry_after(client, credential, guessable=guessable)
    if wait is not None:
        seconds = math.ceil(wait)
        message = f"Too many failed sign-ins from {client}: try again in {seconds} s."
        return _form(
            request,
            status_code=429,
            next_url=next_url,
            error=message,
            **{"retry-after": str(seconds)},
        )
    who = None
    if parse_prefix(credential) is None:
        who = await asyncio.to_thread(identify, state, credential, record_use=True)
    if who is None:
        limiter.failed(client, credential, guessable=guessable)
        refusal = TENANT_KEY_REFUSED if parse_prefix(credential) else WRONG_CREDENTIAL
        return _form(request, status_code=401, next_url=next_url, error=refusal)
    token = await asyncio.to_thread(_sign_in, state, who, client)
    if next_url == HOME:
        next_url = home_of(who.principal)  # a tenant admin starts at its keys
    response = redirect(request, next_url, flash=f"Signed in as {who.name}.")
    set_session_cookie(request, response, token)
    return response


def _sign_out(state: GatewayState, session_id: int) -> None:
    with state.session_factory.begin() as session:
        operators.end_session(session, session_id)


@private.post("/logout")
async def logout(request: Request, operator: OperatorDep, _: CsrfDep, state: StateDep) -> Response:
    await asyncio.to_thread(_sign_out, state, operator.session_id)
    response = redirect(request, "/ui/login", flash="Signed out.")
    clear_session_cookie(request, response)
    return response


router.include_router(public)
router.include_router(private)
