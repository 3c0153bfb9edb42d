"""What every admin route shares: the admin-key and role guard, the database session, the
caller (its role, and the audit actor that names it).

Auth and error mapping live in :class:`AdminRoute` rather than in a dependency or app-wide
exception handlers: FastAPI parses the body before it runs any dependency, and the admin key
must be checked before a byte of the body is parsed (an unauthenticated caller learns nothing
from validation errors); and the router then answers the same in whatever app mounts it. A
database error no crud function turned into a domain error (a lost race, a lock that stayed
busy) is answered 409 or 503 by what it means, never 500 with its text
(:func:`gateway.errors.database_error`).

The raw request is checked there too, before FastAPI parses the body: its nesting, its strings
(a lone surrogate is 400 ``invalid_json``, as on ``/v1``) and a NUL character in any path
parameter, query parameter or body string (400 ``invalid_value``, :func:`nul_error`), which
PostgreSQL's text refuses and SQLite would store: both databases answer alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException

from gateway.app.admin.credentials import (
    admin_key_configured,
    credential_exists,
    identify,
    is_admin_key,
    looks_like_credential,
)
from gateway.app.admin.roles import OWNER_KEY, Principal, access_for
from gateway.app.admin.rules import API_RULES
from gateway.app.admin.schemas import TOTAL_HEADER, ListOut, PageLimit, PageOffset
from gateway.app.state import StateDep, get_state
from gateway.db.errors import DomainError
from gateway.errors import (
    ApiError,
    check_json_depth,
    check_json_text,
    database_error,
    domain_error,
    dotted,
    http_error,
    invalid_request,
    nul_character,
)
from gateway.jsonbody import nul_at

__all__ = [
    "ACTOR",
    "ActorDep",
    "AdminRoute",
    "PrincipalDep",
    "SessionDep",
    "StateDep",
    "admin_bearer",
]

ACTOR = "admin-api"
ADMIN_PREFIX = "/admin/v1"

admin_bearer = HTTPBearer(auto_error=False, scheme_name="admin key")
"""Documents the scheme in OpenAPI (as the assembled router's dependency); AdminRoute enforces
it."""


async def check_admin_key(request: Request) -> ApiError | Principal:
    """Who the request's bearer is — ``TIERGATE_ADMIN_KEY`` (an owner) or a stored operator
    credential with its role (:mod:`gateway.app.admin.credentials`) — or the 401/403 error.

    403 only while nothing could be accepted: no admin key configured and no operator
    credential stored. A credential is looked up in the database (in a thread), read-only.
    """
    state = get_state(request)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    try:
        if scheme.lower() == "bearer" and token:
            if is_admin_key(state.settings, token):
                return OWNER_KEY
            if looks_like_credential(token):
                who = await asyncio.to_thread(identify, state, token, record_use=False)
                if who is not None:
                    return who.principal
        if not admin_key_configured(state.settings) and not await asyncio.to_thread(
            credential_exists, state
        ):
            return ApiError(
                403,
                "the admin API is disabled: no admin key is configured and no operator "
                "credential exists; set the TIERGATE_ADMIN_KEY environment variable and restart "
                "the gateway, or create a credential with `tiergate admin reset-credential`",
                code="admin_api_disabled",
            )
    except SQLAlchemyError as exc:  # the credential could not be checked: say why, never 500
        return database_error(exc)
    return ApiError(
        401,
        "missing or invalid admin key: send 'Authorization: Bearer <TIERGATE_ADMIN_KEY>' or "
        "'Authorization: Bearer <operator credential>' (printed once by `tiergate serve`; "
        "`tiergate admin reset-credential` issues a new one)",
        code="invalid_admin_key",
        headers={"www-authenticate": "Bearer"},
    )


def route_path(path: str) -> str:
    """A route's path as its resource router declares it (the rule tables' key), whether or not
    the router it is in was mounted under ``/admin/v1`` already."""
    return path.removeprefix(ADMIN_PREFIX) or "/"


class AdminRoute(APIRoute):
    """Checks the admin key, then the caller's role against the route's rule
    (:mod:`gateway.app.admin.rules`), before anything else; answers every error OpenAI-shaped."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        path = route_path(self.path)

        async def guarded(request: Request) -> Response:
            who = await check_admin_key(request)
            if isinstance(who, ApiError):
                return who.response()
            access = access_for(API_RULES, request.method, path)
            if not who.may(access):
                return who.refusal(access).response()
            request.state.principal = who
            try:
                await check_raw_request(request)
                return await handler(request)
            except ApiError as exc:
                return exc.response()
            except RequestValidationError as exc:
                return invalid_request(exc).response()
            except DomainError as exc:
                return domain_error(exc).response()
            except SQLAlchemyError as exc:  # a race the crud pre-checks missed, a busy database
                return database_error(exc).response()
            except HTTPException as exc:  # e.g. FastAPI's 400 for a body that is not UTF-8
                return http_error(exc).response()

        return guarded


async def check_raw_request(request: Request) -> None:
    """Raise the 400 for what no admin route may take, before FastAPI parses the body: nesting
    its parser would recurse through, a string no encoder takes, a NUL anywhere."""
    raw = await request.body()
    check_json_depth(raw)  # first: the other checks may parse the body
    check_json_text(raw)
    denied = nul_error(request, raw)
    if denied is not None:
        raise denied


def nul_error(request: Request, raw: bytes) -> ApiError | None:
    """400 ``invalid_value`` naming the first path parameter, query parameter or body string
    (decoded: ``%00``, ``\\u0000``) with a NUL character; None if there is none.

    One check for every route, so no admin operation can hand a NUL to the database, whatever
    it does with the value (a lookup, a filter, a stored name, the audit log's JSON).
    """
    for name, value in request.path_params.items():
        if "\x00" in str(value):
            return nul_character(name)
    for name, value in request.query_params.multi_items():
        if "\x00" in name or "\x00" in value:
            return nul_character(name.replace("\x00", "\\u0000"))
    where = nul_at(raw)
    return nul_character(dotted(where)) if where is not None else None


async def request_principal(request: Request) -> Principal:
    """Who the request acts as (:class:`AdminRoute` checked it; an app mounting a handler some
    other way gets the check here)."""
    known = getattr(request.state, "principal", None)
    if isinstance(known, Principal):
        return known
    who = await check_admin_key(request)
    if isinstance(who, ApiError):
        raise who
    request.state.principal = who
    return who


async def request_actor(
    request: Request, who: Annotated[Principal, Depends(request_principal)]
) -> str:
    """``admin-api:<operator>@<client host>`` for the audit log (``admin-api:<operator>`` when
    the host is unknown): the operator is the credential's name (``admin-key`` for
    ``TIERGATE_ADMIN_KEY``).

    The host is the TCP peer's, or, behind a proxy that ``TIERGATE_TRUSTED_PROXIES`` names,
    the client it forwarded for: uvicorn resolves ``X-Forwarded-For`` before the app sees the
    request, for trusted peers only (:func:`gateway.app.http_limits.http_options`), so no
    client can choose the address the audit log records.
    """
    host = request.client.host if request.client is not None else None
    return f"{ACTOR}:{who.name}@{host}" if host else f"{ACTOR}:{who.name}"


def _session(state: StateDep) -> Iterator[Session]:
    # A plain generator: FastAPI runs it in the thread pool, so closing the session (a rollback
    # and a connection returned to the pool) never blocks the event loop.
    with state.session_factory() as session:
        yield session


PrincipalDep = Annotated[Principal, Depends(request_principal)]
"""Who the request acts as: its name, role and (a tenant admin's) tenant."""

ActorDep = Annotated[str, Depends(request_actor)]
"""Who the audit log records for a change made through this request."""

SessionDep = Annotated[Session, Depends(_session)]
"""A session for the request. Reads use it as is; a change runs in ``with session.begin():``,
so it is committed before the route drops cached identities or reloads the pool."""


ItemT = TypeVar("ItemT")


class Page:
    """A list route's page: ``limit`` rows (the whole list without it) from ``offset``. The
    answer's body keeps its shape; the whole list's count is in the ``x-total-count`` header."""

    def __init__(self, response: Response, limit: PageLimit = None, offset: PageOffset = 0) -> None:
        self.response = response
        self.limit = limit
        self.offset = offset

    def of(self, total: int, items: Iterable[ItemT]) -> ListOut[ItemT]:
        """The answer: this page's ``items``, and ``total`` in the header."""
        self.response.headers[TOTAL_HEADER] = str(total)
        return ListOut(data=list(items))


PageDep = Annotated[Page, Depends()]
"""The page a list route answers (its ``limit`` and ``offset`` query parameters)."""
