"""ORM models: tiers, tenants, API keys, backends, latency profiles, usage records, the request
log, model prices, budgets, operator credentials and sessions (the dashboard's), audit log.

Enumerations are plain strings with CHECK constraints rather than native enums, so that adding a
value is a one-line migration on both SQLite and PostgreSQL. Times are timezone-aware UTC
(:class:`UTCDateTime`), whatever the database keeps.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from gateway.bounds import MAX_LIMIT, MAX_SLO_MS, MAX_WEIGHT, MIN_LIMIT, MIN_SLO_MS, MIN_WEIGHT

TENANT_STATUSES = ("active", "suspended")
BACKEND_KINDS = ("vllm", "vllm-ascend", "emulated")
USAGE_STATUSES = ("ok", "error", "rejected", "cancelled")
OPERATOR_ROLES = ("owner", "operator", "viewer", "tenant_admin")
"""What a named operator may do (:mod:`gateway.app.admin.roles`); ``tenant_admin`` is bound to
one tenant (``operator_credentials.tenant_id``), the others to none."""
BUDGET_PERIODS = ("day", "month")
"""A budget's period: a UTC calendar day or a UTC calendar month (:mod:`gateway.limits.budget`)."""
PRICE = Numeric(12, 6)
"""A price per million tokens: exact to a millionth of the currency unit, up to 999,999.999999
(a Decimal, never a float: a price is money)."""
MONEY = Numeric(18, 9)
"""A cost or a budget: exact to 1e-9 of the currency unit on PostgreSQL. SQLite keeps NUMERIC
as a double (about 15 significant digits), so its sums are exact to well under a millionth for
any amount a report shows."""
LENGTH_FINISHES = ("stop", "length")
"""How a length sample's request ended: ``stop`` (its true length) or ``length`` (it reached its
``max_tokens``: censored at that cap; :mod:`gateway.app.length_learning`)."""

# Named constraints: Alembic's SQLite batch mode can only drop or alter what has a name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the only kind of datetime this layer stores)."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A ``TIMESTAMP WITH TIME ZONE`` that always reads back as aware UTC.

    SQLite keeps no offset; storing UTC and re-attaching it on the way out makes both databases
    behave alike and keeps string comparison in SQLite chronological. Naive datetimes are
    refused: their meaning depends on the host's timezone.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass a timezone-aware (UTC) datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit key for usage rows.
BigIntPK = BigInteger().with_variant(sqlite.INTEGER(), "sqlite")


def _check_in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _check_range(columns: tuple[str, ...], low: float, high: float, *, nullable: bool) -> str:
    """Every column within ``[low, high]`` (NULL allowed when ``nullable``): the bounds of
    :mod:`gateway.bounds`, written as SQL literals (``repr`` is exact for these numbers)."""
    parts = []
    for column in columns:
        within = f"{column} >= {low!r} AND {column} <= {high!r}"
        parts.append(f"({column} IS NULL OR ({within}))" if nullable else f"({within})")
    return " AND ".join(parts)


_LIMITS = ("rpm_limit", "tpm_limit", "max_concurrency")
_LIMITS_RANGE = _check_range(_LIMITS, MIN_LIMIT, MAX_LIMIT, nullable=True)

# The bounds of every tier and tenant number that reaches the gain, by constraint name (migration
# 0003 wrote these; a change of bounds is a new migration).
TIER_CHECKS = {
    "weight_range": _check_range(("weight",), MIN_WEIGHT, MAX_WEIGHT, nullable=False),
    "slo_range": _check_range(("ttft_ms", "tpot_ms"), MIN_SLO_MS, MAX_SLO_MS, nullable=False),
    "deadline_range": _check_range(("deadline_ms",), MIN_SLO_MS, MAX_SLO_MS, nullable=True),
    "min_slo_range": _check_range(
        ("min_ttft_ms", "min_tpot_ms", "min_deadline_ms"), MIN_SLO_MS, MAX_SLO_MS, nullable=True
    ),
    "limits_range": _LIMITS_RANGE,
}
TENANT_CHECKS = {
    "slo_range": _check_range(
        ("ttft_ms", "tpot_ms", "deadline_ms"), MIN_SLO_MS, MAX_SLO_MS, nullable=True
    ),
    "limits_range": _LIMITS_RANGE,
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
    }


class Timestamped:
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Tier(Timestamped, Base):
    """A service class: its weight in the gain function, default SLOs and rate limits.

    ``min_*_ms`` bound how tight an SLO a request (or a tenant override) may ask for; the
    ``*_limit`` columns are NULL for unlimited. ``best_effort_allowed`` lets admission serve a
    request without SLO instead of shedding it when its SLO cannot be met.
    """

    __tablename__ = "tiers"
    __table_args__ = tuple(CheckConstraint(sql, name=name) for name, sql in TIER_CHECKS.items())

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str | None] = mapped_column(Text)
    weight: Mapped[float] = mapped_column(Float)
    ttft_ms: Mapped[float] = mapped_column(Float)
    tpot_ms: Mapped[float] = mapped_column(Float)
    deadline_ms: Mapped[float | None] = mapped_column(Float)
    min_ttft_ms: Mapped[float | None] = mapped_column(Float)
    min_tpot_ms: Mapped[float | None] = mapped_column(Float)
    min_deadline_ms: Mapped[float | None] = mapped_column(Float)
    rpm_limit: Mapped[int | None] = mapped_column(Integer)
    tpm_limit: Mapped[int | None] = mapped_column(Integer)
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    best_effort_allowed: Mapped[bool] = mapped_column(Boolean, default=False)
    shed_slack: Mapped[float] = mapped_column(Float, default=0.0, server_default=text("0"))
    """How late (a fraction of the TTFT objective) a request's predicted first token may be and
    the request still be admitted under overload; past it: refused early, or demoted to best
    effort where ``best_effort_allowed`` (migration 0005)."""
    default_kind: Mapped[str] = mapped_column(
        String(16), default="latency", server_default=text("'latency'")
    )
    """The kind of a request that names none: ``latency``, ``deadline`` or ``best-effort`` (the
    last two need ``deadline_ms``, checked by the CRUD layer; migration 0009)."""

    tenants: Mapped[list[Tenant]] = relationship(back_populates="tier")


class Tenant(Timestamped, Base):
    """A customer. Non-NULL override columns replace the tier's value for this tenant only."""

    __tablename__ = "tenants"
    __table_args__ = (
        CheckConstraint(_check_in("status", TENANT_STATUSES), name="status"),
        *(CheckConstraint(sql, name=name) for name, sql in TENANT_CHECKS.items()),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    tier_id: Mapped[int] = mapped_column(ForeignKey("tiers.id", ondelete="RESTRICT"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="active")
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    tpot_ms: Mapped[float | None] = mapped_column(Float)
    deadline_ms: Mapped[float | None] = mapped_column(Float)
    rpm_limit: Mapped[int | None] = mapped_column(Integer)
    tpm_limit: Mapped[int | None] = mapped_column(Integer)
    max_concurrency: Mapped[int | None] = mapped_column(Integer)

    tier: Mapped[Tier] = relationship(back_populates="tenants")
    api_keys: Mapped[list[ApiKey]] = relationship(
        back_populates="tenant", cascade="all, delete-orphan", passive_deletes=True
    )


class ApiKey(Base):
    """An API key, kept only as ``HMAC-SHA256(server secret, key)`` plus its display prefix."""

    __tablename__ = "api_keys"
    __table_args__ = (
        Index("ix_api_keys_created", "created_at", "id"),  # the keys list, newest first (0007)
        Index("uq_api_keys_form_token_hash", "form_token_hash", unique=True),  # (0011)
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str | None] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    secret_id: Mapped[str | None] = mapped_column(String(16))
    """Which server secret ``key_hash`` is under (``gateway.db.security.secret_id``); NULL:
    issued before migration 0006 and not used since."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column()
    last_used_at: Mapped[datetime | None] = mapped_column()
    form_token_hash: Mapped[str | None] = mapped_column(String(64))
    """``HMAC(server secret, label + token)`` of the dashboard form that issued the key (unique:
    a re-sent form cannot issue a second key); NULL for keys from the API, the CLI, or before
    migration 0011."""

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys")


class Backend(Timestamped, Base):
    """An inference engine the gateway routes to, with the latency profile that models it."""

    __tablename__ = "backends"
    __table_args__ = (CheckConstraint(_check_in("kind", BACKEND_KINDS), name="kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    base_url: Mapped[str] = mapped_column(String(512))
    model: Mapped[str] = mapped_column(String(256))
    profile: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32), default="vllm")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)


class LatencyProfile(Base):
    """An operator-calibrated latency profile, stored so every gateway reads the same document.

    ``document`` is the profile's JSON (:meth:`priority.profiles.Profile.to_dict`, its ``name``
    equal to the row's). Backends reference a profile by name — a shipped one or one of these —
    so there is no foreign key: deletion checks for users instead (:mod:`gateway.db.crud`).
    Profiles are immutable; re-calibrating means importing under a new name.
    """

    __tablename__ = "latency_profiles"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    document: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str] = mapped_column(String(128))


class UsageRecord(Base):
    """One request's outcome, written in batches by :class:`gateway.db.usage.UsageWriter`.

    Tier, model and backend are names as they were at request time (not foreign keys): a usage
    history outlives renamed tiers and removed backends. Tenant and key survive deletion as NULL.

    ``status`` is the outcome (``ok``, ``rejected``, ``cancelled``, ``error`` = failed). Tokens,
    ``gain`` and ``ideal_gain`` are those of work an engine accepted: a rejected request, or one
    no engine took, carries zeros. ``slo_met`` is a sample only on ``ok`` rows (``docs/usage.md``).
    """

    __tablename__ = "usage_records"
    __table_args__ = (
        CheckConstraint(_check_in("status", USAGE_STATUSES), name="status"),
        Index("ix_usage_records_tenant_created", "tenant_id", "created_at"),
        Index("ix_usage_records_tier_created", "tier", "created_at"),
        Index("uq_usage_records_request_id", "request_id", unique=True),
        Index("ix_usage_records_created", "created_at"),  # usage over a window (0007)
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(128))
    tenant_id: Mapped[int | None] = mapped_column(ForeignKey("tenants.id", ondelete="SET NULL"))
    api_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    tier: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(256))
    backend: Mapped[str | None] = mapped_column(String(64))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    tpot_ms: Mapped[float | None] = mapped_column(Float)
    gain: Mapped[float] = mapped_column(Float, default=0.0)
    ideal_gain: Mapped[float] = mapped_column(Float, default=0.0)
    slo_met: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16))
    reject_reason: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    cost: Mapped[Decimal | None] = mapped_column(MONEY)
    """What the request cost at the model's price when the record was written (migration
    0013): prompt and completion tokens times their prices; NULL when its model had no price.
    Kept on the record, so a later price change never rewrites history."""


MISS_REASONS = ("hopeless", "demoted", "queued", "failover", "engine_slow", "stalled", "unknown")
"""Why a request missed its SLO, as its request-log row says (:mod:`gateway.app.explain`)."""


_MISSED = text("miss_reason IS NOT NULL")


class RequestLog(Base):
    """One request as each stage saw it, kept for a bounded time (migration 0014): what the
    request log (``/admin/v1/requests``, ``/ui/requests``) shows and why an SLO was missed.

    Not the usage record: that is billing and is never trimmed; this row is an explanation,
    trimmed by age and count (``TIERGATE_REQUEST_LOG_DAYS`` / ``_ROWS``). Never the prompt or
    the output. Tenant and key are plain ids, not foreign keys, so writing a row can never fail
    for a tenant deleted meanwhile; the log joins their names when it is read.
    ``created_at`` is the request's arrival. Times are milliseconds; ``slo_met`` is NULL where
    the request has no attainment sample (it did not finish).
    """

    __tablename__ = "request_log"
    __table_args__ = (
        CheckConstraint(_check_in("status", USAGE_STATUSES), name="status"),
        Index("uq_request_log_request_id", "request_id", unique=True),
        Index("ix_request_log_tenant_id_id", "tenant_id", "id"),  # a tenant's, newest first
        Index("ix_request_log_created_at", "created_at"),  # trimming by age, time ranges
        # the misses only, newest first: everyone's and a tenant's
        Index("ix_request_log_missed", "id", postgresql_where=_MISSED, sqlite_where=_MISSED),
        Index(
            "ix_request_log_tenant_missed",
            "tenant_id",
            "id",
            postgresql_where=_MISSED,
            sqlite_where=_MISSED,
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    tenant_id: Mapped[int | None] = mapped_column(Integer)
    api_key_id: Mapped[int | None] = mapped_column(Integer)
    tier: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(256))
    backend: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    http_status: Mapped[int | None] = mapped_column(Integer)
    reject_reason: Mapped[str | None] = mapped_column(String(128))
    admission: Mapped[str | None] = mapped_column(String(16))
    """Admission's verdict: ``admit``, ``demote`` or ``shed`` (None: refused before it)."""
    admission_ttft_ms: Mapped[float | None] = mapped_column(Float)
    """The TTFT admission predicted (queue wait included) when it judged the request."""
    predicted_ttft_ms: Mapped[float | None] = mapped_column(Float)
    """The router's predicted dispatch-to-first-token time on the backend that served it."""
    queue_ms: Mapped[float | None] = mapped_column(Float)
    engine_ttft_ms: Mapped[float | None] = mapped_column(Float)
    """Measured dispatch-to-first-token time on the backend that served it."""
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    tpot_ms: Mapped[float | None] = mapped_column(Float)
    slo_ttft_ms: Mapped[float | None] = mapped_column(Float)
    slo_tpot_ms: Mapped[float | None] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    gain: Mapped[float] = mapped_column(Float, default=0.0)
    ideal_gain: Mapped[float] = mapped_column(Float, default=0.0)
    slo_met: Mapped[bool | None] = mapped_column(Boolean)
    miss_reason: Mapped[str | None] = mapped_column(String(16))


class ModelPrice(Timestamped, Base):
    """What a model's tokens cost, per million (migration 0013): the price a usage record is
    charged at when it is written, and a budget's reservation at admission."""

    __tablename__ = "model_prices"
    __table_args__ = (
        CheckConstraint(
            "prompt_per_mtok >= 0 AND completion_per_mtok >= 0", name="price_not_negative"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(256), unique=True)
    """The model name clients ask for (the usage records' ``model``)."""
    prompt_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    completion_per_mtok: Mapped[Decimal] = mapped_column(PRICE)


class Budget(Timestamped, Base):
    """A spend budget of a tenant, or of one of its keys, over a UTC day or month (migration
    0013). Past ``soft_fraction`` of ``amount`` the gateway warns (metric, dashboard, webhook);
    at ``amount`` it refuses (429 ``budget_exceeded``) until the period ends.

    ``target`` is ``tenant:<id>`` or ``key:<id>``: one budget per target and period, unique in
    the database whichever of the two it is."""

    __tablename__ = "budgets"
    __table_args__ = (
        CheckConstraint(_check_in("period", BUDGET_PERIODS), name="period"),
        CheckConstraint("amount > 0", name="amount_positive"),
        CheckConstraint(
            "soft_fraction IS NULL OR (soft_fraction > 0 AND soft_fraction <= 1)",
            name="soft_fraction_range",
        ),
        Index("uq_budgets_target_period", "target", "period", unique=True),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    target: Mapped[str] = mapped_column(String(32))
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    api_key_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_keys.id", ondelete="CASCADE"), index=True
    )
    period: Mapped[str] = mapped_column(String(8))
    amount: Mapped[Decimal] = mapped_column(MONEY)
    soft_fraction: Mapped[float | None] = mapped_column(Float)
    webhook_url: Mapped[str | None] = mapped_column(String(512))
    """Where a soft-threshold crossing is posted (JSON), or NULL."""

    tenant: Mapped[Tenant] = relationship()
    api_key: Mapped[ApiKey | None] = relationship()


class LengthSample(Base):
    """One finished request as the length predictor's trainer sees it (migration 0010).

    Written by :class:`gateway.db.length_samples.SampleWriter` when ``TIERGATE_LENGTHS_LEARN`` is
    on. ``features`` is the request's dense feature vector (float32 bytes in the ``layout``
    named, :meth:`priority.lengths.features.FeatureConfig.layout_id`): hashed word and character
    n-gram weights and sizes, from which the prompt's text cannot be read back. ``prompt`` is the
    raw text only where the operator turned ``TIERGATE_LENGTHS_STORE_PROMPTS`` on, else NULL.
    The tenant is a keyed-free hash (the same bucket the features use), not a reference: samples
    are training data, not accounting, and are pruned to ``TIERGATE_LENGTHS_SAMPLE_ROWS``.
    """

    __tablename__ = "length_samples"
    __table_args__ = (
        CheckConstraint(_check_in("finish", LENGTH_FINISHES), name="finish"),
        Index("ix_length_samples_layout_id", "layout", "id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    model: Mapped[str] = mapped_column(String(256))
    tenant_hash: Mapped[str | None] = mapped_column(String(16))
    layout: Mapped[str] = mapped_column(String(16))
    features: Mapped[bytes] = mapped_column(LargeBinary)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    max_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    finish: Mapped[str] = mapped_column(String(8))
    prompt: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class OperatorCredential(Base):
    """A dashboard operator's sign-in credential, also accepted as the admin API's bearer.

    Kept only as ``HMAC-SHA256(server secret, credential)`` like an API key (migration 0008):
    the plaintext is printed once by ``tiergate serve`` (or ``tiergate admin
    reset-credential``) and never stored.
    """

    __tablename__ = "operator_credentials"
    __table_args__ = (
        CheckConstraint(_check_in("role", OPERATOR_ROLES), name="role"),
        # a tenant admin names its tenant; no other role does (migration 0012)
        CheckConstraint("(role = 'tenant_admin') = (tenant_id IS NOT NULL)", name="role_tenant"),
        Index("uq_operator_credentials_form_token_hash", "form_token_hash", unique=True),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    credential_hash: Mapped[str] = mapped_column(String(64), unique=True)
    secret_id: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column()
    role: Mapped[str] = mapped_column(String(16), default="owner", server_default="owner")
    """``owner`` for every credential made before roles existed (migration 0012): the shared
    credential keeps doing everything it did."""
    tenant_id: Mapped[int | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    """The one tenant a ``tenant_admin`` administers; deleting the tenant deletes its admins."""

    form_token_hash: Mapped[str | None] = mapped_column(String(64))
    """The keyed hash of the dashboard form that issued this credential (unique: reloading the
    page that showed it issues no second one); NULL from the API and the CLI."""

    tenant: Mapped[Tenant | None] = relationship()


class OperatorSession(Base):
    """A signed-in dashboard session (migration 0008), shared by every worker process.

    The cookie holds the session token; only its keyed hash is stored. ``credential_id`` is the
    stored credential it signed in with (NULL: ``TIERGATE_ADMIN_KEY``), so resetting that
    credential ends its sessions; ``last_seen_at`` drives the idle expiry.
    """

    __tablename__ = "operator_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    operator: Mapped[str] = mapped_column(String(64))
    credential_id: Mapped[int | None] = mapped_column(
        ForeignKey("operator_credentials.id", ondelete="CASCADE"), index=True
    )
    client: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class AuditLog(Base):
    """Who changed what: one row per admin mutation, written in the mutation's transaction."""

    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_entity", "entity_type", "entity_id"),
        # newest first with the id tie-break, and by actor (migration 0007)
        Index("ix_audit_log_at_id", "at", "id"),
        Index("ix_audit_log_actor_at", "actor", "at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))
    entity_type: Mapped[str] = mapped_column(String(32))
    entity_id: Mapped[str] = mapped_column(String(64))
    before: Mapped[dict[str, Any] | None] = mapped_column()
    after: Mapped[dict[str, Any] | None] = mapped_column()
    at: Mapped[datetime] = mapped_column(default=utcnow)
