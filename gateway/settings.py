"""The gateway's configuration: every ``TIERGATE_*`` environment variable, in one object.

Everything that configures the gateway reads :func:`get_settings` so that the environment is
parsed once and a typo in a variable's value fails at start-up, not on the first request.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./tiergate.db"
MIB = 1 << 20


class Settings(BaseSettings):
    """``TIERGATE_DATABASE_URL``, ``TIERGATE_REDIS_URL``, ``TIERGATE_SECRET``, ...

    Secrets are :class:`~pydantic.SecretStr` so that printing or logging the settings never
    shows them.
    """

    model_config = SettingsConfigDict(env_prefix="TIERGATE_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL; SQLite (default) or postgresql+psycopg://...",
    )
    redis_url: str | None = Field(
        default=None, description="Redis for shared rate limits; unset = in-process limits"
    )
    secret: SecretStr | None = Field(
        default=None,
        description="HMAC key for API keys; unset = created once in <data_dir>/secret",
    )
    admin_key: SecretStr | None = Field(default=None, description="bearer token of the admin API")
    data_dir: Path = Field(
        default=Path("~/.tiergate"), description="where the generated server secret is kept"
    )

    # ---- the gateway app: routing, admission, health and accounting ----------------------

    router: str = Field(default="goroute", description="goroute | min-load | round-robin")
    auth_cache_ttl_s: float = Field(
        default=2.0, gt=0, le=2.0, description="how long a key's identity is cached (≤ 2 s)"
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
    metrics_addr: str | None = Field(
        default=None,
        description="host:port of the operator listener serving /metrics (never the API port); "
        "unset = no listener, except under `tiergate serve` (127.0.0.1:9464)",
    )
    metrics_tenant_labels: bool = Field(
        default=False,
        description="label tiergate_requests_total by tenant name too (off: by tier only)",
    )
    metrics_max_tenants: int = Field(
        default=50,
        ge=1,
        description="with tenant labels: tenants labelled by name; the rest are 'other'",
    )
    usage_batch_size: int = Field(default=500, ge=1)
    usage_flush_interval_s: float = Field(default=0.5, gt=0)
    redis_prefix: str = Field(default="tiergate", description="key prefix of the Redis limiter")

    @field_validator("metrics_addr")
    @classmethod
    def _check_metrics_addr(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, port = split_addr(value)
        return join_addr(host, port)

    @property
    def data_path(self) -> Path:
        """``data_dir`` with ``~`` expanded."""
        return self.data_dir.expanduser()


def split_addr(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as ``(host, port)``; port 0 = a free one.

    The host is required: listening on every interface (``0.0.0.0``) must be written out,
    since that is what exposes the listener beyond the machine.
    """
    host, sep, port = value.strip().rpartition(":")
    example = "e.g. 127.0.0.1:9464, or 0.0.0.0:9464 in a container"
    if not sep or not host:
        raise ValueError(f"{value!r} is not host:port ({example})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{value!r}: write an IPv6 address in brackets, e.g. [::1]:9464")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r}: the port must be a number from 0 to 65535 ({example})")
    return host, int(port)


def join_addr(host: str, port: int) -> str:
    """The inverse of :func:`split_addr`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; tests call ``get_settings.cache_clear()``)."""
    return Settings()
