"""The configured backends: the registry of what is served, by model, and its routers.

Backends serving the same model form a :class:`ModelGroup` with its own router over
:class:`~priority.routing.InstanceView`\\ s, each with the estimator of its backend's latency
profile — so an Ascend 910B and an A100 are compared in the same units (seconds of their own
estimated work). The gateway-side state GoRouting needs (in-flight prefills with timestamps,
decoding counts) is updated through the router's ``on_*`` callbacks as streams progress and
reconciled every ``scrape_interval_s`` against each backend's scraped ``vllm:*`` gauges
(:mod:`gateway.app.backend_scrapes`). Health — a breaker per backend, liveness probes, the
watchdog — is :mod:`gateway.app.backend_health`'s.

:class:`BackendPool` holds the registry and answers for all three: its health and scrape
methods hand the call to :attr:`BackendPool.health` and :attr:`BackendPool.scrapes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session, sessionmaker

from gateway.app.backend_health import BackendHealth
from gateway.app.backend_scrapes import LoadScrapes, ModelCard
from gateway.app.breaker import Breaker, OpenReason
from gateway.app.engine_facts import EngineFacts, effective_engine
from gateway.app.metrics import GatewayMetrics
from gateway.app.shared_queue import Publisher, backend_key, joined
from gateway.app.upstream import Upstream
from gateway.app.watchdog import StreamWatch
from gateway.db.crud import list_backends, load_stored_profiles
from gateway.settings import Settings
from priority.gain import GainWeights
from priority.profiles import Profile, load_profile
from priority.routing import InstanceView, Router, make_router
from priority.routing.goroute import own_prefills

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One engine to route to (a row of the backends table, or given directly to the app)."""

    name: str
    base_url: str
    """The engine's root URL (``http://host:8000``); a trailing ``/v1`` is accepted."""
    model: str
    profile: str | Profile
    kind: str = "vllm"

    @property
    def root_url(self) -> str:
        return self.base_url.rstrip("/").removesuffix("/v1")


@dataclass(eq=False)
class Backend:
    """A backend at run time: its instance view, breaker and last scraped load."""

    spec: BackendSpec
    profile: Profile
    """The profile routed and admitted with: the registered one, its engine block replaced by
    what the engine says it is (:meth:`BackendPool.learn_facts`)."""
    view: InstanceView
    breaker: Breaker = field(default_factory=lambda: Breaker(threshold=3, cooldown_s=5.0))
    """The pool gives each backend one from its settings (the default is theirs)."""
    own_decoding: int = 0
    """Requests of this gateway past their first token here (the router's n_d before scrape)."""
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    external: int = 0
    """Requests running or waiting here at the last scrape that this gateway did not send."""
    last_event: float = 0.0
    """Monotonic time the last upstream read from this backend brought data."""
    attempts: set[asyncio.Timeout] = field(default_factory=set)
    """Deadlines of attempts waiting here for a first token or a non-streamed answer."""
    shared_key: float = 0.0
    """This backend's key in the workers' shared prefill table (:mod:`gateway.app.shared_queue`)."""
    next_probe: float = 0.0
    probe_task: asyncio.Task[None] | None = None
    scrape_task: asyncio.Task[bool] | None = None
    """The load scrape in flight (:class:`~gateway.app.backend_scrapes.LoadScrapes`)."""
    checked_at: float | None = None
    """Wall-clock time (epoch s) of the last liveness probe's verdict; None before the first."""
    check_ok: bool | None = None
    """That verdict: ``/health`` answered below 500 in time (the fleet view shows it)."""
    configured: Profile | None = None
    """The profile as registered (None: the same as :attr:`profile`)."""
    facts: EngineFacts | None = None
    """What the engine said it is at the last scrape (None before the first)."""
    mismatches: dict[str, str] = field(default_factory=dict)
    """Where the registered profile disagrees with the engine, by field (the engine's value is
    used), each worded for an operator."""
    card: ModelCard | None = None
    """The engine's model card (``/v1/models``), read by the load scrapes; None before the
    first read."""

    @property
    def max_model_len(self) -> int | None:
        """The engine's context length: its config info, else its model card."""
        if self.facts is not None and self.facts.max_model_len is not None:
            return self.facts.max_model_len
        return self.card.max_model_len if self.card is not None else None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def chat_url(self) -> str:
        return f"{self.spec.root_url}/v1/chat/completions"

    @property
    def completions_url(self) -> str:
        return f"{self.spec.root_url}/v1/completions"

    @property
    def metrics_url(self) -> str:
        return f"{self.spec.root_url}/metrics"

    @property
    def health_url(self) -> str:
        return f"{self.spec.root_url}/health"

    @property
    def models_url(self) -> str:
        return f"{self.spec.root_url}/v1/models"


@dataclass(eq=False)
class ModelGroup:
    """The backends serving one model, and the router that chooses among them."""

    model: str
    backends: list[Backend]
    router: Router
    created: int = field(default_factory=lambda: int(time.time()))


class BackendPool:
    """Backends by model, with their routers; health (:attr:`health`) and load scrapes
    (:attr:`scrapes`) run beside the registry."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        metrics: GatewayMetrics,
        *,
        session_factory: sessionmaker[Session] | None = None,
        specs: Sequence[BackendSpec] | None = None,
        weights: GainWeights | None = None,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.metrics = metrics
        self.weights = weights or GainWeights()
        self._factory = session_factory
        self._fixed = list(specs) if specs is not None else None
        self.groups: dict[str, ModelGroup] = {}
        self.on_capacity: Callable[[int], None] | None = None
        """Called with the new :attr:`capacity` after each (re)configuration."""
        self._tasks: list[asyncio.Task[None]] = []
        self.shared: Publisher | None = joined()
        """With several workers: this worker's side of the shared prefill table (else None)."""
        self.health = BackendHealth(self)
        self.scrapes = LoadScrapes(self)

    # ---- configuration ------------------------------------------------------------------

    async def reload(self) -> None:
        """Re-read the enabled backends (from the database unless fixed at construction).

        Routing state of backends still configured the same way is lost (a new router starts
        from empty queues, corrected by the next scrape); requests in flight finish normally.
        """
        specs = self._fixed
        if specs is None:
            specs = await asyncio.to_thread(self._read_specs)
        self.configure(specs)

    async def refresh(self) -> bool:
        """Reload only if the backends table differs from what is served; True if it did.

        An admin change reloads the pool of the one gateway process that made it; the other
        workers and replicas (and every process, after a change made with the CLI) pick it up
        here, periodically (``gateway.app.app._refresh_backends``).
        """
        if self._fixed is not None:
            return False
        specs = await asyncio.to_thread(self._read_specs)
        current = sorted((b.spec for b in self.backends), key=lambda s: s.name)
        if sorted(specs, key=lambda s: s.name) == current:
            return False
        self.configure(specs)
        return True

    def _read_specs(self) -> list[BackendSpec]:
        """The enabled backends; a stored (imported) profile is read here, as a ``Profile``."""
        assert self._factory is not None
        with self._factory() as session:
            rows = list_backends(session, enabled=True)
            stored = load_stored_profiles(session, {b.profile for b in rows})
            return [
                BackendSpec(b.name, b.base_url, b.model, stored.get(b.profile, b.profile), b.kind)
                for b in rows
            ]

    def configure(self, specs: Sequence[BackendSpec]) -> None:
        by_model: dict[str, list[BackendSpec]] = {}
        for spec in specs:
            by_model.setdefault(spec.model, []).append(spec)
        groups: dict[str, ModelGroup] = {}
        for model, members in by_model.items():
            backends = []
            for index, spec in enumerate(members):
                profile = (
                    spec.profile
                    if isinstance(spec.profile, Profile)
                    else load_profile(spec.profile)
                )
                view = InstanceView(index, spec.name, profile, profile.estimator())
                backend = Backend(spec, profile, view, self.health.new_breaker())
                backend.shared_key = backend_key(spec.name, spec.root_url, profile.name)
                backends.append(backend)
                self.health.declare(spec.name)
            router = self._make_router([b.view for b in backends])
            groups[model] = ModelGroup(model, backends, router)
        self.groups = groups
        if self.shared is not None:  # new routers start from empty queues: so do our rows
            self.shared.reset()
        if self.on_capacity is not None:
            self.on_capacity(self.capacity)

    def queue_changed(self, backend: Backend) -> None:
        """This worker's prefill queue on ``backend`` changed (dispatch, first token, end):
        publish its summary to the other workers (nothing to do in a single process)."""
        if self.shared is not None:
            self.shared.publish(backend.shared_key, own_prefills(backend.view), time.monotonic())

    def see_others(self, backends: Sequence[Backend]) -> None:
        """Bring ``backends``' views of the other workers' queued prefills up to date (before a
        routing decision). An unchanged summary is left in place: it keeps the router's memo."""
        if self.shared is None:
            return
        others = self.shared.others(time.monotonic())
        for backend in backends:
            summary = others.get(backend.shared_key)
            if summary != backend.view.external_prefills:
                backend.view.external_prefills = summary

    def _make_router(self, views: list[InstanceView]) -> Router:
        if self.settings.router == "goroute":
            return make_router("goroute", views, weights=self.weights)
        return make_router(self.settings.router, views)

    @property
    def reads_database(self) -> bool:
        """True when the pool serves the backends table; False for specs given at construction
        (``tiergate serve``'s emulated engines, tests)."""
        return self._fixed is None

    @property
    def backends(self) -> list[Backend]:
        return [b for g in self.groups.values() for b in g.backends]

    def group(self, model: str) -> ModelGroup | None:
        return self.groups.get(model)

    @property
    def capacity(self) -> int:
        """Dispatch slots the fleet offers: the seats (``max_num_seqs``, the engine's own where
        it says) of the backends that take requests now. A backend whose breaker opens leaves
        the admission budget at once, rather than holding requests for seats that are gone."""
        return sum(b.profile.engine.max_num_seqs for b in self.backends if b.view.healthy)

    def capacity_changed(self) -> None:
        if self.on_capacity is not None:
            self.on_capacity(self.capacity)

    # ---- what the engine says it is ------------------------------------------------------

    def learn_facts(self, backend: Backend, facts: EngineFacts) -> None:
        """Take the engine's seats, limits and estimator over the registered profile's.

        The profile keeps supplying what the engine does not state; every disagreement is
        logged once (when it appears or changes), exported as
        ``tiergate_backend_config_mismatch`` and shown in the fleet view. The engine's refitted
        coefficients and beta replace the router's estimator for this backend, so routing
        predicts with the estimator the engine schedules with.
        """
        configured = backend.configured or backend.profile
        backend.configured = configured
        backend.facts = facts
        engine, mismatches = effective_engine(configured.engine, facts)
        if engine != backend.profile.engine:
            backend.profile = replace(backend.profile, engine=engine)
            backend.view.profile = backend.profile
            self.metrics.backend_seats.labels(backend.name).set(engine.max_num_seqs)
            self.capacity_changed()
        if mismatches != backend.mismatches:
            for name, text in mismatches.items():
                if backend.mismatches.get(name) != text:
                    log.warning(
                        "backend %s: profile %s disagrees with the engine (%s); using the engine's",
                        backend.name,
                        configured.name,
                        text,
                    )
            for name in backend.mismatches.keys() | mismatches.keys():
                self.metrics.backend_config_mismatch.labels(backend.name, name).set(
                    1.0 if name in mismatches else 0.0
                )
            backend.mismatches = mismatches
        estimator = backend.view.estimator
        if facts.coefficients is not None and (
            facts.coefficients != estimator.coefficients
            or (facts.beta is not None and facts.beta != estimator.beta)
        ):
            estimator.adopt(facts.coefficients, facts.beta or 1.0)
        elif facts.coefficients is None and facts.beta is not None and facts.beta != estimator.beta:
            estimator.adopt(estimator.coefficients, facts.beta)  # an engine without a refit

    # ---- health and load, by their modules ------------------------------------------------

    @property
    def streams(self) -> set[StreamWatch]:
        """Streams being relayed past their first token (the watchdog's view)."""
        return self.health.streams

    def stall_threshold(self, backend: Backend) -> float:
        return self.health.stall_threshold(backend)

    def queueing(self, backend: Backend, now: float) -> bool:
        return self.health.queueing(backend, now)

    def record_failure(self, backend: Backend, *, counts: bool = True) -> None:
        self.health.record_failure(backend, counts=counts)

    def record_timeout(self, backend: Backend, phase: str) -> None:
        self.health.record_timeout(backend, phase)

    def record_success(self, backend: Backend) -> None:
        self.health.record_success(backend)

    def trip(self, backend: Backend, reason: OpenReason, detail: str) -> None:
        self.health.trip(backend, reason, detail)

    async def probe_all(self) -> None:
        await self.scrapes.probe_all()

    async def probe(self, backend: Backend) -> bool:
        return await self.scrapes.probe(backend)

    def reconcile(self, backend: Backend, gauges: dict[str, float]) -> None:
        self.scrapes.reconcile(backend, gauges)

    def export_all(self) -> None:
        self.scrapes.export_all()

    def start(self) -> None:
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [
                loop.create_task(self.scrapes.loop(), name="scrapes"),
                loop.create_task(self.health.loop(), name="health"),
            ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        tasks += [b.probe_task for b in self.backends if b.probe_task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def ready(self) -> bool:
        """At least one backend is healthy."""
        return any(b.view.healthy for b in self.backends)
