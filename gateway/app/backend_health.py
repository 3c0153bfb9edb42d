"""Backend health: one :class:`~gateway.app.breaker.Breaker` per backend, and what drives it.

Health is judged apart from the load scrapes, by a loop a few times a second
(:meth:`BackendHealth.loop`):

* a **liveness probe** per backend every ``probe_interval_s``: ``GET /health`` within
  ``probe_timeout_s`` (any answer below 500 counts: an engine without the route is alive), so
  a frozen or dead engine is out of routing within about ``probe_interval_s +
  probe_timeout_s`` (0.75 s by default); a probe that times out while the backend's streams
  kept delivering is a busy engine, not a dead one (``tiergate_slow_probes_total``);
* the **watchdog** (:mod:`gateway.app.watchdog`): streams stalled past their stall timeout are
  ended, and an engine on which every stream waits with no event is taken out (a hung engine
  core still answers ``/health``);
* request outcomes: failures and timeouts count against the backend, successes reset the count.

When a breaker opens, the attempts still waiting on that backend for their first token (or
non-streamed answer) are abandoned at once and retried elsewhere, rather than sitting out their
own timeout. A breaker opened for unreachability closes when ``/health`` answers again; one
opened for unresponsiveness closes on a successful 1-token trial request, sent while it is open.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

from gateway.app.breaker import Breaker, OpenReason
from gateway.app.upstream import UpstreamError, UpstreamTimeout
from gateway.app.watchdog import (
    EXTERNAL_PROMPT_TOKENS,
    STEP_MARGIN,
    StreamWatch,
    stalled_backends,
)

if TYPE_CHECKING:
    from gateway.app.backends import Backend, BackendPool

log = logging.getLogger(__name__)

TIMEOUT_PHASES = ("first_token", "response", "stall", "queued")
"""Values of ``phase`` in ``tiergate_upstream_timeouts_total``: ``record_timeout``'s, and
``queued`` — a first-token budget spent in a serving engine's own queue (no fault)."""
LOOP_LAG_TOLERANCE_S = 0.1
"""A health-loop tick later than this skips the watchdog: the event loop was blocked, so events
may sit unread in socket buffers and streams would look stalled when the gateway was."""


class BackendHealth:
    """The pool's breakers, liveness probes and watchdog."""

    def __init__(self, pool: BackendPool) -> None:
        self.pool = pool
        self.streams: set[StreamWatch] = set()
        """Streams being relayed past their first token (the watchdog's view)."""
        self.lagged_at = -1e9
        """When the health loop last found the event loop late (its own tick overdue)."""

    def new_breaker(self) -> Breaker:
        settings = self.pool.settings
        return Breaker(settings.breaker_failures, settings.breaker_cooldown_s)

    def declare(self, name: str) -> None:
        """Export the backend's failure counters at 0 from the start: a rate over a series that
        appears only with its first failure misses that failure, and a dashboard shows no line
        rather than a flat zero."""
        m = self.pool.metrics
        m.upstream_failures.labels(name)
        for phase in TIMEOUT_PHASES:
            m.upstream_timeouts.labels(name, phase)
        for reason in OpenReason:
            m.breaker_opens.labels(name, reason.value)

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
        return max(self.pool.settings.backend_stall_min_s, STEP_MARGIN * step)

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

    # ---- request outcomes and verdicts ---------------------------------------------------

    def record_failure(self, backend: Backend, *, counts: bool = True) -> None:
        """A request attempt failed here. ``counts=False``: it was abandoned because the
        breaker had opened already, so it says nothing new about the backend."""
        self.pool.metrics.upstream_failures.labels(backend.name).inc()
        if counts and backend.breaker.failure(time.monotonic()):
            self._opened(backend, f"{backend.breaker.failures} failures in a row")

    def record_timeout(self, backend: Backend, phase: str) -> None:
        """An attempt ran out of time (``first_token``, ``response`` or ``stall``): a failure,
        and a reason to probe the backend's liveness now rather than at the next period."""
        self.pool.metrics.upstream_timeouts.labels(backend.name, phase).inc()
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
            self.sync(backend)

    def _opened(self, backend: Backend, detail: str) -> None:
        reason = backend.breaker.reason
        assert reason is not None
        if reason is OpenReason.UNREACHABLE:
            self.pool.scrapes.forget(backend)
        log.warning("backend %s: circuit open (%s: %s)", backend.name, reason.value, detail)
        self.pool.metrics.breaker_opens.labels(backend.name, reason.value).inc()
        self.sync(backend)
        _abandon_attempts(backend)

    def _closed(self, backend: Backend, detail: str) -> None:
        log.warning("backend %s: circuit closed (%s)", backend.name, detail)
        self.sync(backend)

    def sync(self, backend: Backend) -> None:
        """The router sees the breaker's verdict (half-open after the cooldown)."""
        healthy = backend.breaker.routable(time.monotonic())
        if healthy != backend.view.healthy:
            backend.view.healthy = healthy
            self.pool.metrics.backend_healthy.labels(backend.name).set(1.0 if healthy else 0.0)
            self.pool.capacity_changed()

    # ---- the loop ------------------------------------------------------------------------

    async def loop(self) -> None:
        """Liveness probes, half-opening breakers and the watchdog, a few times a second."""
        pool = self.pool
        loop = asyncio.get_running_loop()
        tick = min(0.1, pool.settings.probe_interval_s / 2)
        last = time.monotonic()
        while True:
            now = time.monotonic()
            pool.metrics.loop_lag.observe(max(0.0, now - last - tick))
            on_time = now - last <= tick + LOOP_LAG_TOLERANCE_S
            if not on_time:
                self.lagged_at = now
            last = now
            try:
                for backend in pool.backends:
                    self.sync(backend)
                    if backend.probe_task is None and now >= backend.next_probe:
                        backend.next_probe = now + pool.settings.probe_interval_s
                        backend.probe_task = loop.create_task(self.check(backend))
                if on_time:
                    self._watch(now, loop.time())
                if pool.shared is not None:
                    pool.shared.beat(now)
            except Exception:  # a bug here must not end health checking for good
                log.exception("health loop tick failed")
            await asyncio.sleep(tick)

    def _watch(self, now: float, loop_now: float) -> None:
        floor = self.pool.settings.backend_stall_min_s
        for backend, waited in stalled_backends(self.streams, now, loop_now, floor).items():
            silent = now - backend.last_event
            threshold = self.stall_threshold(backend)
            if min(waited, silent) > threshold and backend.breaker.routable(now):
                self.trip(
                    backend,
                    OpenReason.UNRESPONSIVE,
                    f"every stream waited {min(waited, silent):.2f} s with no event",
                )

    async def check(self, backend: Backend) -> None:
        """One liveness probe, and a trial request if the breaker is open for unresponsiveness."""
        settings, upstream = self.pool.settings, self.pool.upstream
        try:
            started = time.monotonic()
            try:
                status = await upstream.status(backend.health_url, settings.probe_timeout_s)
            except UpstreamTimeout as exc:
                if time.monotonic() - self.lagged_at < 2 * settings.probe_timeout_s:
                    backend.next_probe = 0.0  # our own loop was late, maybe not the engine
                    return
                if backend.last_event >= started:
                    # its streams delivered while /health waited: the server that answers both
                    # is alive and busy (a loaded engine answers /health behind its tokens);
                    # a frozen or dead one sends nothing, and a hung engine core is the
                    # watchdog's to find
                    self.pool.metrics.slow_probes.labels(backend.name).inc()
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
            self.pool.scrapes.forget(backend)

    async def _trial(self, backend: Backend) -> None:
        """A 1-token completion: the only proof that an engine which answers ``/health`` but
        not requests serves again."""
        payload = json.dumps(
            {"model": backend.spec.model, "prompt": "ping", "max_tokens": 1, "stream": False}
        ).encode()
        response = None
        try:
            async with asyncio.timeout(self.pool.settings.breaker_trial_timeout_s):
                response = await self.pool.upstream.post_json(backend.completions_url, payload)
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


def _abandon_attempts(backend: Backend) -> None:
    """Expire the deadlines of attempts waiting here: they fail over now."""
    if not backend.attempts:
        return
    now = asyncio.get_running_loop().time()
    for deadline in list(backend.attempts):
        if not deadline.expired():
            deadline.reschedule(now)
