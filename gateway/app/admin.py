"""The admin REST API (mounted at ``/admin/v1``): tiers, tenants, keys, backends, profiles,
usage, audit.

Every route is a thin shell over :mod:`gateway.db.crud`, so the API, the CLI and the data layer
share one set of rules and every change is audited there (actor ``admin-api:<client host>``).
What this module adds is HTTP: the admin-key check, request/response models, error mapping, and
the side effects a committed change needs in the running gateway — dropping cached key
identities (so a revocation or suspension takes effect on the next request) and reloading the
backend pool.

Auth and error mapping live in :class:`AdminRoute` rather than in app-wide exception handlers:
the router then behaves the same in whatever app mounts it, and the admin key is checked before
a byte of the body is parsed (an unauthenticated caller learns nothing from validation errors).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime, timedelta
from typing import Annotated, Any, Generic, Literal, Protocol, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.app.state import GatewayState, StateDep, get_state
from gateway.db import crud
from gateway.db.errors import AlreadyExists, Conflict, DomainError, InUse, InvalidInput, NotFound
from gateway.db.identity import EffectivePolicy, effective_policy
from gateway.db.models import ApiKey, Tenant, utcnow
from gateway.db.security import display_prefix

ACTOR = "admin-api"
INT32_MAX = 2**31 - 1  # integer columns (ids, limits) are 32-bit on PostgreSQL
DEFAULT_USAGE_HOURS = 24.0
MAX_USAGE_HOURS = 24.0 * 366 * 100  # a century: beyond it timedelta arithmetic overflows
MAX_AUDIT_ROWS = 1000

RowT = TypeVar("RowT")
ItemT = TypeVar("ItemT")
OutT = TypeVar("OutT")


class _Versioned(Protocol):
    """A row whose ``updated_at`` moves when a change is written (tiers, backends)."""

    @property
    def id(self) -> int: ...

    @property
    def updated_at(self) -> datetime: ...


VersionedT = TypeVar("VersionedT", bound=_Versioned)


# -- errors -----------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    message: str
    # OpenAI's type for every client error, as the data plane answers; ``code`` tells them apart
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorOut(BaseModel):
    """OpenAI's error envelope: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorBody


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorOut(error=ErrorBody(message=message, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


_CONFLICT_CODES: tuple[tuple[type[Conflict], str], ...] = (
    (AlreadyExists, "already_exists"),
    (InUse, "in_use"),
)


def domain_error_response(exc: DomainError) -> JSONResponse:
    """404 / 409 / 422 for the data layer's errors; the message is written for the caller."""
    if isinstance(exc, NotFound):
        return error_response(404, exc.message, param=exc.param, code="not_found")
    if isinstance(exc, Conflict):
        code = next((c for t, c in _CONFLICT_CODES if isinstance(exc, t)), "conflict")
        return error_response(409, exc.message, param=exc.param, code=code)
    if isinstance(exc, InvalidInput):
        return error_response(422, exc.message, param=exc.param, code="invalid_input")
    return error_response(400, exc.message, param=exc.param, code="bad_request")


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    """400 for a body that is not JSON; 422 naming the first offending field otherwise."""
    errors = list(exc.errors())
    if not errors:  # pragma: no cover - FastAPI never raises an empty one
        return error_response(422, "invalid request", code="invalid_input")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "malformed JSON")
        position = first["loc"][1] if len(first["loc"]) > 1 else "?"
        return error_response(
            400,
            f"request body is not valid JSON: {detail} (at character {position})",
            code="invalid_json",
        )
    loc = [str(part) for part in first["loc"]]
    where = loc[0] if loc else "request"  # body | query | path | header
    # Our models are flat: the field is loc[1]; deeper parts only name union members.
    param = loc[1] if len(loc) > 1 else where
    more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    return error_response(
        422,
        f"invalid {where} field {param!r}: {first.get('msg', 'invalid value')}{more}",
        param=param,
        code=str(first.get("type", "invalid_input")),
    )


# -- auth and the route class -----------------------------------------------------------------


def _digest(value: str) -> bytes:
    # Comparing fixed-length digests keeps even the key's length out of the timing.
    return hashlib.sha256(value.encode()).digest()


def check_admin_key(request: Request) -> JSONResponse | None:
    """None if the request carries the admin key; the 401/403 response otherwise."""
    configured = get_state(request).settings.admin_key
    expected = configured.get_secret_value() if configured is not None else ""
    if not expected:
        return error_response(
            403,
            "the admin API is disabled: no admin key is configured; set the TIERGATE_ADMIN_KEY "
            "environment variable and restart the gateway",
            code="admin_api_disabled",
        )
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        _digest(token.strip()), _digest(expected)
    ):
        return error_response(
            401,
            "missing or invalid admin key: send 'Authorization: Bearer <TIERGATE_ADMIN_KEY>'",
            code="invalid_admin_key",
            headers={"www-authenticate": "Bearer"},
        )
    return None


class AdminRoute(APIRoute):
    """Checks the admin key before anything else, and answers every error OpenAI-shaped."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            denied = check_admin_key(request)
            if denied is not None:
                return denied
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return validation_error_response(exc)
            except DomainError as exc:
                return domain_error_response(exc)
            except IntegrityError:  # a concurrent change won a race the crud pre-checks missed
                return error_response(
                    409,
                    "the change conflicts with a concurrent one; re-read and retry",
                    code="conflict",
                )

        return guarded


def request_actor(request: Request) -> str:
    """``admin-api:<client host>`` for the audit log (``admin-api`` when the host is unknown)."""
    host = request.client.host if request.client is not None else None
    return f"{ACTOR}:{host}" if host else ACTOR


# -- models -----------------------------------------------------------------------------------


class _Input(BaseModel):
    """Request bodies: unknown fields and type coercion ("5" for 5) are errors, not guesses."""

    model_config = ConfigDict(extra="forbid", strict=True)


# The data layer enforces ranges (>= 1, > 0); these bounds only keep values the database
# could not store from becoming a 500.
Limit = Annotated[int, Field(le=INT32_MAX)]
RowId = Annotated[int, Field(ge=1, le=INT32_MAX)]
Ref = str | RowId  # a name, or an id


class _Output(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ListOut(BaseModel, Generic[ItemT]):
    object: Literal["list"] = "list"
    data: list[ItemT]


class DeletedOut(BaseModel):
    object: str
    id: int
    name: str
    deleted: Literal[True] = True


# Each ``*Create`` body is its ``*Update`` (every field optional) with the required fields and
# the non-null defaults restated: one list of fields per entity.


class TierUpdate(_Input):
    """Only the fields sent change; ``null`` clears an optional one (e.g. a limit)."""

    name: str | None = None
    description: str | None = None
    weight: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    deadline_ms: float | None = None
    min_ttft_ms: float | None = None
    min_tpot_ms: float | None = None
    min_deadline_ms: float | None = None
    rpm_limit: Limit | None = None
    tpm_limit: Limit | None = None
    max_concurrency: Limit | None = None
    best_effort_allowed: bool | None = None


class TierCreate(TierUpdate):
    name: str
    weight: float
    ttft_ms: float
    tpot_ms: float
    best_effort_allowed: bool = False


class TierOut(_Output):
    object: Literal["tier"] = "tier"
    id: int
    name: str
    description: str | None
    weight: float
    ttft_ms: float
    tpot_ms: float
    deadline_ms: float | None
    min_ttft_ms: float | None
    min_tpot_ms: float | None
    min_deadline_ms: float | None
    rpm_limit: int | None
    tpm_limit: int | None
    max_concurrency: int | None
    best_effort_allowed: bool
    created_at: datetime
    updated_at: datetime


class TenantUpdate(_Input):
    """Rename, move to another tier, or set/clear (``null``) overrides; status has actions."""

    name: str | None = None
    tier: Ref | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    deadline_ms: float | None = None
    rpm_limit: Limit | None = None
    tpm_limit: Limit | None = None
    max_concurrency: Limit | None = None


class TenantCreate(TenantUpdate):
    name: str
    tier: Ref
    status: str = "active"


class TenantOut(BaseModel):
    object: Literal["tenant"] = "tenant"
    id: int
    name: str
    tier: str
    tier_id: int
    status: str
    ttft_ms: float | None
    tpot_ms: float | None
    deadline_ms: float | None
    rpm_limit: int | None
    tpm_limit: int | None
    max_concurrency: int | None
    effective: EffectivePolicy  # the limits and SLOs in force (overrides over the tier's)
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, tenant: Tenant) -> TenantOut:
        return cls(
            id=tenant.id,
            name=tenant.name,
            tier=tenant.tier.name,
            tier_id=tenant.tier_id,
            status=tenant.status,
            ttft_ms=tenant.ttft_ms,
            tpot_ms=tenant.tpot_ms,
            deadline_ms=tenant.deadline_ms,
            rpm_limit=tenant.rpm_limit,
            tpm_limit=tenant.tpm_limit,
            max_concurrency=tenant.max_concurrency,
            effective=effective_policy(tenant, tenant.tier),
            created_at=tenant.created_at,
            updated_at=tenant.updated_at,
        )


# JSON has no datetime type: these must be parsed from ISO 8601 strings, hence not strict.
Expiry = Annotated[AwareDatetime | None, Field(strict=False)]


class KeyUpdate(_Input):
    name: str | None = None
    expires_at: Expiry = None


class KeyCreate(KeyUpdate):
    tenant: Ref


class KeyOut(BaseModel):
    """A key's metadata. The plaintext is never part of it (see :class:`CreatedKeyOut`)."""

    object: Literal["api_key"] = "api_key"
    id: int
    prefix: str  # "tg-<prefix8>": enough for a human to recognise the key, useless to use it
    tenant: str
    tenant_id: int
    name: str | None
    status: Literal["active", "revoked", "expired"]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, key: ApiKey, now: datetime | None = None) -> KeyOut:
        return cls(**_key_fields(key, now))


class CreatedKeyOut(KeyOut):
    """The response to creating a key: the only time the plaintext ``key`` is ever shown."""

    key: str

    @classmethod
    def of_created(cls, created: crud.CreatedKey) -> CreatedKeyOut:
        return cls(**_key_fields(created.api_key, None), key=created.plaintext)


def _key_fields(key: ApiKey, now: datetime | None) -> dict[str, Any]:
    now = now or utcnow()
    status: str = "active"
    if key.revoked_at is not None and key.revoked_at <= now:
        status = "revoked"
    elif key.expires_at is not None and key.expires_at <= now:
        status = "expired"
    return {
        "id": key.id,
        "prefix": display_prefix(key.prefix),
        "tenant": key.tenant.name,
        "tenant_id": key.tenant_id,
        "name": key.name,
        "status": status,
        "created_at": key.created_at,
        "expires_at": key.expires_at,
        "revoked_at": key.revoked_at,
        "last_used_at": key.last_used_at,
    }


class BackendUpdate(_Input):
    name: str | None = None
    base_url: str | None = None
    model: str | None = None
    profile: str | None = None
    kind: str | None = None
    enabled: bool | None = None


class BackendCreate(BackendUpdate):
    name: str
    base_url: str
    model: str
    profile: str  # a shipped latency profile (see ``priority.profiles.available_profiles``)
    kind: str = "vllm"
    enabled: bool = True


class BackendOut(_Output):
    object: Literal["backend"] = "backend"
    id: int
    name: str
    base_url: str
    model: str
    profile: str
    kind: str
    enabled: bool
    created_at: datetime
    updated_at: datetime


class ProfileImport(_Input):
    """A profile document (as ``tiergate profile fit`` writes it), stored under ``name`` or,
    when that is absent, under the document's own ``name``."""

    document: dict[str, Any]
    name: str | None = None


class ProfileSummaryOut(BaseModel):
    """A profile a backend can name: ``shipped`` with tiergate, or ``custom`` (imported)."""

    object: Literal["latency_profile"] = "latency_profile"
    name: str
    source: Literal["shipped", "custom"]
    id: int | None  # custom profiles only
    hardware: str
    model: str
    tensor_parallel: int
    created_at: datetime | None
    created_by: str | None

    @classmethod
    def fields_of(cls, entry: crud.ProfileEntry) -> dict[str, Any]:
        row, profile = entry.row, entry.profile
        return {
            "name": entry.name,
            "source": entry.source,
            "id": row.id if row is not None else None,
            "hardware": profile.hardware,
            "model": profile.model,
            "tensor_parallel": profile.tensor_parallel,
            "created_at": row.created_at if row is not None else None,
            "created_by": row.created_by if row is not None else None,
        }

    @classmethod
    def of(cls, entry: crud.ProfileEntry) -> ProfileSummaryOut:
        return cls(**cls.fields_of(entry))


class ProfileOut(ProfileSummaryOut):
    """A profile with its whole document (coefficients, engine limits, provenance, fit)."""

    document: dict[str, Any]

    @classmethod
    def of(cls, entry: crud.ProfileEntry) -> ProfileOut:
        return cls(**cls.fields_of(entry), document=entry.profile.to_dict())


class UsageOut(BaseModel):
    """One group's totals; ``slo_attainment`` counts rejected and failed requests as misses."""

    requests: int
    ok: int
    errors: int
    rejected: int
    cancelled: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    slo_met: int
    slo_attainment: float | None
    gain: float
    ideal_gain: float
    tdg_ratio: float | None

    @staticmethod
    def fields_of(summary: crud.UsageSummary) -> dict[str, Any]:
        return {
            "requests": summary.requests,
            "ok": summary.ok,
            "errors": summary.errors,
            "rejected": summary.rejected,
            "cancelled": summary.cancelled,
            "prompt_tokens": summary.prompt_tokens,
            "completion_tokens": summary.completion_tokens,
            "total_tokens": summary.total_tokens,
            "slo_met": summary.slo_met,
            "slo_attainment": summary.slo_attainment,
            "gain": summary.gain,
            "ideal_gain": summary.ideal_gain,
            "tdg_ratio": summary.tdg_ratio,
        }


class TenantUsageOut(UsageOut):
    tenant: str | None  # None: records of tenants deleted since
    tenant_id: int | None


class TierUsageOut(UsageOut):
    tier: str | None  # the tier's name when the requests were made


class UsageReportOut(BaseModel, Generic[ItemT]):
    object: Literal["usage_report"] = "usage_report"
    since: datetime
    until: datetime | None
    data: list[ItemT]


class AuditOut(_Output):
    object: Literal["audit_entry"] = "audit_entry"
    id: int
    at: datetime
    actor: str
    action: str
    entity_type: str
    entity_id: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


# Query parameters of the reports (module level: FastAPI resolves the annotations by name).
Since = Annotated[AwareDatetime | None, Query(description="ISO 8601 with offset")]
Until = Annotated[AwareDatetime | None, Query(description="ISO 8601 with offset (exclusive)")]
Hours = Annotated[
    float | None,
    Query(gt=0, le=MAX_USAGE_HOURS, description="window length, back from until (or now)"),
]


# -- helpers ----------------------------------------------------------------------------------


def resolve(getter: Callable[[Session, int | str], RowT], session: Session, ref: int | str) -> RowT:
    """A row by name, or by id when ``ref`` is an id or an all-digit string no name matches.

    Names win: a tier may be called "2", and its name is what people type.
    """
    if isinstance(ref, int):
        return getter(session, ref)
    try:
        return getter(session, ref)
    except NotFound:
        if ref.isascii() and ref.isdigit() and 0 < int(ref) <= INT32_MAX:
            try:
                return getter(session, int(ref))
            except NotFound:
                pass
        raise


def changes_of(body: BaseModel) -> dict[str, Any]:
    """The fields a PATCH body actually sent (an explicit ``null`` included)."""
    return body.model_dump(exclude_unset=True)


def key_prefixes(tenant: Tenant) -> list[str]:
    return [key.prefix for key in tenant.api_keys]


def own_prefix(key: ApiKey) -> list[str]:
    return [key.prefix]


def invalidate(state: GatewayState, prefixes: Iterable[str] | None) -> None:
    """Drop cached identities: of these key prefixes, or all of them (``None``)."""
    if prefixes is None:
        state.auth.invalidate()
        return
    for prefix in prefixes:
        state.auth.invalidate(prefix)


def patch_row(
    s: Session,
    request: Request,
    ref: str,
    get: Callable[[Session, int | str], VersionedT],
    update: Callable[..., VersionedT],
    body: BaseModel,
) -> tuple[VersionedT, bool]:
    """Apply a PATCH body to the row ``ref`` names; the row, and whether anything was written."""
    row = resolve(get, s, ref)
    updated_at = row.updated_at
    row = update(s, row.id, changes_of(body), actor=request_actor(request))
    return row, row.updated_at != updated_at


def delete_row(
    s: Session,
    request: Request,
    delete: Callable[..., None],
    entity: str,
    row_id: int,
    name: str,
) -> DeletedOut:
    """Delete a row through its crud function; the answer names what was deleted."""
    out = DeletedOut(object=entity, id=row_id, name=name)
    delete(s, row_id, actor=request_actor(request))
    return out


def change_and_invalidate(
    state: GatewayState,
    change: Callable[[Session], RowT],
    present: Callable[[RowT], OutT],
    prefixes: Callable[[RowT], Iterable[str]],
) -> OutT:
    """Commit ``change``, then drop the cached identities of the keys it touched.

    The answer and the prefixes are read inside the transaction; the cache is dropped only
    once the change is committed, so no request can re-cache the old identity in between.
    """
    with state.session_factory.begin() as s:
        row = change(s)
        out, touched = present(row), list(prefixes(row))
    invalidate(state, touched)
    return out


def usage_window(
    since: datetime | None, until: datetime | None, hours: float | None
) -> tuple[datetime, datetime | None]:
    """``[since, until)``; ``hours`` counts back from ``until`` (default: now), 24 h if unset."""
    if hours is not None and since is not None:
        raise InvalidInput("give either since or hours, not both", param="hours")
    if since is None:
        span = hours if hours is not None else DEFAULT_USAGE_HOURS
        try:
            since = (until or utcnow()) - timedelta(hours=span)
        except OverflowError:
            raise InvalidInput("the window starts before year 1", param="hours") from None
    if until is not None and since >= until:
        raise InvalidInput("since must be before until", param="since")
    return since, until


# -- routes -----------------------------------------------------------------------------------


def build_admin_router() -> APIRouter:
    """The admin API's routes; the app mounts them at ``/admin/v1``."""
    router = APIRouter(
        route_class=AdminRoute,
        # Documents the scheme in OpenAPI; AdminRoute enforces it before the body is read.
        dependencies=[Depends(HTTPBearer(auto_error=False, scheme_name="admin key"))],
        responses={
            401: {"model": ErrorOut, "description": "missing or invalid admin key"},
            403: {"model": ErrorOut, "description": "no admin key configured"},
            404: {
                "model": ErrorOut,
                "description": "no such tier, tenant, key, backend or profile",
            },
            409: {"model": ErrorOut, "description": "name taken, or still in use"},
            422: {"model": ErrorOut, "description": "invalid input; `param` names the field"},
        },
    )
    _tier_routes(router)
    _tenant_routes(router)
    _key_routes(router)
    _backend_routes(router)
    _profile_routes(router)
    _report_routes(router)
    return router


def _tier_routes(router: APIRouter) -> None:
    @router.get("/tiers", tags=["tiers"])
    def list_tiers(state: StateDep) -> ListOut[TierOut]:
        with state.session_factory() as s:
            return ListOut(data=[TierOut.model_validate(t) for t in crud.list_tiers(s)])

    @router.post("/tiers", status_code=201, tags=["tiers"])
    def create_tier(body: TierCreate, request: Request, state: StateDep) -> TierOut:
        with state.session_factory.begin() as s:
            tier = crud.create_tier(s, actor=request_actor(request), **body.model_dump())
            return TierOut.model_validate(tier)

    @router.get("/tiers/{ref}", tags=["tiers"])
    def get_tier(ref: str, state: StateDep) -> TierOut:
        with state.session_factory() as s:
            return TierOut.model_validate(resolve(crud.get_tier, s, ref))

    @router.patch("/tiers/{ref}", tags=["tiers"])
    def update_tier(ref: str, body: TierUpdate, request: Request, state: StateDep) -> TierOut:
        with state.session_factory.begin() as s:
            tier, changed = patch_row(s, request, ref, crud.get_tier, crud.update_tier, body)
            out = TierOut.model_validate(tier)
        if changed:
            invalidate(state, None)  # every tenant on the tier has a new effective policy
        return out

    @router.delete("/tiers/{ref}", tags=["tiers"])
    def delete_tier(ref: str, request: Request, state: StateDep) -> DeletedOut:
        with state.session_factory.begin() as s:
            tier = resolve(crud.get_tier, s, ref)
            return delete_row(s, request, crud.delete_tier, "tier", tier.id, tier.name)


def _tenant_routes(router: APIRouter) -> None:
    @router.get("/tenants", tags=["tenants"])
    def list_tenants(
        state: StateDep,
        tier: Annotated[str | None, Query(description="tier name or id")] = None,
        status: Annotated[str | None, Query(description="active | suspended")] = None,
    ) -> ListOut[TenantOut]:
        with state.session_factory() as s:
            tier_id = resolve(crud.get_tier, s, tier).id if tier is not None else None
            rows = crud.list_tenants(s, tier=tier_id, status=status)
            return ListOut(data=[TenantOut.of(t) for t in rows])

    @router.post("/tenants", status_code=201, tags=["tenants"])
    def create_tenant(body: TenantCreate, request: Request, state: StateDep) -> TenantOut:
        with state.session_factory.begin() as s:
            values = body.model_dump()
            values["tier"] = resolve(crud.get_tier, s, body.tier).id
            return TenantOut.of(crud.create_tenant(s, actor=request_actor(request), **values))

    @router.get("/tenants/{ref}", tags=["tenants"])
    def get_tenant(ref: str, state: StateDep) -> TenantOut:
        with state.session_factory() as s:
            return TenantOut.of(resolve(crud.get_tenant, s, ref))

    @router.patch("/tenants/{ref}", tags=["tenants"])
    def update_tenant(ref: str, body: TenantUpdate, request: Request, state: StateDep) -> TenantOut:
        def change(s: Session) -> Tenant:
            tenant = resolve(crud.get_tenant, s, ref)
            changes = changes_of(body)
            if "tier" in changes:
                if changes["tier"] is None:
                    raise InvalidInput(
                        "a tenant must have a tier; tier cannot be null", param="tier"
                    )
                changes["tier"] = resolve(crud.get_tier, s, changes["tier"]).id
            return crud.update_tenant(s, tenant.id, changes, actor=request_actor(request))

        # overrides and tier are part of each cached identity
        return change_and_invalidate(state, change, TenantOut.of, key_prefixes)

    def _set_status(ref: str, request: Request, state: GatewayState, active: bool) -> TenantOut:
        set_status = crud.activate_tenant if active else crud.suspend_tenant

        def change(s: Session) -> Tenant:
            tenant_id = resolve(crud.get_tenant, s, ref).id
            return set_status(s, tenant_id, actor=request_actor(request))

        return change_and_invalidate(state, change, TenantOut.of, key_prefixes)

    @router.post("/tenants/{ref}/suspend", tags=["tenants"])
    def suspend_tenant(ref: str, request: Request, state: StateDep) -> TenantOut:
        """Suspend: the tenant's keys stop authenticating at once (they are kept)."""
        return _set_status(ref, request, state, active=False)

    @router.post("/tenants/{ref}/activate", tags=["tenants"])
    def activate_tenant(ref: str, request: Request, state: StateDep) -> TenantOut:
        return _set_status(ref, request, state, active=True)

    @router.delete("/tenants/{ref}", tags=["tenants"])
    def delete_tenant(ref: str, request: Request, state: StateDep) -> DeletedOut:
        """Delete a tenant and its keys; its usage records stay (tenant set to null)."""
        with state.session_factory.begin() as s:
            tenant = resolve(crud.get_tenant, s, ref)
            prefixes = key_prefixes(tenant)
            out = delete_row(s, request, crud.delete_tenant, "tenant", tenant.id, tenant.name)
        invalidate(state, prefixes)
        return out


def _key_routes(router: APIRouter) -> None:
    @router.get("/keys", tags=["keys"])
    def list_keys(
        state: StateDep,
        tenant: Annotated[str | None, Query(description="tenant name or id")] = None,
        active_only: Annotated[bool, Query(description="hide revoked and expired keys")] = False,
    ) -> ListOut[KeyOut]:
        with state.session_factory() as s:
            tenant_id = resolve(crud.get_tenant, s, tenant).id if tenant is not None else None
            now = utcnow()
            rows = crud.list_keys(s, tenant=tenant_id, active_only=active_only, now=now)
            return ListOut(data=[KeyOut.of(k, now) for k in rows])

    @router.post("/keys", status_code=201, tags=["keys"])
    def create_key(body: KeyCreate, request: Request, state: StateDep) -> CreatedKeyOut:
        """Issue a key. The response holds the plaintext ``key``: store it now, it is not kept."""
        with state.session_factory.begin() as s:
            created = crud.create_key(
                s,
                actor=request_actor(request),
                tenant=resolve(crud.get_tenant, s, body.tenant).id,
                secret=state.secret,
                name=body.name,
                expires_at=body.expires_at,
            )
            return CreatedKeyOut.of_created(created)

    @router.get("/keys/{prefix}", tags=["keys"])
    def get_key(prefix: str, state: StateDep) -> KeyOut:
        with state.session_factory() as s:
            return KeyOut.of(crud.get_key(s, prefix))

    @router.patch("/keys/{prefix}", tags=["keys"])
    def update_key(prefix: str, body: KeyUpdate, request: Request, state: StateDep) -> KeyOut:
        """Rename a key or change its expiry (a past expiry expires it now)."""

        def change(s: Session) -> ApiKey:
            return crud.update_key(s, prefix, changes_of(body), actor=request_actor(request))

        return change_and_invalidate(state, change, KeyOut.of, own_prefix)

    @router.post("/keys/{prefix}/revoke", tags=["keys"])
    def revoke_key(prefix: str, request: Request, state: StateDep) -> KeyOut:
        """Revoke a key; it stops authenticating on the next request."""

        def change(s: Session) -> ApiKey:
            return crud.revoke_key(s, prefix, actor=request_actor(request))

        return change_and_invalidate(state, change, KeyOut.of, own_prefix)

    @router.delete("/keys/{prefix}", tags=["keys"])
    def delete_key(prefix: str, request: Request, state: StateDep) -> DeletedOut:
        with state.session_factory.begin() as s:
            key = crud.get_key(s, prefix)
            bare = key.prefix
            out = delete_row(s, request, crud.delete_key, "api_key", key.id, display_prefix(bare))
        invalidate(state, [bare])
        return out


def _backend_routes(router: APIRouter) -> None:
    # Mutations are async: the pool reload is a coroutine. The database work still runs in
    # the thread pool, like the sync routes', so it never blocks the event loop.

    @router.get("/backends", tags=["backends"])
    def list_backends(
        state: StateDep,
        enabled: Annotated[bool | None, Query()] = None,
        model: Annotated[str | None, Query()] = None,
    ) -> ListOut[BackendOut]:
        with state.session_factory() as s:
            rows = crud.list_backends(s, enabled=enabled, model=model)
            return ListOut(data=[BackendOut.model_validate(b) for b in rows])

    @router.post("/backends", status_code=201, tags=["backends"])
    async def create_backend(body: BackendCreate, request: Request, state: StateDep) -> BackendOut:
        def work() -> BackendOut:
            with state.session_factory.begin() as s:
                row = crud.create_backend(s, actor=request_actor(request), **body.model_dump())
                return BackendOut.model_validate(row)

        out = await run_in_threadpool(work)
        await state.pool.reload()
        return out

    @router.get("/backends/{ref}", tags=["backends"])
    def get_backend(ref: str, state: StateDep) -> BackendOut:
        with state.session_factory() as s:
            return BackendOut.model_validate(resolve(crud.get_backend, s, ref))

    @router.patch("/backends/{ref}", tags=["backends"])
    async def update_backend(
        ref: str, body: BackendUpdate, request: Request, state: StateDep
    ) -> BackendOut:
        def work() -> tuple[BackendOut, bool]:
            with state.session_factory.begin() as s:
                row, changed = patch_row(
                    s, request, ref, crud.get_backend, crud.update_backend, body
                )
                return BackendOut.model_validate(row), changed

        out, changed = await run_in_threadpool(work)
        if changed:
            await state.pool.reload()
        return out

    @router.delete("/backends/{ref}", tags=["backends"])
    async def delete_backend(ref: str, request: Request, state: StateDep) -> DeletedOut:
        def work() -> DeletedOut:
            with state.session_factory.begin() as s:
                row = resolve(crud.get_backend, s, ref)
                return delete_row(s, request, crud.delete_backend, "backend", row.id, row.name)

        out = await run_in_threadpool(work)
        await state.pool.reload()
        return out


def _profile_routes(router: APIRouter) -> None:
    # No pool reload: a profile only takes effect through a backend naming it, and a profile
    # in use cannot be deleted.

    @router.get("/profiles", tags=["profiles"])
    def list_profiles(state: StateDep) -> ListOut[ProfileSummaryOut]:
        """Every profile a backend can name: shipped ones and imported (custom) ones."""
        with state.session_factory() as s:
            return ListOut(data=[ProfileSummaryOut.of(e) for e in crud.profile_catalog(s)])

    @router.post("/profiles", status_code=201, tags=["profiles"])
    def import_profile(body: ProfileImport, request: Request, state: StateDep) -> ProfileOut:
        """Store an operator-calibrated profile; backends can then name it."""
        with state.session_factory.begin() as s:
            row = crud.import_profile(
                s, body.document, actor=request_actor(request), name=body.name
            )
            return ProfileOut.of(crud.get_profile_entry(s, row.id))

    @router.get("/profiles/{ref}", tags=["profiles"])
    def get_profile(ref: str, state: StateDep) -> ProfileOut:
        """A custom profile by name or id, or a shipped one by name."""
        with state.session_factory() as s:
            return ProfileOut.of(resolve(crud.get_profile_entry, s, ref))

    @router.delete("/profiles/{ref}", tags=["profiles"])
    def delete_profile(ref: str, request: Request, state: StateDep) -> DeletedOut:
        """Delete a custom profile that no backend names (shipped ones cannot be deleted)."""
        with state.session_factory.begin() as s:
            row = resolve(crud.get_deletable_profile, s, ref)
            return delete_row(s, request, crud.delete_profile, "latency_profile", row.id, row.name)


def _report_routes(router: APIRouter) -> None:
    @router.get("/usage/tenants", tags=["usage"])
    def usage_by_tenant(
        state: StateDep,
        since: Since = None,
        until: Until = None,
        hours: Hours = None,
        tenant: Annotated[str | None, Query(description="tenant name or id")] = None,
    ) -> UsageReportOut[TenantUsageOut]:
        """Requests, tokens, SLO attainment and TDG ratio per tenant (default: last 24 h)."""
        start, end = usage_window(since, until, hours)
        with state.session_factory() as s:
            tenant_id = resolve(crud.get_tenant, s, tenant).id if tenant is not None else None
            rows = crud.usage_by_tenant(s, since=start, until=end, tenant=tenant_id)
        data = [
            TenantUsageOut(tenant=r.group, tenant_id=r.group_id, **UsageOut.fields_of(r))
            for r in rows
        ]
        return UsageReportOut(since=start, until=end, data=data)

    @router.get("/usage/tiers", tags=["usage"])
    def usage_by_tier(
        state: StateDep,
        since: Since = None,
        until: Until = None,
        hours: Hours = None,
        tier: Annotated[str | None, Query(description="tier name as recorded")] = None,
    ) -> UsageReportOut[TierUsageOut]:
        """The same summary per tier name as recorded at request time (default: last 24 h)."""
        start, end = usage_window(since, until, hours)
        with state.session_factory() as s:
            rows = crud.usage_by_tier(s, since=start, until=end, tier=tier)
        data = [TierUsageOut(tier=r.group, **UsageOut.fields_of(r)) for r in rows]
        return UsageReportOut(since=start, until=end, data=data)

    @router.get("/audit", tags=["audit"])
    def list_audit(
        state: StateDep,
        entity_type: Annotated[
            str | None, Query(description="tier | tenant | api_key | backend | profile")
        ] = None,
        entity_id: Annotated[str | None, Query(description="the entity's id")] = None,
        actor: Annotated[str | None, Query(description="e.g. admin-api:10.0.0.7")] = None,
        since: Since = None,
        limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_ROWS)] = 100,
    ) -> ListOut[AuditOut]:
        """Audit entries, newest first, with each change's before and after."""
        with state.session_factory() as s:
            rows = crud.list_audit(
                s,
                entity_type=entity_type,
                entity_id=entity_id,
                actor=actor,
                since=since,
                limit=limit,
            )
            return ListOut(data=[AuditOut.model_validate(r) for r in rows])
