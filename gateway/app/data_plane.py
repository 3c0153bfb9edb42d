"""The two generation endpoints, answered ahead of the app's middleware stack.

Every request used to pass some twelve ASGI layers before reaching :func:`~gateway.app.proxy.serve`
— FastAPI's app and telemetry, Starlette's error, exception and routing layers, the body limit,
the drain tracker, the router, the route — each a coroutine frame that every resumption of the
request's task walks again, four of them wrapping every chunk sent. cProfile of the gateway at
100 streamed requests/s put about a tenth of its CPU in those layers. :class:`GatewayApp`
answers ``POST /v1/chat/completions`` and ``POST /v1/completions`` before any of them, and
:class:`DataPlaneEndpoint` does what they did for these two routes, and nothing more:

* counts the request in flight for the graceful shutdown (:class:`~gateway.app.drain.Drain`);
* bounds the body (:func:`bounded_receive`, the same rule as ``BodySizeLimit``) and refuses
  a compressed one (:func:`encoding_refused`, the same rule too);
* turns an exception into the gateway's error dialect through the app's own exception
  handlers — and one nobody handles into a 500 in the same dialect, never a plain-text one.

Each endpoint is the one handler of its path. It is also in the app's router, so that what the
exact match here does not take (another method) is answered there — a 405 through the app's
exception handlers; and it is described in the OpenAPI document by a route kept out of the
router (:meth:`GatewayApp.document`), since FastAPI documents only its own routes.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from gateway.app.drain import Drain, InFlight
from gateway.app.proxy import Kind, serve
from gateway.errors import ApiError

log = logging.getLogger(__name__)


class GatewayApp(FastAPI):
    """FastAPI, with the data plane's two routes matched before the middleware stack."""

    data_plane: dict[str, DataPlaneEndpoint]
    documented: list[BaseRoute]
    """Routes that only describe, in OpenAPI, a path the data plane serves."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_plane = {}
        self.documented = []

    def serve_data_plane(self, path: str, endpoint: DataPlaneEndpoint) -> None:
        """Answer ``POST path`` with ``endpoint`` ahead of the middleware stack; other methods
        reach the router, which answers 405."""
        self.data_plane[path] = endpoint
        self.router.routes.append(Route(path, endpoint, methods=["POST"], include_in_schema=False))

    def document(self, path: str, **operation: Any) -> None:
        """Describe ``POST path`` in OpenAPI (``operation``: :class:`APIRoute`'s keywords)."""
        self.documented.append(APIRoute(path, _documented_only, methods=["POST"], **operation))

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document, with the :attr:`documented` operations first."""
        if not self.documented:
            return super().openapi()
        if self.openapi_schema is None:
            self.openapi_schema = get_openapi(
                title=self.title,
                version=self.version,
                openapi_version=self.openapi_version,
                summary=self.summary,
                description=self.description,
                terms_of_service=self.terms_of_service,
                contact=self.contact,
                license_info=self.license_info,
                routes=[*self.documented, *self.routes],
                webhooks=self.webhooks.routes,
                tags=self.openapi_tags,
                servers=self.servers,
                separate_input_output_schemas=self.separate_input_output_schemas,
                external_docs=self.openapi_external_docs,
            )
        return self.openapi_schema

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.data_plane.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class DataPlaneEndpoint:
    """One generation endpoint as a bare ASGI app (see the module docstring)."""

    def __init__(self, app: FastAPI, kind: Kind, drain: Drain, max_body_bytes: int) -> None:
        self.app = app
        self.kind: Kind = kind
        self.drain = drain
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        drain = self.drain
        request = InFlight(send)
        drain.taken += 1
        drain.requests.add(request)
        send = request.send
        try:
            refused = encoding_refused(scope)
            if refused is not None:
                await refused.response()(scope, receive, send)
                return
            bounded = await bounded_receive(scope, receive, self.max_body_bytes)
            if bounded is None:
                await too_large(self.max_body_bytes).response()(scope, receive, send)
                return
            http = Request(scope, bounded, send)
            try:
                response = await serve(self.app.state.gateway, http, self.kind)
                await response(scope, bounded, send)
            except Exception as exc:
                if request.started:  # a response is under way: nothing else can be said
                    raise
                answer = await self._answer(http, exc)
                await answer(scope, bounded, send)
        finally:
            drain.requests.discard(request)

    async def _answer(self, http: Request, exc: Exception) -> Response:
        """What the app's exception handlers answer for ``exc``; a 500 in the gateway's
        dialect (logged) when none handles it."""
        handlers = self.app.exception_handlers
        for kind in type(exc).__mro__:
            handler = handlers.get(kind)
            if handler is not None:
                answer = handler(http, exc)
                return await answer if inspect.isawaitable(answer) else answer
        log.error("unhandled error on %s", http.url.path, exc_info=exc)
        error = ApiError(500, "The gateway failed to handle this request.", code="internal_error")
        return error.response()


async def _documented_only() -> Response:
    # the endpoint of a GatewayApp.document route, which is never in the router (no docstring:
    # FastAPI would publish it as the operation's description)
    raise RuntimeError("a documentation-only route was served")


def too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"Request body too large: the limit is {max_bytes} bytes.",
        code="request_too_large",
    )


def encoding_refused(scope: Scope) -> ApiError | None:
    """415 for a body sent with a ``Content-Encoding`` other than ``identity`` (RFC 7694), in
    the dialect and with ``Accept-Encoding: identity``; None for a plain body.

    Refused rather than decoded: a compressed body's size says nothing of what it inflates to,
    so every endpoint would need a second, decoded bound; clients of an OpenAI-style API send
    plain JSON. Before this, the JSON parser met the gzip bytes and answered a misleading 400
    about a "utf-8 codec"."""
    for name, value in scope.get("headers", ()):
        if name != b"content-encoding":
            continue
        codings = [c.strip().lower() for c in value.decode("latin-1").split(",")]
        if any(c and c != "identity" for c in codings):
            shown = value.decode("latin-1")[:64]
            return ApiError(
                415,
                f"Content-Encoding {shown!r} is not accepted: send the request body "
                "uncompressed (no Content-Encoding, or identity).",
                code="unsupported_content_encoding",
                param="content-encoding",
                headers={"accept-encoding": "identity"},
            )
    return None


async def bounded_receive(scope: Scope, receive: Receive, max_bytes: int) -> Receive | None:
    """``receive`` for a body of at most ``max_bytes``; None for one over it.

    A declared ``content-length`` is checked at once and the body left unread; a chunked body
    is read up to the limit, then replayed to the app."""
    declared = _content_length(scope)
    if declared is not None:
        return receive if declared <= max_bytes else None
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if size > max_bytes:
            return None
        if not message.get("more_body", False):
            break

    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return replay


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
