"""Admission control: per-tenant RPM/TPM/concurrency limits and the gain-ordered admission queue.

``make_rate_limiter(settings.redis_url)`` picks Redis (shared by all gateway processes, with a
per-process degraded mode while Redis is away: :mod:`gateway.limits.failover`) or the in-process
limiter; :class:`AdmissionQueue` orders what the limits let through. Every refusal is
an :class:`AdmissionRejected` carrying its :class:`RejectReason`, status code and headers.
"""

from gateway.limits.backlog import Backlog, QueueItem, gain_density
from gateway.limits.base import (
    REJECT_REASON_HEADER,
    RETRY_AFTER_HEADER,
    AdmissionRejected,
    LimitExceeded,
    Limits,
    RateLimiter,
    RejectReason,
    Reservation,
    Usage,
)
from gateway.limits.failover import FailoverRateLimiter, make_rate_limiter
from gateway.limits.memory import InMemoryRateLimiter
from gateway.limits.queue import AdmissionQueue, QueueRejected
from gateway.limits.redis import RedisRateLimiter

__all__ = [
    "REJECT_REASON_HEADER",
    "RETRY_AFTER_HEADER",
    "AdmissionQueue",
    "AdmissionRejected",
    "Backlog",
    "FailoverRateLimiter",
    "InMemoryRateLimiter",
    "LimitExceeded",
    "Limits",
    "QueueItem",
    "QueueRejected",
    "RateLimiter",
    "RedisRateLimiter",
    "RejectReason",
    "Reservation",
    "Usage",
    "gain_density",
    "make_rate_limiter",
]
