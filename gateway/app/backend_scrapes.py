"""Load scrapes: each backend's ``/metrics`` every ``scrape_interval_s``.

A scrape corrects the router's view of the backend's load with the engine's own ``vllm:*``
gauges (:meth:`LoadScrapes.reconcile`), learns what the engine says it is (its seats, limits and
refitted estimator: :meth:`~gateway.app.backends.BackendPool.learn_facts`) and exports the
backend's gauges. Health is not judged here: a failed scrape leaves the last numbers in place
(:mod:`gateway.app.backend_health` decides whether the backend is up).

The first scrape also reads the engine's model card (``GET /v1/models``: its ``max_model_len``,
and whether it is the emulated engine, which counts prompt tokens as :mod:`gateway.tokens`
does); the card is the pool's only reader of ``/v1/models``, kept on the backend
(:class:`ModelCard`) for the context-length check (:mod:`gateway.app.context`). It is read again
every :data:`CARD_REFRESH_S` (an engine restarted with another ``--max-model-len`` under the same
address), or :data:`CARD_RETRY_S` after a read that gave no length, always in the scrape, never
on a request's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from gateway.app.breaker import breaker_state
from gateway.app.engine_facts import parse_engine_facts
from gateway.app.upstream import Upstream, UpstreamError

if TYPE_CHECKING:
    from gateway.app.backends import Backend, BackendPool

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"


SCRAPE_TIMEOUT_INTERVALS = 4
"""A scrape may take this many intervals (at least 1 s): a late answer is still the engine's
newest count, and the loop does not wait for it (a busy vLLM CPU engine's ``/metrics`` took
over 0.5 s in the real-engine suite)."""


def scrape_timeout_s(interval_s: float) -> float:
    return max(1.0, SCRAPE_TIMEOUT_INTERVALS * interval_s)


CARD_REFRESH_S: Final = 300.0
"""How old a card with a length may be before a scrape reads it again."""
CARD_RETRY_S: Final = 30.0
"""How long a card that gave no length (unreadable, or no entry for the model) is kept before
a scrape asks again: until then the backend's window is unknown and the engine alone decides."""


@dataclass(frozen=True, slots=True)
class ModelCard:
    """The backend's model as the engine's ``/v1/models`` lists it (vLLM's shape)."""

    max_model_len: int | None
    """None: no card, or none with a length for this model."""
    emulated: bool
    """The card's ``tiergate.emulated``: the engine counts prompt tokens as the gateway does."""
    read_at: float
    """Monotonic time of the read (a failed refresh of a known card moves it too)."""

    def due(self, now: float) -> bool:
        """Whether a scrape should read the card again."""
        age = now - self.read_at
        return age >= (CARD_REFRESH_S if self.max_model_len is not None else CARD_RETRY_S)


def parse_model_card(document: Any, model: str, now: float) -> ModelCard:
    """The card of ``model`` in a ``/v1/models`` answer."""
    entries = document.get("data") if isinstance(document, dict) else None
    entry = next(
        (e for e in entries or () if isinstance(e, dict) and e.get("id") == model),
        None,
    )
    length = entry.get("max_model_len") if entry is not None else None
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        return ModelCard(None, False, now)
    extension = entry.get("tiergate") if entry is not None else None
    emulated = isinstance(extension, dict) and extension.get("emulated") is True
    return ModelCard(length, emulated, now)


async def read_card(backend: Backend, upstream: Upstream, timeout_s: float) -> ModelCard:
    """Read the backend's model card and keep it on the backend; a refresh that fails keeps
    the length already known."""
    try:
        document = json.loads(await upstream.get_text(backend.models_url, timeout_s))
    except (UpstreamError, ValueError) as exc:
        log.info("backend %s: /v1/models unreadable (%s)", backend.name, exc)
        previous, now = backend.card, time.monotonic()
        if previous is not None and previous.max_model_len is not None:
            card = replace(previous, read_at=now)
        else:
            card = ModelCard(None, False, now)
    else:
        card = parse_model_card(document, backend.spec.model, time.monotonic())
    backend.card = card
    return card


class LoadScrapes:
    """The pool's load scrapes, and the per-backend gauges they export."""

    def __init__(self, pool: BackendPool) -> None:
        self.pool = pool

    async def loop(self) -> None:
        """Every ``scrape_interval_s``, a scrape of each backend whose last one has ended: a
        busy engine's ``/metrics`` may answer late (its API server streams tokens on the same
        loop), and waiting for it would leave every other backend's numbers as old."""
        try:
            while True:
                for backend in self.pool.backends:
                    task = backend.scrape_task
                    if task is None or task.done():
                        backend.scrape_task = asyncio.create_task(
                            self.probe(backend), name=f"scrape {backend.name}"
                        )
                await asyncio.sleep(self.pool.settings.scrape_interval_s)
        finally:
            await self._cancel_scrapes()

    async def _cancel_scrapes(self) -> None:
        tasks = [b.scrape_task for b in self.pool.backends if b.scrape_task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def probe_all(self) -> None:
        """Scrape every backend's load (``/metrics``)."""
        backends = self.pool.backends
        await asyncio.gather(*(self.probe(b) for b in backends), return_exceptions=True)

    async def probe(self, backend: Backend) -> bool:
        """Scrape one backend's ``/metrics`` to correct the router's view of its load, reading
        its model card first when it is due. Health is the liveness probe's business: a failed
        scrape only leaves the last numbers in place."""
        pool = self.pool
        timeout = scrape_timeout_s(pool.settings.scrape_interval_s)
        if backend.card is None or backend.card.due(time.monotonic()):
            await read_card(backend, pool.upstream, timeout)
        try:
            text = await pool.upstream.get_text(backend.metrics_url, timeout)
            gauges = parse_vllm_gauges(text)
        except (UpstreamError, ValueError) as exc:
            log.info("backend %s: metrics scrape failed (%s)", backend.name, exc)
            return False
        self.reconcile(backend, gauges)
        pool.learn_facts(backend, parse_engine_facts(text))
        self.export(backend)
        return True

    def reconcile(self, backend: Backend, gauges: dict[str, float]) -> None:
        """Correct the router's decoding count with the engine's own numbers.

        The engine runs our decoding requests plus, possibly, work the gateway did not send;
        ``running`` beyond what we account for is counted as extra decoding load (it interferes
        with prefills just the same). It never drops below our own count between scrapes'
        reconciliation, since our own requests are tracked exactly.

        With several workers, the prefills the *other* workers queued here are known from the
        shared table (:meth:`~gateway.app.backends.BackendPool.see_others`) and counted as
        queued prefill work; they are also in the engine's running/waiting, so they are
        subtracted with our own requests: a request is counted once, as prefill work until a
        first token is seen for it, then as load we did not send (the other workers' decoding
        requests).
        """
        backend.running = int(gauges.get(RUNNING, 0))
        backend.waiting = int(gauges.get(WAITING, 0))
        backend.kv_usage = gauges.get(KV_USAGE)
        self.pool.see_others([backend])
        view = backend.view
        ours = backend.own_decoding + len(view.prefill_queue) + view.num_external_prefills
        external = max(0, backend.running + backend.waiting - ours)
        backend.external = external
        backend.view.num_decoding = backend.own_decoding + external

    def forget(self, backend: Backend) -> None:
        """An engine that fails its liveness probe: its last scraped numbers describe an engine
        that is gone, so the fleet view and the gauges stop showing them."""
        backend.running = backend.waiting = backend.kv_usage = None
        metrics = self.pool.metrics
        for gauge in (metrics.backend_running, metrics.backend_waiting):
            gauge.labels(backend.name).set(0)

    def export(self, backend: Backend) -> None:
        m, name = self.pool.metrics, backend.name
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
        backends = self.pool.backends
        self.pool.see_others(backends)
        for backend in backends:
            self.export(backend)


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
