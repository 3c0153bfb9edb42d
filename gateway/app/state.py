"""What every request handler (data plane and admin API) shares: ``app.state.gateway``.

Kept small on purpose: the admin API needs the session factory and secret for its CRUD, the
auth cache to make revocations effective at once, and the backend pool to reload after backend
changes; the data plane needs the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from gateway.app.accounting import record_spend
from gateway.app.kinds import RequestKinds
from gateway.app.slo_admission import SloAdmission
from gateway.app.stages import StageAttainment
from gateway.db.prices import PriceBook
from gateway.db.usage import UsageWriter
from gateway.limits import AdmissionQueue, RateLimiter
from gateway.limits.budget import BudgetGuard, BudgetRule, make_budget_guard
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.app.auth import AuthCache
    from gateway.app.backends import BackendPool
    from gateway.app.metrics import GatewayMetrics
    from gateway.db.length_samples import SampleWriter


@dataclass(eq=False)
class GatewayState:
    """The gateway's long-lived objects, created in the app's lifespan.

    * ``auth.invalidate(key_prefix=None)`` — drop cached identities (one key's, or all) after
      a revocation, expiry change, tenant or tier change;
    * ``await pool.reload()`` — re-read the enabled backends after a backend change.
    """

    settings: Settings
    session_factory: sessionmaker[Session]
    secret: str | bytes
    auth: AuthCache
    pool: BackendPool
    usage_writer: UsageWriter
    limiter: RateLimiter
    queue: AdmissionQueue
    metrics: GatewayMetrics
    kinds: RequestKinds = field(default_factory=RequestKinds)
    """Request kinds and agent workflows (:mod:`gateway.app.kinds`)."""
    length_samples: SampleWriter | None = None
    """Length samples of finished requests (``TIERGATE_LENGTHS_LEARN``), else None."""
    slo_admission: SloAdmission = field(default_factory=SloAdmission)
    """What this worker placed on engines that run SLOs-Serve's planner
    (:mod:`gateway.app.slo_admission`)."""
    stages: StageAttainment = field(default_factory=StageAttainment)
    """Tool-calling conversations and whether every stage so far met its SLO
    (:mod:`gateway.app.stages`)."""

    budget_guard: BudgetGuard | None = None
    """The budgets' guard when given (tests); else built from the settings: :attr:`budgets`."""

    def __post_init__(self) -> None:
        if self.usage_writer.on_priced is None:  # each charged record adds to the spend metric
            self.usage_writer.on_priced = partial(record_spend, self.metrics)
        if self.budget_guard is None:
            config = self.settings
            self.budget_guard = make_budget_guard(
                self.session_factory,
                redis_url=config.redis_url,
                prefix=config.redis_prefix,
                share=config.limits_share or config.workers or 1,
                timeout_s=config.redis_timeout_s,
                on_refused=self._budget_refused,
                on_soft=self._budget_soft,
                on_change=self.metrics.budget_switched,
                prices=self.prices,
            )

    @property
    def budgets(self) -> BudgetGuard:
        """Spend budgets at admission (:mod:`gateway.limits.budget`): ``reserve`` a request's
        maximum cost, ``settle`` to what it cost (Redis when configured)."""
        assert self.budget_guard is not None
        return self.budget_guard

    def _budget_refused(self, rule: BudgetRule) -> None:
        self.metrics.budget_rejections.labels(rule.scope, rule.period).inc()

    def _budget_soft(self, rule: BudgetRule, spent: object) -> None:
        self.metrics.budget_soft.labels(rule.scope, rule.period).inc()

    @property
    def prices(self) -> PriceBook:
        """The model prices in force (:mod:`gateway.db.prices`), the usage writer's copy: a
        record is charged at what a budget reserved against."""
        return self.usage_writer.prices


def get_state(request: Request) -> GatewayState:
    """The app's :class:`GatewayState`."""
    state: GatewayState = request.app.state.gateway
    return state


async def _state_dependency(request: Request) -> GatewayState:
    # ``async``: FastAPI runs a plain-function dependency in its thread pool (a thread hop and
    # a GIL hand-off per request).
    return get_state(request)


StateDep = Annotated[GatewayState, Depends(_state_dependency)]
"""Handler parameter type: ``async def handler(state: StateDep) -> ...``."""
