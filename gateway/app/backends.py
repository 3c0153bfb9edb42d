"""The configured backends, their routers and their health.

Backends serving the same model form a :class:`ModelGroup` with its own router over
:class:`~priority.routing.InstanceView`\\ s, each with the estimator of its backend's latency
profile — so an Ascend 910B and an A100 are compared in the same units (seconds of their own
estimated work). The gateway-side state GoRouting needs (in-flight prefills with timestamps,
decoding counts) is updated through the router's ``on_*`` callbacks as streams progress and
reconciled every ``scrape_interval_s`` against each backend's scraped ``vllm:*`` gauges. The
scrape doubles as the active health probe; probes and request failures drive a circuit breaker
that takes a backend out of routing for ``breaker_cooldown_s`` after ``breaker_failures``
consecutive failures (then it is tried again: one more failure re-opens it at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from gateway.app.metrics import GatewayMetrics
from gateway.app.upstream import Upstream, UpstreamError
from gateway.db.crud import list_backends, load_stored_profiles
from gateway.settings import Settings
from priority.gain import GainWeights
from priority.profiles import Profile, load_profile
from priority.routing import InstanceView, Router, make_router

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"


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
    view: InstanceView
    failures: int = 0
    open_until: float = 0.0
    """Monotonic time until which the breaker keeps the backend out (0: closed)."""
    own_decoding: int = 0
    """Requests of this gateway past their first token here (the router's n_d before scrape)."""
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None

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
        self._task: asyncio.Task[None] | None = None

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
                backends.append(Backend(spec, profile, view))
            router = self._make_router([b.view for b in backends])
            groups[model] = ModelGroup(model, backends, router)
        self.groups = groups
        if self.on_capacity is not None:
            self.on_capacity(self.capacity)

    def _make_router(self, views: list[InstanceView]) -> Router:
        if self.settings.router == "goroute":
            return make_router("goroute", views, weights=self.weights)
        return make_router(self.settings.router, views)

    @property
    def backends(self) -> list[Backend]:
        return [b for g in self.groups.values() for b in g.backends]

    def group(self, model: str) -> ModelGroup | None:
        return self.groups.get(model)

    @property
    def capacity(self) -> int:
        """Dispatch slots the fleet offers: the sum of the backends' ``max_num_seqs``."""
        return sum(b.profile.engine.max_num_seqs for b in self.backends)

    # ---- circuit breaker ----------------------------------------------------------------

    def record_failure(self, backend: Backend) -> None:
        backend.failures += 1
        self.metrics.upstream_failures.labels(backend.name).inc()
        if backend.failures >= self.settings.breaker_failures:
            backend.open_until = time.monotonic() + self.settings.breaker_cooldown_s
            if backend.view.healthy:
                log.warning(
                    "backend %s: circuit open after %d failures", backend.name, backend.failures
                )
            backend.view.healthy = False

    def record_success(self, backend: Backend) -> None:
        backend.failures = 0
        backend.open_until = 0.0
        backend.view.healthy = True

    def _refresh_breaker(self, backend: Backend, now: float) -> None:
        """Half-open an expired breaker: one more failure re-opens it (failures stay high)."""
        if not backend.view.healthy and backend.open_until <= now:
            backend.view.healthy = True

    # ---- probes -------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._probe_loop(), name="probes")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _probe_loop(self) -> None:
        while True:
            await self.probe_all()
            await asyncio.sleep(self.settings.scrape_interval_s)

    async def probe_all(self) -> None:
        backends = self.backends
        await asyncio.gather(*(self.probe(b) for b in backends), return_exceptions=True)

    async def probe(self, backend: Backend) -> bool:
        """Scrape one backend's ``/metrics``; success closes its breaker, failure counts."""
        timeout = max(0.5, self.settings.scrape_interval_s)
        try:
            text = await self.upstream.get_text(backend.metrics_url, timeout)
            gauges = parse_vllm_gauges(text)
        except (UpstreamError, ValueError) as exc:
            log.info("backend %s: probe failed (%s)", backend.name, exc)
            self.record_failure(backend)
            self._refresh_breaker(backend, time.monotonic())
            self._export(backend)
            return False
        self.record_success(backend)
        self.reconcile(backend, gauges)
        self._export(backend)
        return True

    def reconcile(self, backend: Backend, gauges: dict[str, float]) -> None:
        """Correct the router's decoding count with the engine's own numbers.

        The engine runs our decoding requests plus, possibly, work the gateway did not send;
        ``running`` beyond what we account for is counted as extra decoding load (it interferes
        with prefills just the same). It never drops below our own count between scrapes'
        reconciliation, since our own requests are tracked exactly.
        """
        backend.running = int(gauges.get(RUNNING, 0))
        backend.waiting = int(gauges.get(WAITING, 0))
        backend.kv_usage = gauges.get(KV_USAGE)
        ours = backend.own_decoding + len(backend.view.prefill_queue)
        external = max(0, backend.running + backend.waiting - ours)
        backend.view.num_decoding = backend.own_decoding + external

    def _export(self, backend: Backend) -> None:
        m, name = self.metrics, backend.name
        m.backend_healthy.labels(name).set(1.0 if backend.view.healthy else 0.0)
        m.backend_prefills.labels(name).set(len(backend.view.prefill_queue))
        m.backend_decoding.labels(name).set(backend.view.num_decoding)
        if backend.running is not None:
            m.backend_running.labels(name).set(backend.running)
            m.backend_waiting.labels(name).set(backend.waiting or 0)
        if backend.kv_usage is not None:
            m.backend_kv.labels(name).set(backend.kv_usage)

    def export_all(self) -> None:
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
