"""The simulator's :class:`EngineCore` driven by the wall clock: one asyncio task per engine.

The loop starts a step when the core has work, sleeps to the step's end and applies it, then
hands the emitted tokens to the requests' :class:`TokenStream` objects — one pass per step end,
however many streams are open. Steps follow the profile's timing on an absolute timeline: the
next step starts at the previous step's *planned* end, so the event loop's scheduling delays do
not accumulate (when the loop falls more than :data:`MAX_LAG_S` behind, the timeline restarts at
now instead of bursting to catch up).

A fast-forwarded decode run (several steps planned at once) is delivered step by step at each
step's own end time; an arrival or an abort in the middle cuts the run after the step in
progress (:meth:`EngineCore.interrupt`), where a step-by-step engine would next consult its
policy.

``time_scale`` runs the emulation faster than real time: the engine clock is
``time.monotonic() * time_scale``, so a profile's 10 ms step takes ``10 / time_scale`` wall ms.
Every time the engine reports (token times, metrics, SLOs) is in emulated seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from engine_emulated.metrics import EngineMetrics
from priority.request import Request
from priority.sim.engine import EngineCore, StepInFlight, StepOutcome

logger = logging.getLogger(__name__)

MAX_LAG_S = 1.0
"""Wall seconds the loop may run behind its timeline before it restarts the timeline at now.

Behind by less, the loop runs steps back to back until it has caught up, so a CPU-starved
process keeps the profile's throughput (its streams then receive several tokens per chunk, as
vLLM's do when its API server lags); behind by more (a stopped process), the lost time is lost."""
IDLE_POLL_S = 0.05
"""Re-plan interval when the policy schedules nothing although work is queued (a safety net)."""


class EngineRejected(ValueError):
    """The request can never fit this engine (it needs more KV than the engine has)."""


@dataclass(slots=True, eq=False)
class TokenStream:
    """One request's output as the engine produces it, collected until its consumer reads it.

    Like vLLM's output collector, tokens produced while the consumer is busy are merged: a slow
    reader gets several tokens in one read instead of falling further behind.
    """

    request: Request
    finish_reason: str
    delivered: int = 0
    """Output tokens handed to this stream so far."""
    read: int = 0
    """Output tokens the consumer has taken."""
    finished: bool = False
    aborted: bool = False
    last_token_s: float = 0.0
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    def _push(self, tokens: int) -> None:
        self.delivered += tokens
        self._event.set()

    def _close(self) -> None:
        self.finished = True
        self._event.set()

    async def next_tokens(self) -> tuple[int, int]:
        """Wait for new tokens; ``(start, stop)`` output indices, ``start == stop`` when done."""
        while self.read == self.delivered and not self.finished:
            self._event.clear()
            await self._event.wait()
        start, self.read = self.read, self.delivered
        return start, self.read

    @property
    def done(self) -> bool:
        return self.finished and self.read == self.delivered


class WallClockEngine:
    """Runs one :class:`EngineCore` in real time and routes its tokens to streams."""

    def __init__(
        self,
        core: EngineCore,
        metrics: EngineMetrics | None = None,
        *,
        time_scale: float = 1.0,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.core = core
        self.metrics = metrics
        self.time_scale = time_scale
        self.streams: dict[str, TokenStream] = {}
        self._wake = asyncio.Event()
        self._resumed = asyncio.Event()
        """Set while the loop may step; cleared by :meth:`pause` (fault injection: a hang)."""
        self._resumed.set()
        self._task: asyncio.Task[None] | None = None
        self._ff_done = 0
        """Steps of the in-flight fast-forward run already delivered."""
        self.max_lag_s = 0.0
        """Largest delay (engine clock) between a step's planned end and its delivery."""
        self.timeline_restarts = 0
        """Times the loop fell more than ``MAX_LAG_S`` behind and restarted its timeline."""

    # ---- clock ----------------------------------------------------------------------------

    def now(self) -> float:
        """The engine clock (emulated seconds)."""
        return time.monotonic() * self.time_scale

    async def _sleep_until(self, t: float) -> None:
        delay = (t - self.now()) / self.time_scale
        # sleep(0) still yields, so a busy engine never starves the HTTP side
        await asyncio.sleep(max(0.0, delay))
        lag = self.now() - t
        if lag > self.max_lag_s:
            self.max_lag_s = lag
        if self.metrics is not None:
            self.metrics.step_lag.observe(max(0.0, lag))

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop task on the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            paused, self._resumed = self.paused, asyncio.Event()
            if not paused:
                self._resumed.set()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.core.name)

    async def stop(self) -> None:
        """Stop the loop; open streams end (aborted) and the engine is left empty."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_all()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # ---- fault injection (engine_emulated.faults) -----------------------------------

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    def pause(self) -> None:
        """Stop stepping, as a hung engine core does: streams stop, requests queue."""
        self._resumed.clear()

    def resume(self) -> None:
        """Step again from where the pause stopped (the lost time is lost: MAX_LAG_S)."""
        self._resumed.set()

    def crash(self) -> None:
        """Lose every request at once, as an engine core that dies does."""
        self._fail_all()

    # ---- requests -------------------------------------------------------------------------

    def submit(self, request: Request, finish_reason: str) -> TokenStream:
        """Queue ``request``; its tokens arrive on the returned stream."""
        self.start()
        now = self.now()
        if not self.core.add_request(request, now):
            self.core.rejected.clear()  # the caller reports it; keep the core's list bounded
            raise EngineRejected(
                f"request needs {request.prompt_tokens + request.target_output_tokens} tokens "
                f"of KV; the engine holds {self.core.pool.capacity_tokens}"
            )
        stream = TokenStream(request, finish_reason, last_token_s=request.arrival_s)
        self.streams[request.request_id] = stream
        self._poke(now)
        return stream

    def abort(self, request_id: str) -> bool:
        """Drop a request (its client left): frees its KV at once. True if it was still live."""
        stream = self.streams.pop(request_id, None)
        if stream is None:
            return False
        stream.aborted = True
        stream._close()
        now = self.now()
        found = self.core.abort(request_id, now)
        if found:
            self._poke(now)  # freed KV may let a waiting request in
        return found

    def _poke(self, now: float) -> None:
        if self.core.in_flight is None:
            self._wake.set()
        else:
            self.core.interrupt(now)

    # ---- the loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._drive()
            except Exception:  # an engine or policy bug must not leave clients hanging
                logger.exception("%s: engine loop failed; aborting all requests", self.core.name)
                self._fail_all()

    async def _drive(self) -> None:
        core = self.core
        next_start: float | None = None
        """Planned end of the previous step: where the timeline continues."""
        while True:
            if not self._resumed.is_set():
                await self._resumed.wait()
                continue  # the world may have changed (a crash, aborts) while paused
            step = core.in_flight
            if step is None:
                if not core.has_work:
                    next_start = None
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                now = self.now()
                if next_start is None or now - next_start > MAX_LAG_S * self.time_scale:
                    if next_start is not None:
                        self.timeline_restarts += 1
                    next_start = now
                step = core.start_step(next_start)
                if step is not None and self.metrics is not None:
                    self.metrics.planned(step.plan)
                if step is None:
                    next_start = None
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), IDLE_POLL_S / self.time_scale)
                    continue
                self._ff_done = 0
            if step.num_steps - 1 > self._ff_done:
                # an intermediate step of a fast-forward run: all its requests decode one token
                t = float(step.end_times[self._ff_done])
                await self._sleep_until(t)
                if self.paused:
                    continue  # delivered once resumed, if the step is still in flight
                if core.in_flight is step and step.num_steps - 1 > self._ff_done:
                    self._ff_done += 1
                    self._deliver_decode_step(step, t)
                continue
            end = step.end_s
            await self._sleep_until(end)
            if self.paused:
                continue
            if core.in_flight is not step or step.end_s != end:
                continue  # cut short by an interrupt while sleeping: re-read the run
            outcome = core.finish_step(step)
            next_start = end
            self._deliver(outcome)

    def _deliver_decode_step(self, step: StepInFlight, t: float) -> None:
        streams = self.streams
        gaps: list[float] = []
        for request, _ in step.plan.scheduled:
            stream = streams.get(request.request_id)
            if stream is None:
                continue
            gaps.append(t - stream.last_token_s)
            stream.last_token_s = t
            stream._push(1)
        if gaps and self.metrics is not None:
            self.metrics.itl.observe_many(gaps)
            self.metrics.generation_tokens.inc(len(gaps))

    def _deliver(self, outcome: StepOutcome) -> None:
        streams = self.streams
        metrics = self.metrics
        generated = 0
        gaps: list[float] = []
        for request in outcome.first_tokens:
            if metrics is not None and request.request_id in streams:
                metrics.ttft.observe(request.token_times[0] - request.arrival_s)
                if request.first_scheduled_s is not None:
                    metrics.queue_time.observe(request.first_scheduled_s - request.arrival_s)
                metrics.prompt_tokens.inc(request.prompt_tokens)
        for request, _ in outcome.emitted:
            stream = streams.get(request.request_id)
            if stream is None:
                continue
            new = request.num_output_tokens - stream.delivered
            if new <= 0:
                continue
            times = request.token_times[-new:]
            if stream.delivered == 0:
                times = times[1:]  # the first token is TTFT, not an inter-token gap
                stream.last_token_s = request.token_times[0]
            last = stream.last_token_s
            for t in times:
                gaps.append(t - last)
                last = t
            stream.last_token_s = last
            generated += new
            stream._push(new)
        for request in outcome.finished:
            stream = streams.pop(request.request_id, None)
            if stream is None:
                continue
            stream._close()
            if metrics is not None and request.finished_s is not None:
                metrics.e2e.observe(request.finished_s - request.arrival_s)
                metrics.success(stream.finish_reason)
        if metrics is not None:
            metrics.itl.observe_many(gaps)
            if generated:
                metrics.generation_tokens.inc(generated)

    def _fail_all(self) -> None:
        """Drop every request and the step in flight: the engine restarts empty."""
        core = self.core
        core.in_flight = None
        now = self.now()
        for stream in self.streams.values():
            stream.aborted = True
            stream._close()
        self.streams.clear()
        for queue in (core.running, core.waiting):
            for request in list(queue):
                core.abort(request.request_id, now)
