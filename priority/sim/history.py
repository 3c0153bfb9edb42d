"""``--workflow-history on``: workflows finished earlier in a run set later ones' sub-deadlines.

The simulator's side of :mod:`priority.patterns`. Each workflow that finishes every stage becomes
a :class:`~priority.patterns.PatternGraph` (per stage: the one simulated model, prompt and output
tokens, and the stage's time from its arrival to its last token — queueing included, think time
not). When a later workflow's compound call s is released, what is known *then* is matched:
stages 0..s-1 whole, stage s's prompt. With a match, the call's offset from the workflow's start
is the cold-start rule's with the history's φ in place of the token share::

    offset(s) = think(1..s) + φ(s) · (D − think(all))

(think times out of D and added back where they fall, as in
:func:`~priority.sim.workflows.cold_start_offsets`); without one, the cold-start offset. φ never
decreases along a workflow (``at_least``: the φ its previous call got). The history's clock is the
simulated time, so its reuse decay runs per simulated hour. Every run starts with an empty
history: each policy learns from its own finished workflows.
"""

from __future__ import annotations

from collections.abc import Mapping

from priority.patterns import (
    DEFAULT_CAPACITY,
    KnownStage,
    PatternGraph,
    PatternHistory,
    PatternStage,
    model_hash,
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
        self._think_before: dict[str, float] = {}
        self._think_total: dict[str, float] = {}
        self._size: dict[str, int] = {}
        for workflow, members in by_workflow.items():
            members.sort()
            think = 0.0
            for k, (_, rid) in enumerate(members):
                self._index[rid] = k
                think += calls[rid].think_s if k else 0.0
                self._think_before[rid] = think
            self._think_total[workflow] = think
            self._size[workflow] = len(members)
        self._done: dict[str, list[PatternStage]] = {}
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
        phi = self.history.phi(known, at_least=self._phi.get(call.workflow_id, 0.0))
        if phi is None:
            return None
        self._phi[call.workflow_id] = phi
        compute = max(call.deadline_s - self._think_total[call.workflow_id], 0.0)
        return self._think_before[request.request_id] + phi * compute

    def finished(self, request: Request, now: float) -> None:
        """A call finished at ``now``: note its stage; the workflow's last makes it a graph."""
        call = self.calls.get(request.request_id)
        if call is None:
            return
        done = self._done.setdefault(call.workflow_id, [])
        if len(done) != self._index[request.request_id]:
            return
        done.append(
            PatternStage(
                SIM_MODEL,
                request.prompt_tokens,
                request.num_output_tokens,
                max(now - request.arrival_s, 0.0),
            )
        )
        if len(done) == self._size[call.workflow_id]:
            self.history.add(PatternGraph(tuple(done)))
            del self._done[call.workflow_id]
            self._phi.pop(call.workflow_id, None)
