"""The gateway's configuration: every ``TIERGATE_*`` environment variable, in one object.

Everything that configures the gateway reads :func:`get_settings` so that the environment is
parsed once and a typo in a variable's value fails at start-up, not on the first request.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path

from pydantic import Field, FilePath, SecretStr, field_validator
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

    router: str = Field(
        default="goroute",
        description="goroute, or a router users run: min-load | round-robin | power-of-two | "
        "least-predicted-ttft (priority.routing)",
    )
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
    upstream_ca_file: FilePath | None = Field(
        default=None,
        description="PEM bundle of the CAs trusted for https:// engines (replaces the system "
        "store, like REQUESTS_CA_BUNDLE); unset = the system store",
    )
    max_attempts: int = Field(
        default=3, ge=1, description="attempts per request before its first token"
    )
    breaker_failures: int = Field(
        default=3, ge=1, description="consecutive failures that open a backend's breaker"
    )
    breaker_cooldown_s: float = Field(
        default=5.0, gt=0, description="how long an open breaker keeps a backend out"
    )

    # ---- engine faults: first-token and stall timeouts, liveness, breaker ---------
    first_token_timeout_factor: float = Field(
        default=2.0,
        gt=0,
        description="an attempt without its first token after this many times the request's "
        "TTFT objective (from its first dispatch) is abandoned and retried elsewhere",
    )
    first_token_timeout_min_s: float = Field(
        default=0.5, gt=0, description="lower bound of the first-token timeout, and of any retry"
    )
    first_token_timeout_max_s: float = Field(
        default=60.0,
        gt=0,
        description="upper bound of the first-token timeout; what a best-effort request gets",
    )
    stall_timeout_factor: float = Field(
        default=20.0,
        gt=0,
        description="a stream with no event for this many times its TPOT objective (after its "
        "first token) is ended with an error event",
    )
    stall_timeout_min_s: float = Field(
        default=2.0, gt=0, description="lower bound of the stall timeout (engines preempt)"
    )
    stall_timeout_max_s: float = Field(
        default=30.0, gt=0, description="upper bound of the stall timeout"
    )
    client_write_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="a streamed response whose client takes none of it for this long (a write "
        "still waiting for room) is ended and its engine request aborted; the client's fault, "
        "never counted against the backend",
    )
    probe_interval_s: float = Field(
        default=0.25, gt=0, description="period of each backend's liveness probe (GET /health)"
    )
    probe_timeout_s: float = Field(
        default=0.5, gt=0, description="a liveness probe slower than this opens the breaker"
    )
    backend_stall_min_s: float = Field(
        default=0.5,
        gt=0,
        description="watchdog: a backend whose streams all wait this long with no event (or "
        "1.5x the longest step it may be running, if longer) is unresponsive: breaker opens",
    )
    breaker_trial_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="timeout of the 1-token trial request that closes a breaker opened for "
        "unresponsiveness",
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

    # ---- Redis outages: degraded per-process limits, leases ---------------------
    # docs/operations/redis-outage.md
    limits_share: int | None = Field(
        default=None,
        ge=1,
        description="gateway processes sharing the Redis limits (workers x replicas): while "
        "Redis is unreachable each enforces limit // this, in process; unset = `workers`",
    )
    redis_timeout_s: float = Field(
        default=0.25,
        gt=0,
        le=5.0,
        description="Redis connect/read timeout; a call past it switches limits to degraded "
        "mode (one failed call, then no request waits on Redis until a probe answers)",
    )
    redis_lease_s: float = Field(
        default=30.0,
        ge=3.0,
        description="Redis lease of a concurrency slot, renewed every third of it while the "
        "request runs: the longest a crashed process keeps a tenant's slots",
    )

    # ---- request kinds and agent workflows (gateway/app/kinds.py) ---------------
    workflow_ttl_s: float = Field(
        default=3600.0,
        gt=0,
        le=7 * 86_400,
        description="how long a workflow's state is kept after its deadline (a later call is "
        "told it expired, 409); in Redis when redis_url is set, else in process",
    )
    workflow_history: int = Field(
        default=500,
        ge=0,
        le=100_000,
        description="pattern graphs of finished workflows each process keeps for compound "
        "calls' sub-deadlines (JITServe's φ(s)·D, gateway/app/patterns.py); 0 turns the "
        "history off: every call gets the cold start (all the time left)",
    )
    length_model: Path | None = Field(
        default=None,
        description="directory of a trained output-length model (`tiergate lengths train`): "
        "when set, each request's length distribution is predicted and sent to the engine "
        "(tiergate_length); unset = none is sent",
    )
    length_budget_ms: float = Field(
        default=5.0,
        gt=0,
        le=1000,
        description="the most a length prediction may take; it runs beside admission, and a "
        "request whose prediction is later goes without one",
    )
    # the gateway learns its length model from its own traffic (docs/operations/length-learning.md)
    lengths_learn: bool = Field(
        default=False,
        description="record a length sample (hashed features, never the prompt text) per "
        "finished request, train a model from them every lengths_train_interval_s and serve "
        "the newest one; off by default: it costs a database row and featurizing per request",
    )
    lengths_store_prompts: bool = Field(
        default=False,
        description="also store each sample's raw prompt text (for retraining with another "
        "feature layout); off by default: the samples then hold customers' prompts",
    )
    lengths_sample_rows: int = Field(
        default=200_000,
        ge=100,
        le=10_000_000,
        description="length samples kept in the database (the oldest are deleted past it); "
        "the trainer learns from all of them",
    )
    lengths_train_interval_s: float = Field(
        default=3600.0,
        ge=0,
        description="how often one worker retrains the length model from the samples "
        "(0 = never: samples are only recorded, for `tiergate lengths train-db`)",
    )
    lengths_min_samples: int = Field(
        default=1000,
        ge=10,
        description="samples needed before the first (and any) periodic training",
    )
    lengths_keep_versions: int = Field(
        default=3,
        ge=1,
        le=100,
        description="trained model versions kept under <data_dir>/lengths/ (older ones deleted)",
    )
    lengths_train_trees: int = Field(
        default=100,
        ge=1,
        le=2000,
        description="trees of a periodically trained forest",
    )

    # ---- database outages: stale auth, usage buffer and spool ---------------------
    # docs/operations/database-outage.md
    auth_stale_s: float = Field(
        default=300.0,
        ge=0,
        le=86_400,
        description="while the database cannot answer, a key it accepted less than this many "
        "seconds ago keeps authenticating from the cache (revocations made meanwhile are not "
        "seen); 0 = none: every key past its cache TTL gets 503",
    )
    usage_buffer_records: int = Field(
        default=100_000,
        ge=1,
        description="usage records kept in memory (per process) while the database cannot "
        "take them, before they spill to the on-disk spool",
    )
    usage_spool_max_bytes: int = Field(
        default=1 << 30,
        ge=0,
        description="bytes of usage records spooled under <data_dir>/usage-spool/ past the "
        "memory buffer (shared by the processes on one data_dir); past it records are dropped "
        "and counted; 0 = no spool",
    )
    request_log_days: float = Field(
        default=7.0,
        ge=0,
        le=3660,
        description="days a request-log row (/admin/v1/requests: how each request was served, "
        "why it missed its SLO) is kept; 0 = no request log at all. The usage records, the "
        "billing, are never trimmed",
    )
    request_log_rows: int = Field(
        default=2_000_000,
        ge=1000,
        description="most request-log rows kept (the oldest go first), whatever their age",
    )
    request_log_trim_interval_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="how often each process's usage writer trims the request log",
    )

    # ---- scale out: worker processes and graceful shutdown -----------------------
    workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="gateway worker processes of `tiergate serve` behind one port; unset = one "
        "per CPU this process may use, at most 8. Inside a worker: how many there are",
    )
    shutdown_drain_s: float = Field(
        default=30.0,
        ge=0,
        description="on SIGTERM: how long requests in flight may take to finish before they "
        "are ended with a `shutting_down` error (streams: an error event)",
    )
    shutdown_delay_s: float = Field(
        default=0.0,
        ge=0,
        description="on SIGTERM: how long to keep accepting connections after readiness goes "
        "false (for a load balancer to notice), before the drain starts",
    )

    # ---- security: secret rotation, client address behind proxies, header limits --
    secret_previous: SecretStr | None = Field(
        default=None,
        description="retired TIERGATE_SECRET value(s), comma-separated: keys hashed under them "
        "still authenticate and are re-hashed under the current secret on use; remove once "
        "`tiergate keys secret-status` shows no key left under them",
    )
    trusted_proxies: str | None = Field(
        default=None,
        description="comma-separated IPs/CIDRs of reverse proxies whose X-Forwarded-For names "
        "the client (audit actor address); unset = the TCP peer, forwarded headers ignored",
    )
    max_header_bytes: int = Field(
        default=16 * 1024,
        ge=1024,
        le=MIB,
        description="request line plus headers larger than this get 431 (before the app runs)",
    )
    max_headers: int = Field(
        default=100, ge=8, le=10_000, description="requests with more header fields get 431"
    )

    # ---- overload: SLO-aware shedding, the backlog kept in the gateway ------------
    dispatch_horizon_s: float = Field(
        default=0.1,
        gt=0,
        le=3600,
        description="most estimated prefill work (seconds, from the backend's latency profile) "
        "a backend may have pending before further requests wait in the gateway's gain-ordered "
        "queue instead of the engine's (docs/operations/overload.md)",
    )

    # ---- the admin dashboard: /ui, its sign-in sessions ------------------------
    ui: bool = Field(
        default=True, description="serve the admin dashboard at /ui (TIERGATE_UI=false: off)"
    )
    ui_session_ttl_s: float = Field(
        default=8 * 3600.0,
        gt=0,
        le=30 * 86_400,
        description="a dashboard session unused for this long is signed out (idle expiry)",
    )

    @field_validator("router")
    @classmethod
    def _check_router(cls, value: str) -> str:
        from priority.routing import ROUTER_NAMES

        if value not in ROUTER_NAMES:
            raise ValueError(f"unknown router {value!r}; known: {', '.join(ROUTER_NAMES)}")
        return value

    @field_validator("metrics_addr")
    @classmethod
    def _check_metrics_addr(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, port = split_addr(value)
        return join_addr(host, port)

    @field_validator("trusted_proxies")
    @classmethod
    def _check_trusted_proxies(cls, value: str | None) -> str | None:
        # security: uvicorn would take a typo for a host name and trust nobody, silently
        if value is None or not value.strip():
            return None
        entries = [e.strip() for e in value.split(",") if e.strip()]
        for entry in entries:
            if entry != "*":
                ipaddress.ip_network(entry, strict=False)  # ValueError names the entry
        return ",".join(entries)

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
