"""The gateway's workflow history: each call's sub-deadline ``D_s = φ(s)·D`` from past workflows.

:class:`WorkflowPatterns` is :class:`~gateway.app.kinds.RequestKinds`'s ``sub_deadline`` hook
over a per-process :class:`~priority.patterns.PatternHistory` (matching, σ, blend, decay and
eviction: :mod:`priority.patterns`).

**What is recorded.** Every workflow call that joins is seen by the hook (its workflow's start
and deadline follow from ``deadline_ms - remaining_ms``); every call's end is reported by the
proxy (:meth:`call_ended`: model, prompt and output tokens, the time of its last token, whether
it finished ``ok``). Token counts and a hash of the model name only — no prompt text.

**When a workflow becomes a pattern graph.** The gateway cannot tell an agent's last call from a
pause, so a workflow is closed when its deadline has passed and none of its calls is still in
flight, or at the latest :data:`~gateway.app.workflows.DEFAULT_TTL_S` after its deadline (when
the store forgets it too). It is learned only if every stage it joined here ended ``ok``: a
workflow with a refused, failed or cancelled call, or with stages served by another process, is
dropped, not learned half.

**Stage time** is what the stage added to the workflow's timeline, the client's own time
between calls included (:func:`~priority.patterns.timeline_graph`, the definition the
simulator's history uses too): the gateway cannot tell that time apart from its queueing, and
the workflow's deadline counts it, so ``φ(s)·D`` is a point on the same timeline as ``D``.

**The sub-deadline** of call s, in ms from its arrival: ``φ(s)·D − elapsed`` (elapsed: time
since the workflow's start), never less than the stage's share of what is left
(:func:`~priority.patterns.stage_due`). φ never decreases along a workflow.
Without a match — no history yet, no past workflow of this structure, or an earlier stage not
seen here — the hook answers None and the call gets the cold start (all the time left).

**Per process.** Each gateway worker keeps its own history and learns from the workflows whose
every call it served; with several workers (or gateways) behind one Redis, a workflow's calls
spread over them and fewer workflows are learned whole — each worker's history still works, on
what it saw.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.app.workflows import DEFAULT_TTL_S, WorkflowCall
from priority.patterns import (
    EndedStage,
    KnownStage,
    PatternGraph,
    PatternHistory,
    model_hash,
    stage_due,
    timeline_graph,
)

MAX_OPEN_WORKFLOWS = 10_000
"""Workflows followed at once; past it the one whose deadline comes first is dropped unlearned."""


@dataclass(frozen=True, slots=True)
class CallEnd:
    """How one workflow call ended, as the proxy reports it (no text: sizes and times)."""

    key: str
    """``tenant_id:workflow_id``: workflow ids are per tenant."""
    stage: int
    model: str
    prompt_tokens: int
    output_tokens: int
    end_s: float
    """Its last token (or its end), on the history's clock."""
    ok: bool
    """Answered in full: only workflows whose every call ended ok are learned."""


@dataclass(slots=True)
class _Open:
    start_s: float
    deadline_s: float
    stages: int = 0
    in_flight: int = 0
    broken: bool = False
    overdue: bool = False
    phi: float = 0.0
    ended: dict[int, EndedStage] = field(default_factory=dict)

    def known(self, stage: int) -> list[KnownStage] | None:
        """Stages 0..stage-1 whole and ``stage``'s nothing yet; None if one is missing."""
        out: list[KnownStage] = []
        for k in range(stage):
            done = self.ended.get(k)
            if done is None:
                return None
            out.append(KnownStage(done.model, done.input_tokens, done.output_tokens))
        out.append(KnownStage(None))  # the hook runs before the call's prompt is counted
        return out


class WorkflowPatterns:
    """Learns pattern graphs from finished workflows and answers the sub-deadline hook."""

    def __init__(
        self,
        history: PatternHistory | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        grace_s: float = DEFAULT_TTL_S,
        max_open: int = MAX_OPEN_WORKFLOWS,
    ) -> None:
        self.history = history if history is not None else PatternHistory(clock=clock)
        self._clock = clock
        self.grace_s = grace_s
        self.max_open = max_open
        self._open: dict[str, _Open] = {}
        self._due: list[tuple[float, str]] = []
        self.learned = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._open)

    def sub_deadline(self, call: WorkflowCall) -> float | None:
        """The hook: call ``call.stage``'s sub-deadline in ms from now, or None (cold start)."""
        now = self._clock()
        self._close_due(now)
        flow = self._open.get(call.key)
        if flow is None:
            elapsed = (call.deadline_ms - call.remaining_ms) / 1e3
            flow = self._track(call.key, now - elapsed, now + call.remaining_ms / 1e3)
        flow.stages = max(flow.stages, call.stage + 1)
        flow.in_flight += 1
        known = flow.known(call.stage)
        found = self.history.match(known) if known is not None else None
        if found is None:
            return None
        phi = found.phi_at_least(flow.phi)
        flow.phi = phi
        elapsed_ms = call.deadline_ms - call.remaining_ms
        return stage_due(phi, found.phi_before, call.deadline_ms, elapsed_ms)

    def call_ended(self, end: CallEnd) -> None:
        """A call of workflow ``end.key`` ended (``end.end_s``: its last token, on the hook's
        clock)."""
        flow = self._open.get(end.key)
        if flow is not None:
            flow.in_flight = max(flow.in_flight - 1, 0)
            if end.ok and end.stage not in flow.ended:
                flow.ended[end.stage] = EndedStage(
                    model_hash(end.model), end.prompt_tokens, end.output_tokens, end.end_s
                )
            else:
                flow.broken = True
            if flow.overdue and flow.in_flight == 0:
                self._close(end.key)
        self._close_due(self._clock())

    def _track(self, key: str, start_s: float, deadline_s: float) -> _Open:
        while len(self._open) >= self.max_open and self._due:
            _, victim = heapq.heappop(self._due)
            if self._open.pop(victim, None) is not None:
                self.dropped += 1
        flow = self._open[key] = _Open(start_s, deadline_s)
        heapq.heappush(self._due, (deadline_s, key))
        return flow

    def _close_due(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            _, key = heapq.heappop(self._due)
            flow = self._open.get(key)
            if flow is None:
                continue
            if flow.in_flight == 0 or flow.overdue:
                self._close(key)
            else:  # calls still running past the deadline: wait for them, up to the grace
                flow.overdue = True
                heapq.heappush(self._due, (flow.deadline_s + self.grace_s, key))

    def _close(self, key: str) -> None:
        flow = self._open.pop(key)
        graph = None if flow.broken else _graph(flow)
        if graph is None:
            self.dropped += 1
            return
        self.history.add(graph)
        self.learned += 1


def _graph(flow: _Open) -> PatternGraph | None:
    """The workflow's pattern graph (module docstring), or None when a stage is missing."""
    ended = [flow.ended.get(k) for k in range(flow.stages)]
    if any(done is None for done in ended):
        return None
    return timeline_graph(flow.start_s, [done for done in ended if done is not None])
