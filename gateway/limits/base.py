"""Admission-control contracts: tenant limits, reservations, rejections and the limiter interface.

A request is admitted by *reserving* before it runs — one request, its estimated tokens (prompt
plus expected output) and one concurrency slot, checked and taken in one atomic step — and
*reconciled* after it finishes, when its real token count is known. Checking before and counting
after (as many gateways do) lets a burst of concurrent requests all pass the check before any of
them is counted; reserving up front closes that race.

Windows (RPM, TPM) are **sliding logs** over ``window_s`` (60 s): every admitted request is kept
with its admission time and its token count until it is ``window_s`` old. The log is exact — in
no interval of length ``window_s`` are more than ``rpm`` requests (or, counting reservations,
``tpm`` tokens) admitted — and its retry-after is exact too: the time until enough of the oldest
entries leave the window for the rejected request to fit. It costs one entry per admitted request
per window (bounded by ``rpm`` when an RPM limit is set), which is small next to the requests
themselves. (A two-bucket sliding counter is O(1) but assumes uniform arrivals in the previous
bucket and can admit up to twice the limit in a real 60 s interval; it cannot keep the promise
above.)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum

WINDOW_S = 60.0
"""Length of the RPM/TPM sliding window."""

DEFAULT_SLOT_TTL_S = 900.0
"""Lease of a concurrency slot: a reservation whose holder crashed frees its slot after this.

Without renewal it must exceed the gateway's longest request (its upstream timeout), or a live
request would lose its slot and the tenant could briefly exceed its concurrency limit. The Redis
limiter as the gateway builds it (:func:`~gateway.limits.failover.make_rate_limiter`) renews its
leases while requests run and uses a 30 s lease instead, so a crash leaks slots for seconds.
"""

DEFAULT_CONCURRENCY_RETRY_AFTER_S = 1.0
"""Retry hint for a concurrency rejection: slots free when requests finish, which no window
predicts, so a short constant is the honest answer."""

REJECT_REASON_HEADER = "x-tiergate-reject-reason"
RETRY_AFTER_HEADER = "retry-after"


class RejectReason(StrEnum):
    """Why admission refused a request: the value of the ``x-tiergate-reject-reason`` header."""

    RATE_LIMIT_RPM = "rate_limit_rpm"
    RATE_LIMIT_TPM = "rate_limit_tpm"
    CONCURRENCY = "concurrency"
    QUEUE_FULL = "queue_full"
    BUDGET_EXCEEDED = "budget_exceeded"
    """The tenant's or the key's spend budget for the period would be exceeded (429 with
    ``retry-after`` until the period ends: :mod:`gateway.limits.budget`)."""
    QUEUE_TTL = "queue_ttl"
    SLO_INFEASIBLE = "slo_infeasible"
    SLO_UNATTAINABLE = "slo_unattainable"
    """Overload: the predicted first token, queue wait included, is later than the TTFT
    objective allows (``shed_slack``); refused at admission or when the wait in the queue made
    it so (``docs/operations/overload.md``)."""
    SLO_DECLINED = "slo_declined"
    """The admission planner of every engine that runs one (SLOs-Serve) declined it: none can
    serve it within its SLO now (:mod:`gateway.app.slo_admission`)."""

    @property
    def status_code(self) -> int:
        """429 when the client should slow down, 503 when the gateway cannot serve it in time."""
        if self in (
            RejectReason.QUEUE_TTL,
            RejectReason.SLO_INFEASIBLE,
            RejectReason.SLO_UNATTAINABLE,
            RejectReason.SLO_DECLINED,
        ):
            return 503
        return 429


class AdmissionRejected(Exception):
    """A request refused by admission control, with what the HTTP layer needs to answer it.

    ``retry_after_s`` is ``None`` when waiting cannot help (a request larger than the tenant's
    whole TPM limit) or nothing sensible can be promised.
    """

    def __init__(self, reason: RejectReason, retry_after_s: float | None, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.message = message

    @property
    def status_code(self) -> int:
        return self.reason.status_code

    def headers(self) -> dict[str, str]:
        """``x-tiergate-reject-reason`` and, when known, ``retry-after`` (whole seconds, >= 1)."""
        headers = {REJECT_REASON_HEADER: self.reason.value}
        if self.retry_after_s is not None:
            headers[RETRY_AFTER_HEADER] = str(max(1, math.ceil(self.retry_after_s)))
        return headers

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.reason.value!r}, "
            f"retry_after_s={self.retry_after_s!r}, {self.message!r})"
        )


class LimitExceeded(AdmissionRejected):
    """Raised by :meth:`RateLimiter.reserve` when a tenant limit would be exceeded."""


@dataclass(frozen=True, slots=True)
class Limits:
    """A tenant's limits; ``None`` means unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "max_concurrency"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class Reservation:
    """What :meth:`RateLimiter.reserve` took for one request.

    Times are on the limiter's clock (monotonic in-process, Redis server time for Redis);
    ``expires_at_s`` is when the concurrency slot is reclaimed if never reconciled or released.
    """

    reservation_id: str
    tenant: str
    tokens: int
    reserved_at_s: float
    expires_at_s: float
    held: bool = True
    """False when nothing was taken (an unlimited tenant): reconciling it does nothing."""


@dataclass(frozen=True, slots=True)
class Usage:
    """A tenant's usage now: requests and tokens in the window, concurrency slots held."""

    requests: int
    tokens: int
    in_flight: int


def check_tokens(tokens: int) -> None:
    if isinstance(tokens, bool) or tokens < 0:
        raise ValueError(f"token counts must be non-negative integers, got {tokens!r}")


def too_large_for_tpm(tokens: int, tpm: int) -> LimitExceeded:
    """The rejection of a request that no amount of waiting lets through."""
    return LimitExceeded(
        RejectReason.RATE_LIMIT_TPM,
        None,
        f"request needs {tokens} tokens, more than the tenant's limit of {tpm} tokens per minute",
    )


def rejection(reason: RejectReason, retry_after_s: float | None, limits: Limits) -> LimitExceeded:
    """A :class:`LimitExceeded` with the message for ``reason``."""
    messages = {
        RejectReason.RATE_LIMIT_RPM: f"rate limit of {limits.rpm} requests per minute reached",
        RejectReason.RATE_LIMIT_TPM: f"rate limit of {limits.tpm} tokens per minute reached",
        RejectReason.CONCURRENCY: f"limit of {limits.max_concurrency} concurrent requests reached",
    }
    return LimitExceeded(reason, retry_after_s, messages[reason])


class RateLimiter(ABC):
    """Per-tenant RPM, TPM and concurrency, reserved atomically before a request runs.

    Token policy: ``reserve`` counts the estimate (prompt + expected output) so that concurrent
    requests see each other at once; ``reconcile`` replaces it with the real count. A request that
    fails or is cancelled is ``release``\\ d: its slot is freed, it still counts as a request (an
    attempt was made; refunding it would let a client retry-storm past its RPM), and it counts
    only the tokens it actually consumed (0 if it never reached an engine). Reconciling after the
    request has left the window changes nothing — the window no longer holds it. Reconcile and
    release are idempotent: the last call sets the count.
    """

    def __init__(
        self,
        *,
        window_s: float = WINDOW_S,
        slot_ttl_s: float = DEFAULT_SLOT_TTL_S,
        concurrency_retry_after_s: float = DEFAULT_CONCURRENCY_RETRY_AFTER_S,
    ) -> None:
        if window_s <= 0 or slot_ttl_s <= 0 or concurrency_retry_after_s < 0:
            raise ValueError("window_s and slot_ttl_s must be positive")
        self.window_s = window_s
        self.slot_ttl_s = slot_ttl_s
        self.concurrency_retry_after_s = concurrency_retry_after_s

    @property
    def mode(self) -> str:
        """Where limits are kept now, as readiness reports it: ``local``, ``redis`` or
        ``degraded-local`` (Redis configured but unreachable: per-process shares)."""
        return "local"

    @abstractmethod
    async def reserve(self, tenant: str, limits: Limits, tokens: int) -> Reservation:
        """Take 1 request, ``tokens`` tokens and 1 concurrency slot, or take nothing.

        Raises :class:`LimitExceeded` naming the first limit that would be exceeded (RPM, then
        TPM, then concurrency) with the time until it would fit; a request larger than the whole
        TPM limit is refused first, with no retry-after, since waiting cannot help it.
        """

    @abstractmethod
    async def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        """Count ``actual_tokens`` instead of the reserved estimate and free the slot."""

    async def release(self, reservation: Reservation, consumed_tokens: int = 0) -> None:
        """Free the slot of a failed or cancelled request, counting only what it consumed."""
        await self.reconcile(reservation, consumed_tokens)

    @abstractmethod
    async def usage(self, tenant: str) -> Usage:
        """The tenant's current usage (for metrics, the admin API and tests)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, nothing to close by default
        """Close connections the limiter owns."""
