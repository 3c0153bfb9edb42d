"""The data plane's own ``TIERGATE_*`` settings, on top of the shared :class:`Settings`.

They extend :class:`gateway.settings.Settings` (same environment prefix, same object), so the
app still takes "one Settings object"; a plain ``Settings`` passed to ``create_app`` is upgraded
with these fields read from the environment.
"""

from __future__ import annotations

from pydantic import Field

from gateway.settings import Settings

MIB = 1 << 20


class GatewaySettings(Settings):
    """Routing, admission, health and accounting knobs of the gateway app."""

    router: str = Field(default="goroute", description="goroute | min-load | round-robin")
    auth_cache_ttl_s: float = Field(
        default=1.0, gt=0, le=2.0, description="how long a key's identity is cached (≤ 2 s)"
    )
    max_body_bytes: int = Field(default=MIB, ge=1, description="larger request bodies get 413")
    default_max_tokens: int = Field(
        default=256, ge=1, description="expected output reserved when max_tokens is absent"
    )
    max_in_flight: int | None = Field(
        default=None, ge=1, description="dispatch slots; unset = sum of backends' max_num_seqs"
    )
    max_queued: int = Field(default=1024, ge=1, description="admission queue capacity")
    queue_ttl_s: float = Field(default=30.0, gt=0, description="longest wait for a slot (503)")
    scrape_interval_s: float = Field(default=1.0, gt=0, description="backend /metrics period")
    upstream_connect_timeout_s: float = Field(default=2.0, gt=0)
    upstream_timeout_s: float = Field(default=600.0, gt=0, description="read timeout upstream")
    max_attempts: int = Field(
        default=3, ge=1, description="backends tried per request before its first token"
    )
    breaker_failures: int = Field(
        default=3, ge=1, description="consecutive failures that open a backend's breaker"
    )
    breaker_cooldown_s: float = Field(
        default=5.0, gt=0, description="how long an open breaker keeps a backend out"
    )
    smoothing: bool = Field(
        default=False, description="pace streamed tokens to their deadlines (PROSERVE buffer)"
    )
    smoothing_margin_ms: float = Field(
        default=20.0, ge=0, description="how far ahead of its deadline a paced token is sent"
    )
    metrics_max_tenants: int = Field(
        default=50, ge=1, description="tenants labelled by name in metrics; the rest are 'other'"
    )
    usage_batch_size: int = Field(default=500, ge=1)
    usage_flush_interval_s: float = Field(default=0.5, gt=0)
    redis_prefix: str = Field(default="tiergate", description="key prefix of the Redis limiter")


def gateway_settings(settings: Settings | None) -> GatewaySettings:
    """``settings`` as :class:`GatewaySettings` (its values win; the rest from the environment)."""
    if isinstance(settings, GatewaySettings):
        return settings
    if settings is None:
        return GatewaySettings()
    fields = type(settings).model_fields
    return GatewaySettings(**{name: getattr(settings, name) for name in fields})
