"""The configured backends, their routers and their health.

Backends serving the same model form a :class:`ModelGroup` with its own router over
:class:`~priority.routing.InstanceView`\\ s, each with the estimator of its backend's latency
profile — so an Ascend 910B and an A100 are compared in the same units (seconds of their own
estimated work). The gateway-side state GoRouting needs (in-flight prefills with timestamps,
decoding counts) is updated through the router's ``on_*`` callbacks as streams progress and
reconciled every ``scrape_interval_s`` against each backend's scraped ``vllm:*`` gauges.

Health is judged apart from that scrape, by a loop a few times a second
(:meth:`BackendPool._health_loop`):

* a **liveness probe** per backend every ``probe_interval_s``: ``GET /health`` within
  ``probe_timeout_s`` (any answer below 500 counts: an engine without the route is alive), so
  a frozen or dead engine is out of routing within about ``probe_interval_s +
  probe_timeout_s`` (0.75 s by default); a probe that times out while the backend's streams
  kept delivering is a busy engine, not a dead one (``tiergate_slow_probes_total``);
* the **watchdog** (:mod:`gateway.app.watchdog`): streams stalled past their stall timeout are
  ended, and an engine on which every stream waits with no event is taken out (a hung engine
  core still answers ``/health``);
* request outcomes: failures and timeouts count against the backend, successes reset the count.

All of it drives one :class:`~gateway.app.breaker.Breaker` per backend. When a breaker opens,
the attempts still waiting on that backend for their first token (or non-streamed answer) are
abandoned at once and retried elsewhere, rather than sitting out their own timeout. A breaker
opened for unreachability closes when ``/health`` answers again; one opened for
unresponsiveness closes on a successful 1-token trial request, sent while it is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session, sessionmaker

from gateway.app.breaker import Breaker, OpenReason, breaker_state
from gateway.app.engine_facts import EngineFacts, effective_engine, parse_engine_facts
from gateway.app.metrics import GatewayMetrics
from gateway.app.shared_queue import Publisher, backend_key, joined
from gateway.app.upstream import Upstream, UpstreamError, UpstreamTimeout
from gateway.app.watchdog import (
    EXTERNAL_PROMPT_TOKENS,
    STEP_MARGIN,
    StreamWatch,
    stalled_backends,
)
from gateway.db.crud import list_backends, load_stored_profiles
from gateway.settings import Settings
from priority.gain import GainWeights
from priority.profiles import Profile, load_profile
from priority.routing import InstanceView, Router, make_router
from priority.routing.goroute import own_prefills

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
TIMEOUT_PHASES = ("first_token", "response", "stall", "queued")
"""Values of ``phase`` in ``tiergate_upstream_timeouts_total``: ``record_timeout``'s, and
``queued`` — a first-token budget spent in a serving engine's own queue (no fault)."""
LOOP_LAG_TOLERANCE_S = 0.1
"""A health-loop tick later than this skips the watchdog: the event loop was blocked, so events
may sit unread in socket buffers and streams would look stalled when the gateway was."""


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
    max_model_len: int | None = None
    """The engine's context length (its config info, else ``/v1/models``)."""

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
    """Backends by model, with routing state, health probes and the circuit breaker."""

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
        self.streams: set[StreamWatch] = set()
        """Streams being relayed past their first token (the watchdog's view)."""
        self.lagged_at = -1e9
        """When the health loop last found the event loop late (its own tick overdue)."""
        self._tasks: list[asyncio.Task[None]] = []
        self.shared: Publisher | None = joined()
        """With several workers: this worker's side of the shared prefill table (else None)."""

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
                backend = Backend(spec, profile, view, self._new_breaker())
                backend.shared_key = backend_key(spec.name, spec.root_url, profile.name)
                backends.append(backend)
                self._declare(spec.name)
            router = self._make_router([b.view for b in backends])
            groups[model] = ModelGroup(model, backends, router)
        self.groups = groups
        if self.shared is not None:  # new routers start from empty queues: so do our rows
            self.shared.reset()
        if self.on_capacity is not None:
            self.on_capacity(self.capacity)

    def _declare(self, name: str) -> None:
        """Export the backend's failure counters at 0 from the start: a rate over a series that
        appears only with its first failure misses that failure, and a dashboard shows no line
        rather than a flat zero."""
        m = self.metrics
        m.upstream_failures.labels(name)
        for phase in TIMEOUT_PHASES:
            m.upstream_timeouts.labels(name, phase)
        for reason in OpenReason:
            m.breaker_opens.labels(name, reason.value)

    def _new_breaker(self) -> Breaker:
        return Breaker(self.settings.breaker_failures, self.settings.breaker_cooldown_s)

    def stall_threshold(self, backend: Backend) -> float:
        """How long every stream on ``backend`` may wait with no event before the watchdog calls
        it hung: STEP_MARGIN times the longest step it may be running, at least
        ``backend_stall_min_s``. That step, by the backend's profile: a prefill of every prompt
        token awaiting its first token there, up to the engine's token budget, over the cached
        part of the longest such prompt (its last chunk) — a prompt of EXTERNAL_PROMPT_TOKENS
        added if it runs work this gateway did not send — beside its decodes. An over-estimate
        (one chunk's cost grows with its square), which only delays the verdict."""
        engine = backend.profile.engine
        prompts = [r.prompt_tokens for r in backend.view.prefill_queue.values()]
        if backend.external:
            prompts.append(EXTERNAL_PROMPT_TOKENS)
        budget = engine.max_num_batched_tokens
        chunk = min(sum(prompts), budget)
        cached = max(0, max(prompts, default=0) - budget)
        decodes = min(backend.view.num_decoding, engine.max_num_seqs)
        step = backend.view.estimator.batch_time(
            prefill=[(chunk, cached)] if chunk else [],
            decode_kv=[EXTERNAL_PROMPT_TOKENS // 4] * decodes,
        )
        return max(self.settings.backend_stall_min_s, STEP_MARGIN * step)

    # ---- prefills queued by the other workers ---------------------------------------------

    def queueing(self, backend: Backend, now: float) -> bool:
        """Whether a request without its first token here is waiting in a serving engine's
        queue rather than on a broken one: the engine takes requests, its liveness probe
        passed, and it either reported requests waiting at the last scrape or sent events for
        other streams within the time its longest step may take."""
        if not backend.breaker.routable(now) or backend.check_ok is False:
            return False
        return (backend.waiting or 0) > 0 or now - backend.last_event <= self.stall_threshold(
            backend
        )

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

    def _capacity_changed(self) -> None:
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
        if facts.max_model_len is not None:
            backend.max_model_len = facts.max_model_len
        engine, mismatches = effective_engine(configured.engine, facts)
        if engine != backend.profile.engine:
            backend.profile = replace(backend.profile, engine=engine)
            backend.view.profile = backend.profile
            self.metrics.backend_seats.labels(backend.name).set(engine.max_num_seqs)
            self._capacity_changed()
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

    # ---- circuit breaker ----------------------------------------------------------------

    def record_failure(self, backend: Backend, *, counts: bool = True) -> None:
        """A request attempt failed here. ``counts=False``: it was abandoned because the
        breaker had opened already, so it says nothing new about the backend."""
        self.metrics.upstream_failures.labels(backend.name).inc()
        if counts and backend.breaker.failure(time.monotonic()):
            self._opened(backend, f"{backend.breaker.failures} failures in a row")

    def record_timeout(self, backend: Backend, phase: str) -> None:
        """An attempt ran out of time (``first_token``, ``response`` or ``stall``): a failure,
        and a reason to probe the backend's liveness now rather than at the next period."""
        self.metrics.upstream_timeouts.labels(backend.name, phase).inc()
        self.record_failure(backend)
        backend.next_probe = 0.0

    def record_success(self, backend: Backend) -> None:
        """A request got its first token (or whole answer) here."""
        if backend.breaker.success():
            self._closed(backend, "a request succeeded")

    def trip(self, backend: Backend, reason: OpenReason, detail: str) -> None:
        """Open the breaker for ``reason`` (probe failure, watchdog)."""
        if backend.breaker.trip(time.monotonic(), reason):
            self._opened(backend, detail)
        else:
            self._sync(backend)

    def _opened(self, backend: Backend, detail: str) -> None:
        reason = backend.breaker.reason
        assert reason is not None
        if reason is OpenReason.UNREACHABLE:
            self._forget_load(backend)
        log.warning("backend %s: circuit open (%s: %s)", backend.name, reason.value, detail)
        self.metrics.breaker_opens.labels(backend.name, reason.value).inc()
        self._sync(backend)
        self._abandon_attempts(backend)

    def _closed(self, backend: Backend, detail: str) -> None:
        log.warning("backend %s: circuit closed (%s)", backend.name, detail)
        self._sync(backend)

    def _sync(self, backend: Backend) -> None:
        """The router sees the breaker's verdict (half-open after the cooldown)."""
        healthy = backend.breaker.routable(time.monotonic())
        if healthy != backend.view.healthy:
            backend.view.healthy = healthy
            self.metrics.backend_healthy.labels(backend.name).set(1.0 if healthy else 0.0)
            self._capacity_changed()

    @staticmethod
    def _abandon_attempts(backend: Backend) -> None:
        """Expire the deadlines of attempts waiting here: they fail over now."""
        if not backend.attempts:
            return
        now = asyncio.get_running_loop().time()
        for deadline in list(backend.attempts):
            if not deadline.expired():
                deadline.reschedule(now)

    # ---- probes -------------------------------------------------------------------------

    def start(self) -> None:
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [
                loop.create_task(self._scrape_loop(), name="scrapes"),
                loop.create_task(self._health_loop(), name="health"),
            ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        tasks += [b.probe_task for b in self.backends if b.probe_task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _scrape_loop(self) -> None:
        while True:
            await self.probe_all()
            await asyncio.sleep(self.settings.scrape_interval_s)

    async def probe_all(self) -> None:
        """Scrape every backend's load (``/metrics``)."""
        backends = self.backends
        await asyncio.gather(*(self.probe(b) for b in backends), return_exceptions=True)

    async def probe(self, backend: Backend) -> bool:
        """Scrape one backend's ``/metrics`` to correct the router's view of its load. Health is
        the liveness probe's business: a failed scrape only leaves the last numbers in place."""
        timeout = max(0.5, self.settings.scrape_interval_s)
        try:
            text = await self.upstream.get_text(backend.metrics_url, timeout)
            gauges = parse_vllm_gauges(text)
        except (UpstreamError, ValueError) as exc:
            log.info("backend %s: metrics scrape failed (%s)", backend.name, exc)
            return False
        self.reconcile(backend, gauges)
        facts = parse_engine_facts(text)
        if facts.max_model_len is None and backend.max_model_len is None:
            backend.max_model_len = await self._model_len(backend, timeout)
        self.learn_facts(backend, facts)
        self._export(backend)
        return True

    async def _model_len(self, backend: Backend, timeout: float) -> int | None:
        """``max_model_len`` of the backend's model from its ``/v1/models`` (vLLM lists it)."""
        try:
            body = json.loads(await self.upstream.get_text(backend.models_url, timeout))
            for model in body.get("data") or ():
                if model.get("id") == backend.spec.model:
                    value = model.get("max_model_len")
                    return int(value) if isinstance(value, int) and value > 0 else None
        except (UpstreamError, ValueError, AttributeError, TypeError) as exc:
            log.info("backend %s: /v1/models unreadable (%s)", backend.name, exc)
        return None

    async def _health_loop(self) -> None:
        """Liveness probes, half-opening breakers and the watchdog, a few times a second."""
        loop = asyncio.get_running_loop()
        tick = min(0.1, self.settings.probe_interval_s / 2)
        last = time.monotonic()
        while True:
            now = time.monotonic()
            self.metrics.loop_lag.observe(max(0.0, now - last - tick))
            on_time = now - last <= tick + LOOP_LAG_TOLERANCE_S
            if not on_time:
                self.lagged_at = now
            last = now
            try:
                for backend in self.backends:
                    self._sync(backend)
                    if backend.probe_task is None and now >= backend.next_probe:
                        backend.next_probe = now + self.settings.probe_interval_s
                        backend.probe_task = loop.create_task(self._check(backend))
                if on_time:
                    self._watch(now, loop.time())
                if self.shared is not None:
                    self.shared.beat(now)
            except Exception:  # a bug here must not end health checking for good
                log.exception("health loop tick failed")
            await asyncio.sleep(tick)

    def _watch(self, now: float, loop_now: float) -> None:
        floor = self.settings.backend_stall_min_s
        for backend, waited in stalled_backends(self.streams, now, loop_now, floor).items():
            silent = now - backend.last_event
            threshold = self.stall_threshold(backend)
            if min(waited, silent) > threshold and backend.breaker.routable(now):
                self.trip(
                    backend,
                    OpenReason.UNRESPONSIVE,
                    f"every stream waited {min(waited, silent):.2f} s with no event",
                )

    async def _check(self, backend: Backend) -> None:
        """One liveness probe, and a trial request if the breaker is open for unresponsiveness."""
        try:
            started = time.monotonic()
            try:
                status = await self.upstream.status(
                    backend.health_url, self.settings.probe_timeout_s
                )
            except UpstreamTimeout as exc:
                if time.monotonic() - self.lagged_at < 2 * self.settings.probe_timeout_s:
                    backend.next_probe = 0.0  # our own loop was late, maybe not the engine
                    return
                if backend.last_event >= started:
                    # its streams delivered while /health waited: the server that answers both
                    # is alive and busy (a loaded engine answers /health behind its tokens);
                    # a frozen or dead one sends nothing, and a hung engine core is the
                    # watchdog's to find
                    self.metrics.slow_probes.labels(backend.name).inc()
                    return
                self._checked(backend, ok=False)
                self.trip(backend, OpenReason.UNREACHABLE, f"liveness probe: {exc}")
                return
            except UpstreamError as exc:
                self._checked(backend, ok=False)
                self.trip(backend, OpenReason.UNREACHABLE, f"liveness probe: {exc}")
                return
            self._checked(backend, ok=status < 500)
            if status >= 500:  # vLLM's answer once its engine core died
                self.trip(backend, OpenReason.UNREACHABLE, f"liveness probe: HTTP {status}")
                return
            if backend.breaker.alive():
                self._closed(backend, "liveness probe answered")
            elif backend.breaker.reason is OpenReason.UNRESPONSIVE:
                await self._trial(backend)
        finally:
            backend.probe_task = None

    def _checked(self, backend: Backend, *, ok: bool) -> None:
        backend.checked_at, backend.check_ok = time.time(), ok
        if not ok:
            self._forget_load(backend)

    def _forget_load(self, backend: Backend) -> None:
        """An engine that fails its liveness probe: its last scraped numbers describe an engine
        that is gone, so the fleet view and the gauges stop showing them."""
        backend.running = backend.waiting = backend.kv_usage = None
        for gauge in (self.metrics.backend_running, self.metrics.backend_waiting):
            gauge.labels(backend.name).set(0)

    async def _trial(self, backend: Backend) -> None:
        """A 1-token completion: the only proof that an engine which answers ``/health`` but
        not requests serves again."""
        payload = json.dumps(
            {"model": backend.spec.model, "prompt": "ping", "max_tokens": 1, "stream": False}
        ).encode()
        response = None
        try:
            async with asyncio.timeout(self.settings.breaker_trial_timeout_s):
                response = await self.upstream.post_json(backend.completions_url, payload)
                body = await response.read()
            if response.status != 200 or not isinstance(json.loads(body), dict):
                raise ValueError(f"HTTP {response.status}")
        except (UpstreamError, TimeoutError, ValueError) as exc:
            log.info("backend %s: trial request failed (%s)", backend.name, exc or "timeout")
            self.trip(backend, OpenReason.UNRESPONSIVE, "trial request failed")
            return
        finally:
            if response is not None:
                response.close()
        if backend.breaker.success():
            self._closed(backend, "trial request succeeded")

    def reconcile(self, backend: Backend, gauges: dict[str, float]) -> None:
        """Correct the router's decoding count with the engine's own numbers.

        The engine runs our decoding requests plus, possibly, work the gateway did not send;
        ``running`` beyond what we account for is counted as extra decoding load (it interferes
        with prefills just the same). It never drops below our own count between scrapes'
        reconciliation, since our own requests are tracked exactly.

        With several workers, the prefills the *other* workers queued here are known from the
        shared table (:meth:`see_others`) and counted as queued prefill work; they are also in
        the engine's running/waiting, so they are subtracted with our own requests: a request
        is counted once, as prefill work until a first token is seen for it, then as load we
        did not send (the other workers' decoding requests).
        """
        backend.running = int(gauges.get(RUNNING, 0))
        backend.waiting = int(gauges.get(WAITING, 0))
        backend.kv_usage = gauges.get(KV_USAGE)
        self.see_others([backend])
        view = backend.view
        ours = backend.own_decoding + len(view.prefill_queue) + view.num_external_prefills
        external = max(0, backend.running + backend.waiting - ours)
        backend.external = external
        backend.view.num_decoding = backend.own_decoding + external

    def _export(self, backend: Backend) -> None:
        m, name = self.metrics, backend.name
        m.backend_healthy.labels(name).set(1.0 if backend.view.healthy else 0.0)
        m.backend_breaker.labels(name).set(breaker_state(backend.breaker, time.monotonic()))
        m.backend_prefills.labels(name).set(len(backend.view.prefill_queue))
        m.backend_prefills_others.labels(name).set(backend.view.num_external_prefills)
        m.backend_decoding.labels(name).set(backend.view.num_decoding)
        if backend.running is not None:
            m.backend_running.labels(name).set(backend.running)
            m.backend_waiting.labels(name).set(backend.waiting or 0)
        if backend.kv_usage is not None:
            m.backend_kv.labels(name).set(backend.kv_usage)

    def export_all(self) -> None:
        self.see_others(self.backends)
        for backend in self.backends:
            self._export(backend)

    @property
    def ready(self) -> bool:
        """At least one backend is healthy."""
        return any(b.view.healthy for b in self.backends)


def parse_vllm_gauges(text: str) -> dict[str, float]:
    """Running / waiting / KV usage from a ``/metrics`` body, summed over engines.

    A scan for the three sample lines rather than a full exposition parse: a vLLM ``/metrics``
    body is mostly histogram buckets, and ``prometheus_client``'s parser spent several ms of
    the event loop on each scrape (a latency spike for every request in flight).
    """
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        for name in _GAUGES:
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
                value = _sample_value(line, len(name))
                if value is None:
                    break
                if name == KV_USAGE:
                    found[name] = max(found.get(name, value), value)
                else:
                    found[name] = found.get(name, 0.0) + value
                break
    return found


_GAUGES = (RUNNING, WAITING, KV_USAGE)


def _sample_value(line: str, name_end: int) -> float | None:
    """The value of a sample line (after its labels, before an optional timestamp)."""
    rest = line[name_end:]
    if rest.startswith("{"):
        end = _labels_end(rest)
        if end < 0:
            return None
        rest = rest[end + 1 :]
    fields = rest.split()
    if not fields:
        return None
    try:
        return float(fields[0])
    except ValueError:
        return None


def _labels_end(text: str) -> int:
    """Index of the ``}`` closing a label set that starts at ``text[0]``, honouring quotes and
    escapes inside label values; -1 if it is not closed."""
    quoted = escaped = False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = quoted
        elif char == '"':
            quoted = not quoted
        elif char == "}" and not quoted:
            return i
    return -1
