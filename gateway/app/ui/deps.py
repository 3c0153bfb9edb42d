"""What every dashboard route shares: the signed-in operator, the CSRF check, the database
session, pagination, and the mapping of errors to deliberate pages.

The sign-in, role and CSRF checks run in :class:`UiRoute`, before the handler and before a
byte of its form is used (as the admin API checks its key before parsing): a page module cannot
forget them. The role check is the page's rule in :mod:`gateway.app.ui.rules` (roles:
:mod:`gateway.app.admin.roles`); a refusal is a 403 page. A POST without the session's CSRF
token is 403 and changes nothing. The aliases :data:`OperatorDep` and :data:`CsrfDep` are what
handlers declare; they return what the route already checked (and check it themselves in an
app that mounts a handler some other way).

Errors become pages, never a 500 or a JSON body: a data-layer refusal is its API status and
message (:func:`gateway.errors.domain_error`), a database failure 409/503 by what it means
(:func:`gateway.errors.database_error`), a bad query parameter 400. Forms show their own
errors beside the field (:mod:`gateway.app.ui.forms`); what reaches this is the rest.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

from gateway.app.admin.credentials import session_principal
from gateway.app.admin.roles import Access, access_for
from gateway.app.admin.schemas import INT32_MAX
from gateway.app.state import GatewayState, StateDep, get_state
from gateway.app.ui.render import error_page
from gateway.app.ui.rules import UI_RULES
from gateway.app.ui.sessions import SESSION_COOKIE, Operator, csrf_token
from gateway.db.crud import operators
from gateway.db.errors import DomainError
from gateway.db.models import utcnow
from gateway.errors import ApiError, database_error, domain_error, http_error, invalid_request

__all__ = [
    "Change",
    "ChangeDep",
    "CsrfDep",
    "CsrfRefused",
    "Operator",
    "OperatorDep",
    "Page",
    "PageDep",
    "PublicRoute",
    "SessionDep",
    "SignInRequired",
    "StateDep",
    "UiRoute",
]

UI_PREFIX = "/ui"
LOGIN_PATH = "/ui/login"
DEFAULT_PAGE = 50
MAX_PAGE = 200

SECURITY_HEADERS = {
    "cache-control": "no-store",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    # Scripts only from /ui/static (no inline script, no eval): an injected tag cannot run.
    "content-security-policy": "default-src 'self'; script-src 'self'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'",
}
"""Headers on every dashboard response: nothing cached (a new key's secret is on a page),
never framed (clickjacking), scripts from the dashboard's own files only."""


class SignInRequired(Exception):
    """No live session: the browser is sent to the sign-in page."""


class CsrfRefused(Exception):
    """A POST without the session's CSRF token (or with a wrong one)."""


def _lookup(state: GatewayState, token: str) -> Operator | None:
    """The session of ``token``, its idle expiry moved forward at most once a minute."""
    ttl_s = state.settings.ui_session_ttl_s
    now = utcnow()
    with state.session_factory() as session:
        row = operators.find_session(session, state.secret, token, ttl_s=ttl_s, now=now)
        if row is None:
            return None
        principal = session_principal(session, row.credential_id, row.operator)
        if principal is None:  # its credential was deleted a moment ago
            return None
        found = Operator(row.operator, row.id, csrf_token(state.secret, token), principal)
        stale = row.last_seen_at + operators.TOUCH_EVERY <= now
    if stale:
        with state.session_factory.begin() as session:
            operators.touch_session(session, found.session_id, now=now)
    return found


async def signed_in(request: Request) -> Operator:
    """The request's operator (looked up once per request), or :class:`SignInRequired`."""
    known = getattr(request.state, "operator", None)
    if isinstance(known, Operator):
        return known
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        raise SignInRequired
    operator = await asyncio.to_thread(_lookup, get_state(request), token)
    if operator is None:
        raise SignInRequired
    request.state.operator = operator
    return operator


async def check_csrf(request: Request, operator: Operator) -> None:
    """The ``x-csrf-token`` header or the form's ``csrf_token`` field must be the session's."""
    if getattr(request.state, "csrf_checked", False):
        return
    sent = request.headers.get("x-csrf-token")
    if sent is None:
        form = await request.form()
        field = form.get("csrf_token")
        sent = field if isinstance(field, str) else None
    if not sent or not hmac.compare_digest(sent.encode(), operator.csrf_token.encode()):
        raise CsrfRefused
    request.state.csrf_checked = True


def _sign_in_again(request: Request) -> Response:
    """To the sign-in page, back here afterwards; an htmx poll is told to reload the page."""
    if request.headers.get("hx-request"):
        return Response(status_code=401, headers={"hx-redirect": LOGIN_PATH})
    target = request.url.path
    if request.method == "GET" and request.url.query:
        target += f"?{request.url.query}"
    return Response(
        status_code=303, headers={"location": f"{LOGIN_PATH}?next={quote(target, safe='/')}"}
    )


def page_path(path: str) -> str:
    """A page's path as its page module declares it (the rule table's key), whether or not the
    router it is in was mounted under ``/ui`` already."""
    if path == UI_PREFIX or path.startswith(f"{UI_PREFIX}/"):
        return path[len(UI_PREFIX) :] or "/"
    return path


def _refused(request: Request, operator: Operator, access: Access) -> Response:
    """403: a page or form this operator's role does not open; nothing was read or changed."""
    refusal = operator.principal.refusal(access)
    return error_page(request, 403, refusal.message, title="Not allowed for your role")


def _failure_page(request: Request, error: ApiError) -> Response:
    return error_page(request, error.status, error.message, headers=error.headers or None)


class UiRoute(APIRoute):
    """A dashboard page: signed-in operator and CSRF checked first, errors as pages, and the
    security headers on every answer."""

    public = False
    """Whether the page is served without a session (the sign-in page)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        public = self.public
        path = page_path(self.path)

        async def guarded(request: Request) -> Response:
            try:
                response = await self._answer(request, handler, public, path)
            except SignInRequired:
                response = _sign_in_again(request)
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return guarded

    @staticmethod
    async def _answer(
        request: Request,
        handler: Callable[[Request], Coroutine[Any, Any, Response]],
        public: bool,
        path: str,
    ) -> Response:
        try:
            if not public:
                operator = await signed_in(request)
                access = access_for(UI_RULES, request.method, path)
                if not operator.principal.may(access):
                    return _refused(request, operator, access)
                if request.method not in ("GET", "HEAD"):
                    await check_csrf(request, operator)
            return await handler(request)
        except SignInRequired:
            raise
        except CsrfRefused:
            return error_page(
                request,
                403,
                "This form was refused: its CSRF token is missing or does not belong to your "
                "session (an old tab, or a page from another site). Nothing was changed; reload "
                "the page and try again.",
                title="Form refused (CSRF)",
            )
        except ApiError as exc:
            return _failure_page(request, exc)
        except DomainError as exc:
            return _failure_page(request, domain_error(exc))
        except RequestValidationError as exc:
            return _failure_page(request, invalid_request(exc))
        except SQLAlchemyError as exc:
            return _failure_page(request, database_error(exc))
        except MultiPartException as exc:
            return error_page(request, 400, f"the form could not be read: {exc.message}")
        except HTTPException as exc:
            return _failure_page(request, http_error(exc))


class PublicRoute(UiRoute):
    """A dashboard route served without a session (the sign-in page)."""

    public = True


async def _operator(request: Request) -> Operator:
    return await signed_in(request)


async def _csrf(request: Request, operator: Annotated[Operator, Depends(_operator)]) -> None:
    if request.method not in ("GET", "HEAD"):
        await check_csrf(request, operator)


def _session(state: StateDep) -> Iterator[Session]:
    # A plain generator: FastAPI runs it in the thread pool (closing never blocks the loop).
    with state.session_factory() as session:
        yield session


@dataclass(frozen=True, slots=True)
class Page:
    """``?limit=`` (default 50, at most 200) and ``?offset=`` of a list page."""

    limit: int
    offset: int


def _page(
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> Page:
    return Page(limit, offset)


OperatorDep = Annotated[Operator, Depends(_operator)]
"""The signed-in operator (no session: the browser goes to ``/ui/login``)."""

CsrfDep = Annotated[None, Depends(_csrf)]
"""Declared by every POST handler: the session's CSRF token was sent (403 otherwise)."""

SessionDep = Annotated[Session, Depends(_session)]
"""A database session; a change runs in ``with session.begin():``."""

PageDep = Annotated[Page, Depends(_page)]


@dataclass(frozen=True, slots=True)
class Change:
    """What a POST that changes something needs, as one parameter: every such handler took the
    same four (and the CSRF check), and the change flow (:mod:`gateway.app.ui.resource`) takes
    them together."""

    request: Request
    operator: Operator
    session: Session
    state: GatewayState


async def _change(
    request: Request, operator: OperatorDep, _: CsrfDep, session: SessionDep, state: StateDep
) -> Change:
    return Change(request, operator, session, state)


ChangeDep = Annotated[Change, Depends(_change)]
"""A signed-in, CSRF-checked POST's request, operator, database session and gateway state."""
