"""``--workflow-history on``: workflows finished earlier in a run set later ones' sub-deadlines.

The simulator's side of :mod:`priority.patterns`. Each workflow that finishes every stage becomes
a :class:`~priority.patterns.PatternGraph` (per stage: the one simulated model, prompt and output
tokens, and what the stage added to the workflow's timeline, think time included:
:func:`~priority.patterns.timeline_graph`, the gateway's definition too). When a later workflow's
compound call s is released, what is known *then* is matched: stages 0..s-1 whole, stage s's
prompt. With a match, the call is due where the gateway would put it,
:func:`~priority.patterns.stage_due` after its arrival::

    offset(s) = elapsed + max(φ(s)·D − elapsed, share(s) · (D − elapsed))

(elapsed: the call's arrival minus the workflow's start); without one, the cold-start offset of
:func:`~priority.sim.workflows.cold_start_offsets`. The trace's future think times are not used:
no gateway knows them. φ never decreases along a workflow (``at_least``: the φ its previous call
got). The history's clock is the simulated time, so its reuse decay runs per simulated hour.
Every run starts with an empty history: each policy learns from its own finished workflows.
"""

from __future__ import annotations

from collections.abc import Mapping

from priority.patterns import (
    DEFAULT_CAPACITY,
    EndedStage,
    KnownStage,
    PatternHistory,
    model_hash,
    stage_due,
    timeline_graph,
)
from priority.request import Request
from priority.sim.workflows import WorkflowCall

SIM_MODEL = model_hash("simulated")
"""The simulator serves one model: every stage has this id (structure = the stage count)."""


class SimWorkflowHistory:
    """Pattern history of one simulation run (module docstring)."""

    def __init__(
        self, calls: Mapping[str, WorkflowCall], history: PatternHistory | None = None
    ) -> None:
        self.calls = calls
        self.history = history if history is not None else PatternHistory(DEFAULT_CAPACITY)
        by_workflow: dict[str, list[tuple[int, str]]] = {}
        for rid, call in calls.items():
            by_workflow.setdefault(call.workflow_id, []).append((call.stage, rid))
        self._index: dict[str, int] = {}
        """Request id -> its position in its workflow (0, 1, …)."""
        self._size: dict[str, int] = {}
        for workflow, members in by_workflow.items():
            members.sort()
            for k, (_, rid) in enumerate(members):
                self._index[rid] = k
            self._size[workflow] = len(members)
        self._start: dict[str, float] = {}
        """Workflow id -> its start (stage 0's arrival), once stage 0 finished."""
        self._done: dict[str, list[EndedStage]] = {}
        self._phi: dict[str, float] = {}

    def offset_s(self, request: Request) -> float | None:
        """The released call's offset from its workflow's start, or None (cold start)."""
        call = self.calls.get(request.request_id)
        if call is None:
            return None
        k = self._index[request.request_id]
        done = self._done.get(call.workflow_id, [])
        if len(done) != k:
            return None  # an earlier stage never finished (refused): nothing to match on
        known = [KnownStage(s.model, s.input_tokens, s.output_tokens) for s in done]
        known.append(KnownStage(SIM_MODEL, request.prompt_tokens))
        found = self.history.match(known)
        if found is None:
            return None
        phi = found.phi_at_least(self._phi.get(call.workflow_id, 0.0))
        self._phi[call.workflow_id] = phi
        elapsed = request.arrival_s - self._start.get(call.workflow_id, request.arrival_s)
        return elapsed + stage_due(phi, found.phi_before, call.deadline_s, elapsed)

    def finished(self, request: Request, now: float) -> None:
        """A call finished at ``now``: note its stage; the workflow's last makes it a graph."""
        call = self.calls.get(request.request_id)
        if call is None:
            return
        done = self._done.setdefault(call.workflow_id, [])
        if len(done) != self._index[request.request_id]:
            return
        if not done:
            self._start[call.workflow_id] = request.arrival_s
        done.append(EndedStage(SIM_MODEL, request.prompt_tokens, request.num_output_tokens, now))
        if len(done) == self._size[call.workflow_id]:
            graph = timeline_graph(self._start.pop(call.workflow_id), done)
            if graph is not None:
                self.history.add(graph)
            del self._done[call.workflow_id]
            self._phi.pop(call.workflow_id, None)
