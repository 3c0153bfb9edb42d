"""The admin API's request and response shapes, one group per resource, and the reports'
query parameters.

Shapes, and the numeric bounds of :mod:`gateway.bounds` (shared with the CLI's options and the
database's CHECK constraints); the rules (references, transitions, a minimum SLO within the
default) are the data layer's (:mod:`gateway.db.crud`), shared with the CLI.

Every rule of the data layer that a value can be checked against on its own is restated on
the input models (a name's characters, a text's length, a URL's scheme, a kind or status), so
that the OpenAPI document shows it: a body valid by the schema is then refused only for what
no schema can say (a reference to a missing entity, a minimum SLO above the tier's default, an
unknown profile). The data layer keeps its own checks (the CLI goes through them), and both
answer 400 ``invalid_value`` naming the field.

Integers are JSON's: ``5.0`` is 5, as on `/v1` (:data:`gateway.app.schemas.WHOLE_NUMBER`);
``5.5``, ``"5"`` and ``true`` are the wrong type.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, TypeVar
from urllib.parse import urlsplit

from fastapi import Query
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
)
from pydantic_core import PydanticCustomError

from gateway.app.schemas import WHOLE_NUMBER, OneOf, worded
from gateway.bounds import (
    MAX_LIMIT,
    MAX_SHED_SLACK,
    MAX_SLO_MS,
    MAX_WEIGHT,
    MIN_LIMIT,
    MIN_SLO_MS,
    MIN_WEIGHT,
)
from gateway.db import crud
from gateway.db.crud._common import NAME_MAX, NAME_PATTERN, NAME_RULE
from gateway.db.crud.keys import DEFAULT_GRACE_S, MAX_GRACE_S
from gateway.db.crud.tiers import TIER_KINDS
from gateway.db.identity import EffectivePolicy, effective_policy
from gateway.db.models import BACKEND_KINDS, TENANT_STATUSES, ApiKey, Tenant, utcnow
from gateway.db.money import plain
from gateway.db.security import display_prefix

INT32_MAX = 2**31 - 1  # integer columns (ids, limits) are 32-bit on PostgreSQL
MAX_USAGE_HOURS = 24.0 * 366 * 100  # a century: beyond it timedelta arithmetic overflows
MAX_AUDIT_ROWS = 1000

ItemT = TypeVar("ItemT")


class Input(BaseModel):
    """Request bodies: unknown fields and type coercion ("5" for 5) are errors, not guesses
    (``5.0`` for 5 is no coercion: JSON has one number type)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# The bounds of every number that reaches the gain (gateway.bounds, which the database's CHECK
# constraints read too): a value outside them is refused here, 400 ``invalid_value`` naming the
# field. The data layer keeps its own rules on top (a minimum SLO above the default).
Limit = Annotated[StrictInt, Field(ge=MIN_LIMIT, le=MAX_LIMIT), WHOLE_NUMBER]
Weight = Annotated[float, Field(ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)]
SloMs = Annotated[float, Field(ge=MIN_SLO_MS, le=MAX_SLO_MS, allow_inf_nan=False)]
ShedSlack = Annotated[
    float,
    Field(
        ge=0.0,
        le=MAX_SHED_SLACK,
        allow_inf_nan=False,
        description="how late, as a fraction of the TTFT objective, a request's predicted first "
        "token may be and the request still be admitted under overload (0.25: 25% late); past "
        "it the request is refused early (503 `slo_unattainable`), or demoted to best effort "
        "where `best_effort_allowed`",
    ),
]
RowId = Annotated[StrictInt, Field(ge=1, le=INT32_MAX), WHOLE_NUMBER]
Ref = str | RowId  # a name, or an id

# The data layer's rules on text (gateway.db.crud), worded as it words them.
Name = Annotated[
    StrictStr,
    Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN.pattern),
    worded(NAME_RULE),
]
"""A tier's, tenant's, backend's or profile's name."""
Description = Annotated[StrictStr, Field(max_length=1000)]
KeyName = Annotated[StrictStr, Field(max_length=128)]

_HTTP_URL = (
    r"^[Hh][Tt][Tt][Pp][Ss]?://(?:[^/?#@\[\]]*@)?(?:[^/?#@\[\]:]+|\[[0-9A-Fa-f:.]+\])"
    r"(?::[0-9]*)?(?:[/?#]|$)"
)
"""An http(s) URL with a host (a name, an IPv4 address or a bracketed IPv6 one) and at most a
numeric port, as far as a pattern can say it; :func:`_http_url` has the last word."""


def _http_url(value: str) -> str:
    """The data layer's URL rule (an http(s) scheme and a host, as ``urlsplit`` reads them),
    where ``urlsplit``'s own ``ValueError`` (a malformed IPv6 host: ``http://[x``; a port out
    of range) is a refusal too, not an exception escaping the route."""
    try:
        parts = urlsplit(value)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # parsed lazily: raises for a port out of range
    except ValueError:
        valid = False
    if not valid:
        raise PydanticCustomError("string_pattern_mismatch", "not an http(s) URL with a host")
    return value


BaseUrl = Annotated[
    StrictStr,
    Field(max_length=512, pattern=_HTTP_URL),
    AfterValidator(_http_url),
    worded("must be an http(s) URL with a host, of at most 512 characters"),
]
ModelName = Annotated[
    StrictStr,
    Field(min_length=1, max_length=256, pattern=r"\S"),
    worded("must be a non-empty name of at most 256 characters"),
]
ProfileName = Annotated[
    StrictStr,
    Field(
        description="a shipped latency profile or an imported one (`GET /admin/v1/profiles` "
        "lists them)"
    ),
]
Kind = Annotated[StrictStr, OneOf(*BACKEND_KINDS)]
TierKind = Annotated[StrictStr, OneOf(*TIER_KINDS)]
"""A tier's default request kind (``deadline`` and ``best-effort`` need its ``deadline_ms``)."""
Status = Annotated[StrictStr, OneOf(*TENANT_STATUSES)]


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


class TierUpdate(Input):
    """Only the fields sent change; ``null`` clears an optional one (e.g. a limit)."""

    name: Name | None = None
    description: Description | None = None
    weight: Weight | None = None
    ttft_ms: SloMs | None = None
    tpot_ms: SloMs | None = None
    deadline_ms: SloMs | None = None
    min_ttft_ms: SloMs | None = None
    min_tpot_ms: SloMs | None = None
    min_deadline_ms: SloMs | None = None
    rpm_limit: Limit | None = None
    tpm_limit: Limit | None = None
    max_concurrency: Limit | None = None
    best_effort_allowed: bool | None = None
    shed_slack: ShedSlack | None = None
    default_kind: TierKind | None = None


class TierCreate(TierUpdate):
    name: Name
    weight: Weight
    ttft_ms: SloMs
    tpot_ms: SloMs
    best_effort_allowed: bool = False
    shed_slack: ShedSlack = 0.0
    default_kind: TierKind = "latency"


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
    shed_slack: float
    default_kind: str
    created_at: datetime
    updated_at: datetime


class TenantUpdate(Input):
    """Rename, move to another tier, or set/clear (``null``) overrides; status has actions."""

    name: Name | None = None
    tier: Ref | None = None
    ttft_ms: SloMs | None = None
    tpot_ms: SloMs | None = None
    deadline_ms: SloMs | None = None
    rpm_limit: Limit | None = None
    tpm_limit: Limit | None = None
    max_concurrency: Limit | None = None


class TenantCreate(TenantUpdate):
    name: Name
    tier: Ref
    status: Status = "active"


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


class KeyUpdate(Input):
    name: KeyName | None = None
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


# -- key rotation and secret status (security) ----------------------------------------------


class KeyRotate(Input):
    grace_s: Annotated[
        float, Field(ge=0, le=MAX_GRACE_S, allow_inf_nan=False, description="the old key's grace")
    ] = DEFAULT_GRACE_S
    expires_at: Expiry = None  # the new key's own expiry


class RotatedKeyOut(CreatedKeyOut):
    """The successor (with its plaintext ``key``, shown once) and the old key as it now is."""

    replaces: KeyOut


class SecretStatusOut(BaseModel):
    """Usable keys by the server secret their hash is under (``crud.SecretStatus``)."""

    object: Literal["key_secret_status"] = "key_secret_status"
    current: int
    previous: list[int]
    unrecorded: int
    other: int
    safe_to_drop_previous: bool


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


class BackendUpdate(Input):
    name: Name | None = None
    base_url: BaseUrl | None = None
    model: ModelName | None = None
    profile: ProfileName | None = None
    kind: Kind | None = None
    enabled: bool | None = None


class BackendCreate(BackendUpdate):
    name: Name
    base_url: BaseUrl
    model: ModelName
    profile: ProfileName  # see ``priority.profiles.available_profiles`` and the stored ones
    kind: Kind = "vllm"
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


class LiveBackendOut(_Output):
    """A backend in ``GET /backends``: :class:`BackendOut`'s fields (``id`` and the times null
    for a backend that is no database row), then where it comes from and its live state in
    this gateway process (null where it is not routed to). See :mod:`gateway.app.fleet`."""

    object: Literal["backend"] = "backend"
    id: int | None
    name: str
    base_url: str
    model: str
    profile: str
    kind: str
    enabled: bool
    created_at: datetime | None
    updated_at: datetime | None
    source: Literal["database", "embedded", "config"] = Field(
        description="`database`: a row of the backends table; `embedded`: an emulated engine "
        "`tiergate serve` started in-process; `config`: another fixed backend the app was given"
    )
    routed: bool = Field(description="this gateway routes requests for its model there now")
    healthy: bool | None = Field(description="routable now: breaker closed or half-open")
    breaker: Literal["closed", "half-open", "open"] | None
    breaker_reason: Literal["unreachable", "unresponsive"] | None
    failures: int | None = Field(description="request failures in a row since the last success")
    running: int | None = Field(description="requests running on the engine, last scrape")
    waiting: int | None = Field(description="requests waiting on the engine, last scrape")
    kv_cache_usage: float | None = Field(description="KV cache use, 0 to 1, last scrape")
    in_flight: int | None = Field(
        description="this gateway's requests there: awaiting their first token, or decoding"
    )
    last_health_check: datetime | None = Field(description="the last liveness probe's verdict")
    last_health_check_ok: bool | None
    seats: int | None = Field(
        None,
        description="requests it runs at once (max_num_seqs): the engine's, else the profile's",
    )
    engine_policy: str | None = Field(None, description="the policy the engine says it runs")
    max_model_len: int | None = Field(None, description="the engine's context length")
    config_mismatches: list[str] = Field(
        default_factory=list,
        description="where the registered profile disagrees with the engine (the engine wins)",
    )


class ProfileImport(Input):
    """A profile document (as ``tiergate profile fit`` writes it), stored under ``name`` or,
    when that is absent, under the document's own ``name``."""

    document: dict[str, Any]
    name: Name | None = None


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
    """One group's totals, each outcome apart (``docs/usage.md``): tokens and ``slo_attainment``
    are those of finished (``ok``) requests; ``errors`` (failed), ``rejected`` and
    ``cancelled`` requests are counted, never taken as SLO misses; ``tdg_ratio`` covers work an
    engine accepted."""

    requests: int
    ok: int
    errors: int
    rejected: int
    cancelled: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cancelled_tokens: int
    failed_tokens: int
    slo_met: int
    slo_attainment: float | None
    gain: float
    ideal_gain: float
    tdg_ratio: float | None
    cost: str
    """What the records were charged at their models' prices, exact decimal text."""

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
            "cancelled_tokens": summary.cancelled_tokens,
            "failed_tokens": summary.failed_tokens,
            "slo_met": summary.slo_met,
            "slo_attainment": summary.slo_attainment,
            "gain": summary.gain,
            "ideal_gain": summary.ideal_gain,
            "tdg_ratio": summary.tdg_ratio,
            "cost": plain(summary.cost) or "0",
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


class SeriesGroupOut(BaseModel):
    group: str | None  # tenant or tier name, a key's tg-prefix; None: deleted, or ungrouped
    group_id: int | None  # the tenant's (or key's) id when grouped by tenant (or key)


class SeriesPointOut(UsageOut, SeriesGroupOut):
    """One bucket of one group: the usage summary's fields, and the TTFT/TPOT percentiles
    (ms) of its finished requests (null when none finished)."""

    start: datetime
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    tpot_p99_ms: float | None

    @classmethod
    def of(cls, point: crud.SeriesPoint) -> SeriesPointOut:
        s = point.summary
        t50, t95, t99 = point.ttft_ms
        p50, p95, p99 = point.tpot_ms
        return cls(
            start=point.start,
            group=s.group,
            group_id=s.group_id,
            **UsageOut.fields_of(s),
            ttft_p50_ms=t50,
            ttft_p95_ms=t95,
            ttft_p99_ms=t99,
            tpot_p50_ms=p50,
            tpot_p95_ms=p95,
            tpot_p99_ms=p99,
        )


class UsageSeriesOut(BaseModel):
    """Usage per time bucket (UTC-aligned, ``bucket_seconds`` wide) and per group: the
    groups most requests first, the points that have records by time, then group."""

    object: Literal["usage_series"] = "usage_series"
    since: datetime
    until: datetime
    bucket: Literal["minute", "hour", "day"]
    bucket_seconds: int
    group_by: Literal["none", "tenant", "key", "tier"]
    groups: list[SeriesGroupOut]
    data: list[SeriesPointOut]


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
def _utc(moment: datetime | None) -> datetime | None:
    """A time without an offset is UTC, as the dashboard's filters read it."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


Since = Annotated[
    datetime | None,
    AfterValidator(_utc),
    Query(description="ISO 8601; without an offset, UTC"),
]
Until = Annotated[
    datetime | None,
    AfterValidator(_utc),
    Query(description="ISO 8601; without an offset, UTC (exclusive)"),
]
Hours = Annotated[
    float | None,
    Query(gt=0, le=MAX_USAGE_HOURS, description="window length, back from until (or now)"),
]

# Pagination of the list routes: without ``limit`` a list is whole, as before pagination; the
# total of every page is in the ``x-total-count`` header (the bodies keep their shape).
MAX_PAGE = 200
TOTAL_HEADER = "x-total-count"
PageLimit = Annotated[
    int | None,
    Query(ge=1, le=MAX_PAGE, description="page size (1-200); the whole list when absent"),
]
PageOffset = Annotated[
    int, Query(ge=0, le=INT32_MAX, description="rows to skip (with limit: the page's start)")
]
