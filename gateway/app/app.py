"""``create_app``: the gateway's FastAPI application and everything it owns for its lifetime.

The lifespan builds the :class:`GatewayState` (database, secret, auth cache, backend pool with
its probes, rate limiter, admission queue, usage writer, metrics) and tears it down in reverse:
the usage writer is closed last among the request-path objects, so every record submitted
before shutdown is written. Where ``metrics_addr`` is set, the lifespan also runs the operator
listener that serves ``/metrics`` (:mod:`gateway.app.operator`); the API port never does.

The OpenAPI document describes `/v1` as it is served although FastAPI parses none of it: the
proxy reads the raw body and headers itself (:mod:`gateway.app.proxy`), so the request bodies,
the SLO headers, the bearer scheme and both 200 answers (JSON, or an SSE stream) are written
into the operations (``openapi_extra``, ``responses``) and their schemas added from
:mod:`gateway.app.schemas` (:func:`document_v1`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.app import shared_state
from gateway.app.auth import AuthCache
from gateway.app.backends import BackendPool, BackendSpec, ModelGroup
from gateway.app.data_plane import (
    DataPlaneEndpoint,
    GatewayApp,
    bounded_receive,
    encoding_refused,
    too_large,
)
from gateway.app.docs import install_docs
from gateway.app.drain import Drain, DrainMiddleware
from gateway.app.durability import DurabilityExporter, database_readiness
from gateway.app.kinds import (
    UNKNOWN_WORKFLOW,
    WORKFLOW_DEADLINE_HEADER,
    WORKFLOW_EXPIRED,
    WORKFLOW_ID_HEADER,
    WORKFLOW_ID_PATTERN,
    RequestKinds,
)
from gateway.app.metrics import GatewayMetrics
from gateway.app.operator import metrics_listener
from gateway.app.patterns import WorkflowPatterns
from gateway.app.proxy import Kind
from gateway.app.schemas import (
    ChatBody,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionBody,
)
from gateway.app.shared_state import SharedFile
from gateway.app.shedding import dispatch_gate
from gateway.app.slo import DEADLINE_HEADER, TPOT_HEADER, TTFT_HEADER
from gateway.app.state import GatewayState, StateDep
from gateway.app.upstream import Upstream
from gateway.app.workflows import make_workflow_store
from gateway.bounds import MAX_SLO_MS, MIN_SLO_MS
from gateway.db.security import server_secret
from gateway.db.session import make_engine, make_session_factory
from gateway.db.usage import UsageWriter
from gateway.errors import (
    ApiError,
    database_error,
    error_responses,
    http_error,
    invalid_request,
)
from gateway.heap import freeze_startup_objects
from gateway.limits import AdmissionQueue, AdmissionRejected, make_rate_limiter
from gateway.limits.shared import SharedLimitTable
from gateway.settings import Settings, get_settings
from gateway.worker_limits import per_worker_limits
from priority.patterns import PatternHistory

log = logging.getLogger(__name__)

LAST_USED_FLUSH_S = 5.0
"""How often keys' ``last_used_at`` is written (in one UPDATE, off the request path)."""
BACKEND_REFRESH_S = 5.0
"""How often the backends table is compared with what is served (a change made through another
worker, replica or the CLI takes effect within this)."""


def create_app(
    settings: Settings | None = None, *, backends: Sequence[BackendSpec] | None = None
) -> FastAPI:
    """The gateway app. ``backends`` replaces the database's backends table (``tiergate serve``
    with in-process emulated engines, and tests); without it the enabled rows are served."""
    config = settings if settings is not None else get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state, background = await _start(config, backends)
        app.state.gateway = state
        try:
            async with metrics_listener(state, config.metrics_addr, app.state.drain) as listener:
                app.state.metrics_listener = listener
                freeze_startup_objects()
                yield
        finally:
            await _stop(state, background)

    app = GatewayApp(
        title="tiergate gateway",
        summary="SLO-aware multi-tenant gateway for OpenAI-compatible LLM engines",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's /docs loads Swagger UI from a CDN: install_docs, below
        redoc_url=None,
    )
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes)
    app.state.settings = config  # what a server of this app reads (GatewayThread: http_options)
    app.state.drain = Drain()  # graceful shutdown (gateway.graceful): readiness, in flight
    app.add_middleware(DrainMiddleware, drain=app.state.drain)
    _install_error_handlers(app)
    _add_routes(app)
    admin = _admin_router()
    if admin is not None:
        app.include_router(admin, prefix="/admin/v1")
    if config.ui:  # the admin dashboard: /ui, its static files, / redirects there
        from gateway.app.ui import mount_ui

        mount_ui(app)
    _install_openapi(app)
    install_docs(app)  # /docs from vendored assets: works without internet
    return app


def _admin_router() -> Any:
    try:
        module = importlib.import_module("gateway.app.admin")
    except ModuleNotFoundError as exc:
        if exc.name != "gateway.app.admin":
            raise
        return None
    return module.build_admin_router()


async def _start(
    config: Settings, backends: Sequence[BackendSpec] | None
) -> tuple[GatewayState, list[asyncio.Task[None]]]:
    engine = make_engine(config.database_url)
    factory = make_session_factory(engine)
    secret = await asyncio.to_thread(server_secret, config)
    metrics = GatewayMetrics(
        max_tenants=config.metrics_max_tenants, tenant_labels=config.metrics_tenant_labels
    )
    upstream = Upstream(
        read_timeout_s=config.upstream_timeout_s,
        connect_timeout_s=config.upstream_connect_timeout_s,
        ca_file=config.upstream_ca_file,
    )
    pool = BackendPool(config, upstream, metrics, session_factory=factory, specs=backends)
    await pool.reload()
    queue = AdmissionQueue(
        max_in_flight=config.max_in_flight or max(1, pool.capacity),
        max_queued=config.max_queued,
        ready=dispatch_gate(pool, config.dispatch_horizon_s),  # overload: backlog kept here
    )
    if config.max_in_flight is None:
        pool.on_capacity = lambda capacity: queue.set_max_in_flight(max(1, capacity))
    lengths = await _length_model(config)
    learning = None
    if config.lengths_learn:  # the gateway learns its length model from its traffic
        from gateway.app.length_learning import start_learning

        learning = await start_learning(config, factory, secret, metrics, lengths)
    state = GatewayState(
        settings=config,
        session_factory=factory,
        secret=secret,
        auth=AuthCache(factory, secret, ttl_s=config.auth_cache_ttl_s, stale_s=config.auth_stale_s),
        pool=pool,
        usage_writer=UsageWriter(
            factory,
            batch_size=config.usage_batch_size,
            flush_interval_s=config.usage_flush_interval_s,
            buffer_records=config.usage_buffer_records,
            spool_dir=(config.data_path / "usage-spool") if config.usage_spool_max_bytes else None,
            spool_max_bytes=config.usage_spool_max_bytes,
            request_log_days=config.request_log_days or None,
            request_log_rows=config.request_log_rows,
            trim_interval_s=config.request_log_trim_interval_s,
        ),
        limiter=per_worker_limits(
            make_rate_limiter(  # Redis outages: degraded per-process shares while Redis is away
                config.redis_url,
                prefix=config.redis_prefix,
                share=config.limits_share or config.workers or 1,
                on_change=metrics.limiter_switched,
                timeout_s=config.redis_timeout_s,
                lease_s=config.redis_lease_s,
            ),
            workers=config.workers or 1,
            shared=bool(config.redis_url),
            table=_shared_limits(config),
        ),
        queue=queue,
        metrics=metrics,
        kinds=RequestKinds(  # workflows shared through Redis when it is configured
            make_workflow_store(
                config.redis_url,
                prefix=config.redis_prefix,
                ttl_s=config.workflow_ttl_s,
                timeout_s=config.redis_timeout_s,
                table=_shared_workflows(),
            ),
            lengths=lengths,
            length_budget_s=config.length_budget_ms / 1e3,
            on_degraded=metrics.workflow_call_degraded,
            learn=learning is not None,
            patterns=_workflow_patterns(config),
        ),
        length_samples=learning[0] if learning is not None else None,
    )
    pool.start()
    loop = asyncio.get_running_loop()
    background = [loop.create_task(_flush_last_used(state))]
    exporter = DurabilityExporter(metrics, state.usage_writer, state.auth)  # database outages
    background.append(loop.create_task(exporter.run()))
    background.append(loop.create_task(state.auth.keep_warm()))  # keys in use, for outages
    if backends is None:  # scale out: other workers' (and the CLI's) backend changes
        background.append(loop.create_task(_refresh_backends(state)))
    if learning is not None:
        background.append(loop.create_task(learning[1].run()))
    return state, background


def _shared_limits(config: Settings) -> SharedLimitTable | None:
    """The limits below the worker count, counted once for this supervisor's workers."""
    shared = shared_state.joined()
    if shared is None or config.redis_url:
        return None
    return SharedLimitTable(shared.limits, shared.workers, slot=shared.slot)


def _shared_workflows() -> SharedFile | None:
    """The workflow table this supervisor's workers share (None: one process)."""
    shared = shared_state.joined()
    return None if shared is None else shared.workflows


def _model_card(group: ModelGroup) -> dict[str, Any]:
    """A served model as OpenAI's ``/v1/models`` describes one."""
    return {"id": group.model, "object": "model", "created": group.created, "owned_by": "tiergate"}


def _workflow_patterns(config: Settings) -> WorkflowPatterns | None:
    """The per-process history of finished workflows (``TIERGATE_WORKFLOW_HISTORY`` graphs),
    or None when the operator turned it off (every call the cold start)."""
    if config.workflow_history == 0:
        return None
    return WorkflowPatterns(PatternHistory(config.workflow_history), grace_s=config.workflow_ttl_s)


async def _length_model(config: Settings) -> Any:
    """The output-length predictor of ``TIERGATE_LENGTH_MODEL``, or None: without
    one no length distribution is sent. A model that does not load stops the start-up: an
    operator who set it wants it, not silently nothing. While learning
    (``TIERGATE_LENGTHS_LEARN``) the handle exists without a model, for the first trained one."""
    if config.length_model is None and not config.lengths_learn:
        return None
    from priority.lengths.serving import PredictorHandle

    handle = PredictorHandle()
    if config.length_model is None:
        return handle
    version = await asyncio.to_thread(handle.load, config.length_model.expanduser())
    log.info("length model %s loaded from %s", version, config.length_model)
    return handle


async def _stop(state: GatewayState, background: list[asyncio.Task[None]]) -> None:
    for task in background:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await state.pool.stop()
    await state.pool.upstream.aclose()
    await asyncio.to_thread(state.usage_writer.close)
    if state.length_samples is not None:
        await asyncio.to_thread(state.length_samples.close)
    with contextlib.suppress(Exception):
        await asyncio.to_thread(state.auth.flush_last_used)
    await state.limiter.aclose()
    await state.budgets.aclose()  # its Redis client, when shared
    await state.kinds.aclose()
    bind = state.session_factory.kw.get("bind")
    if bind is not None:
        bind.dispose()


async def _refresh_backends(state: GatewayState) -> None:
    while True:
        await asyncio.sleep(BACKEND_REFRESH_S)
        try:
            if await state.pool.refresh():
                log.info("backends changed in the database: pool reloaded")
        except Exception as exc:  # the database may be briefly unavailable: keep what we have
            log.warning("could not re-read the backends: %s", type(exc).__name__)


async def _flush_last_used(state: GatewayState) -> None:
    while True:
        await asyncio.sleep(LAST_USED_FLUSH_S)
        try:
            await asyncio.to_thread(state.auth.flush_last_used)
        except Exception as exc:  # the database may be briefly unavailable: try next round
            log.warning("could not record keys' last use: %s", type(exc).__name__)


# ---- routes -----------------------------------------------------------------------------

GENERATION_ERROR_TEXT: dict[int | str, str] = {
    400: "invalid request: not JSON, a wrong type, a missing field, a value out of range, a "
    "malformed SLO or workflow header; `param` names the field. A workflow id the gateway "
    f"does not know, without `{WORKFLOW_DEADLINE_HEADER}`: `{UNKNOWN_WORKFLOW}`. Also the "
    "engine's own 400s, in this dialect (`code`: the engine's, else `invalid_request`)",
    401: "missing, unknown, revoked or expired API key",
    404: "no backend serves the model",
    409: f"`{WORKFLOW_EXPIRED}`: the workflow `{WORKFLOW_ID_HEADER}` names is past its "
    "deadline (start a new one under a new id)",
    413: "request body too large",
    415: "`unsupported_content_encoding`: a compressed body (send it uncompressed)",
    429: "a tenant limit (`x-tiergate-reject-reason`, `retry-after`) or the admission queue",
    503: "no backend can serve the request in time (a latency request: its first token by its "
    "TTFT; a deadline, compound or best-effort one: its last token by its deadline), or every "
    "attempt failed",
    "4XX": "any other refusal by the engine: its status and message, in this dialect",
}
GENERATION_ERRORS = error_responses(GENERATION_ERROR_TEXT)

V1_SECURITY = "api key"
"""The `/v1` bearer scheme's name in OpenAPI (the admin API's is ``admin key``)."""
_SECURITY_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "A tenant's API key (`tiergate keys create`, `POST /admin/v1/keys`).",
}
V1_SCHEMAS: tuple[tuple[type[BaseModel], JsonSchemaMode], ...] = (
    (ChatBody, "validation"),
    (CompletionBody, "validation"),
    (ChatCompletion, "serialization"),
    (ChatCompletionChunk, "serialization"),
    (Completion, "serialization"),
)
"""The `/v1` shapes :func:`document_v1` adds to the OpenAPI components (with their parts)."""
_SLO_HEADERS = {
    TTFT_HEADER: "The objective for the time to the first token",
    TPOT_HEADER: "The objective for the time per output token after the first",
    DEADLINE_HEADER: "The deadline for the whole answer (its last token); the request is then "
    "a `deadline` request, admitted if it can still finish by it",
}
_WORKFLOW_HEADERS: dict[str, tuple[str, dict[str, Any]]] = {
    WORKFLOW_ID_HEADER: (
        "Names the agent workflow (per tenant) this call belongs to: the request is a "
        "`compound` call, scheduled within the workflow's deadline. An id the gateway does not "
        f"know, without `{WORKFLOW_DEADLINE_HEADER}`, is 400 `{UNKNOWN_WORKFLOW}`; a call after "
        f"the workflow's deadline is 409 `{WORKFLOW_EXPIRED}`",
        {"type": "string", "pattern": f"^{WORKFLOW_ID_PATTERN.pattern}$"},
    ),
    WORKFLOW_DEADLINE_HEADER: (
        "The workflow's end-to-end deadline, in milliseconds from its first call's arrival: set "
        "by that call (a tier may refuse a tighter one), ignored on later calls. Only with "
        f"`{WORKFLOW_ID_HEADER}`",
        {"type": "number", "minimum": MIN_SLO_MS, "maximum": MAX_SLO_MS},
    ),
}
"""The headers of request kinds beyond the SLO headers (:mod:`gateway.app.kinds`)."""


def _component(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _sse_event(chunk: str) -> dict[str, Any]:
    """One event of a streamed answer, as OpenAPI 3.1 tools read an event stream's ``schema``
    (OpenAPI 3.2's ``itemSchema``): its ``data`` is ``[DONE]`` (the last), or the JSON of a
    ``chunk``, or of an error (the stream then ends)."""
    payload = {"anyOf": [_component(chunk), _component("ErrorOut")]}
    return {
        "type": "object",
        "description": f"One server-sent event, `data: <JSON>`: a `{chunk}`, then `data: "
        "[DONE]`. An error after the stream started is an `ErrorOut` event, and the stream "
        "ends.",
        "properties": {
            "data": {
                "type": "string",
                "if": {"const": "[DONE]"},
                "else": {"contentMediaType": "application/json", "contentSchema": payload},
            },
            "event": {"type": "string"},
        },
        "required": ["data"],
    }


def _examples(request: dict[str, Any]) -> dict[str, Any]:
    """A request body's OpenAPI examples: ``request`` answered whole, and streamed."""
    streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
    return {
        "whole": {"summary": "The answer in one JSON object", "value": request},
        "streamed": {"summary": "The answer as server-sent events", "value": streamed},
    }


CHAT_EXAMPLE = {
    "model": "qwen2-7b",
    "messages": [{"role": "user", "content": "Name three rivers."}],
    "max_tokens": 64,
}
COMPLETION_EXAMPLE = {"model": "qwen2-7b", "prompt": "Three rivers:", "max_tokens": 64}


def _generation_docs(body: str, answer: str, chunk: str, example: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI of a generation endpoint that FastAPI cannot infer (the proxy parses the
    raw request): the body (with an example of each answer's request), the SLO and workflow
    headers, the bearer scheme, and the 200 answer — JSON, or with ``"stream": true`` an SSE
    stream."""
    headers = [
        {
            "name": name,
            "in": "header",
            "required": False,
            "description": f"{what}, in milliseconds (default: the tier's; a tier may "
            "refuse a tighter one)",
            "schema": {"type": "number", "minimum": MIN_SLO_MS, "maximum": MAX_SLO_MS},
        }
        for name, what in _SLO_HEADERS.items()
    ]
    headers += [
        {"name": name, "in": "header", "required": False, "description": what, "schema": schema}
        for name, (what, schema) in _WORKFLOW_HEADERS.items()
    ]
    ok = {
        "description": 'The completion: JSON, or with `"stream": true` a stream of '
        "server-sent events. The engine's answer, relayed.",
        "content": {
            "application/json": {"schema": _component(answer)},
            "text/event-stream": {"schema": _sse_event(chunk)},
        },
    }
    return {
        "responses": {200: ok, **GENERATION_ERRORS},
        "openapi_extra": {
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": _component(body),
                        "examples": _examples(example),
                    }
                },
            },
            "parameters": headers,
            "security": [{V1_SECURITY: []}],
        },
    }


def document_v1(openapi: dict[str, Any]) -> None:
    """Add what the `/v1` operations refer to to ``openapi``'s components: the schemas of
    :data:`V1_SCHEMAS` and the bearer scheme. A name FastAPI already gave another schema is an
    error (two models of one name), not a silent overwrite."""
    _, defs = models_json_schema(V1_SCHEMAS, ref_template="#/components/schemas/{model}")
    components = openapi.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name, schema in defs.get("$defs", {}).items():
        if schemas.setdefault(name, schema) != schema:
            raise RuntimeError(f"two OpenAPI schemas are named {name!r}")
    components.setdefault("securitySchemes", {})[V1_SECURITY] = _SECURITY_SCHEME


def _install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (and ``/openapi.json``) include :func:`document_v1`'s additions."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document_v1(generate())  # FastAPI caches the document it returns: amend it once
        return generate()

    app.openapi = openapi  # type: ignore[method-assign]


def _add_routes(app: GatewayApp) -> None:
    # the data plane, answered ahead of the middleware stack (gateway.app.data_plane)
    generation: tuple[tuple[str, Kind, str, str, dict[str, Any]], ...] = (
        (
            "/v1/chat/completions",
            "chat",
            "chat_completions",
            "Chat completion (SSE or JSON)",
            _generation_docs("ChatBody", "ChatCompletion", "ChatCompletionChunk", CHAT_EXAMPLE),
        ),
        (
            "/v1/completions",
            "completions",
            "completions",
            "Text completion (SSE or JSON)",
            _generation_docs("CompletionBody", "Completion", "Completion", COMPLETION_EXAMPLE),
        ),
    )
    drain, limit = app.state.drain, app.state.settings.max_body_bytes
    for path, kind, name, summary, docs in generation:
        endpoint = DataPlaneEndpoint(app, kind, drain, limit)
        app.serve_data_plane(path, endpoint)
        app.document(path, name=name, tags=["openai"], summary=summary, **docs)

    @app.get(
        "/v1/models",
        tags=["openai"],
        summary="Models served by the configured backends",
        responses=error_responses({401: GENERATION_ERROR_TEXT[401]}),
        openapi_extra={"security": [{V1_SECURITY: []}]},
    )
    async def models(request: Request, state: StateDep) -> dict[str, Any]:
        await state.auth.authenticate(request.headers.get("authorization"))
        return {"object": "list", "data": [_model_card(g) for g in state.pool.groups.values()]}

    @app.get(
        "/v1/models/{model:path}",  # a model id may hold a "/" (``Qwen/Qwen2-7B-Instruct``)
        tags=["openai"],
        summary="One model served by the configured backends",
        responses=error_responses(
            {401: GENERATION_ERROR_TEXT[401], 404: "`model_not_found`: no backend serves it"}
        ),
        openapi_extra={"security": [{V1_SECURITY: []}]},
    )
    async def model(model: str, request: Request, state: StateDep) -> dict[str, Any]:
        await state.auth.authenticate(request.headers.get("authorization"))
        group = state.pool.group(model)
        if group is None:
            raise ApiError(  # not echoed: a path is no place to repeat what a client sent
                404,
                "No backend serves this model; GET /v1/models lists the models served.",
                code="model_not_found",
                param="model",
            )
        return _model_card(group)

    @app.get("/health/liveliness", tags=["health"], summary="The process is up")
    async def liveliness() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health/readiness", tags=["health"], summary="Database and a backend reachable")
    async def readiness(request: Request, state: StateDep) -> JSONResponse:
        if request.app.state.drain.draining:  # shutting down: send new work elsewhere
            return JSONResponse({"status": "draining"}, status_code=503)
        # database outage: an unreachable database is "degraded", not unready, while keys in use can
        # still be served from the cache (gateway.app.durability)
        db_serves, db_fields = await database_readiness(state)
        healthy = [b.name for b in state.pool.backends if b.view.healthy]
        ready = db_serves and bool(healthy)
        body = {
            "status": "ok" if ready else "unavailable",
            **db_fields,
            "healthy_backends": healthy,
            "backends": len(state.pool.backends),
            # Redis outages: "redis" | "degraded-local" (Redis away: per-process shares; still
            # serving, so still ready) | "local" (no Redis configured)
            "limits": state.limiter.mode,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        # Not on the API port: the exposition is the operator's (gateway.app.operator). A 404
        # that says where it went, for a scrape configured before the metrics moved.
        raise ApiError(
            404,
            "Metrics are not served on the API port; they are on the operator listener "
            "(TIERGATE_METRICS_ADDR, tiergate serve --metrics-addr).",
            code="not_found",
        )


# ---- errors -----------------------------------------------------------------------------


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(AdmissionRejected)
    async def _rejected(_: Request, exc: AdmissionRejected) -> JSONResponse:
        return ApiError.from_rejection(exc).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return invalid_request(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return http_error(exc).response()

    @app.exception_handler(SQLAlchemyError)
    async def _database(_: Request, exc: SQLAlchemyError) -> JSONResponse:
        # 409/503/500 in the dialect, never Starlette's plain-text 500 and logged traceback
        return database_error(exc).response()


# ---- body size --------------------------------------------------------------------------


class BodySizeLimit:
    """Answer 413 to request bodies over ``max_bytes`` (and 415 to compressed ones) before any
    handler reads them
    (:func:`~gateway.app.data_plane.bounded_receive`; the data plane's endpoints check the
    same themselves, ahead of this middleware)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        refused = encoding_refused(scope)
        if refused is not None:  # compressed: 415 (encoding_refused says why)
            await refused.response()(scope, receive, send)
            return
        bounded = await bounded_receive(scope, receive, self.max_bytes)
        if bounded is None:
            await too_large(self.max_bytes).response()(scope, receive, send)
            return
        await self.app(scope, bounded, send)
