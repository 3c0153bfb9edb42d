"""What an authenticated key resolves to: tenant, tier and the limits/SLOs in force.

A frozen value object, detached from any session, so the gateway's auth cache can hold it and
share it between requests and threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gateway.db.models import ApiKey, Tenant, Tier


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """A tenant's limits and SLOs: its overrides where set, the tier's values otherwise.

    SLOs are never tighter than the tier's minimums (a tier minimum raised after a tenant
    override was set wins). Limits of None are unlimited.
    """

    weight: float
    ttft_ms: float
    tpot_ms: float
    deadline_ms: float | None
    min_ttft_ms: float | None
    min_tpot_ms: float | None
    min_deadline_ms: float | None
    best_effort_allowed: bool
    rpm_limit: int | None
    tpm_limit: int | None
    max_concurrency: int | None
    shed_slack: float = 0.0
    """How late (a fraction of ``ttft_ms``) a predicted first token may be and the request still
    be admitted under overload; past it: refused early, or demoted where best effort is allowed
    (the tier's, no tenant override: it is a promise of the service class)."""
    default_kind: str = "latency"
    """The kind of a request that names none (no workflow or deadline header): the tier's
    (``latency``, ``deadline`` or ``best-effort``; :mod:`gateway.app.kinds`)."""


def _at_least(value: float | None, floor: float | None) -> float | None:
    if value is None or floor is None:
        return value
    return max(value, floor)


def effective_policy(tenant: Tenant, tier: Tier) -> EffectivePolicy:
    def pick(override: float | None, default: float | None) -> float | None:
        return override if override is not None else default

    def pick_int(override: int | None, default: int | None) -> int | None:
        return override if override is not None else default

    ttft = _at_least(pick(tenant.ttft_ms, tier.ttft_ms), tier.min_ttft_ms)
    tpot = _at_least(pick(tenant.tpot_ms, tier.tpot_ms), tier.min_tpot_ms)
    assert ttft is not None and tpot is not None  # the tier's defaults are NOT NULL
    return EffectivePolicy(
        weight=tier.weight,
        ttft_ms=ttft,
        tpot_ms=tpot,
        deadline_ms=_at_least(pick(tenant.deadline_ms, tier.deadline_ms), tier.min_deadline_ms),
        min_ttft_ms=tier.min_ttft_ms,
        min_tpot_ms=tier.min_tpot_ms,
        min_deadline_ms=tier.min_deadline_ms,
        best_effort_allowed=tier.best_effort_allowed,
        rpm_limit=pick_int(tenant.rpm_limit, tier.rpm_limit),
        tpm_limit=pick_int(tenant.tpm_limit, tier.tpm_limit),
        max_concurrency=pick_int(tenant.max_concurrency, tier.max_concurrency),
        shed_slack=tier.shed_slack,
        default_kind=tier.default_kind,
    )


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """An authenticated API key: who is calling, on which tier, under which policy.

    ``expires_at`` lets a cache bound how long it may keep the identity.
    """

    key_id: int
    key_prefix: str
    tenant_id: int
    tenant_name: str
    tier_id: int
    tier_name: str
    policy: EffectivePolicy
    expires_at: datetime | None

    @classmethod
    def from_rows(cls, key: ApiKey, tenant: Tenant, tier: Tier) -> KeyIdentity:
        return cls(
            key_id=key.id,
            key_prefix=key.prefix,
            tenant_id=tenant.id,
            tenant_name=tenant.name,
            tier_id=tier.id,
            tier_name=tier.name,
            policy=effective_policy(tenant, tier),
            expires_at=key.expires_at,
        )
