"""Weighted Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models",
OSDI'24; the weighted variant PROSERVE compares against).

Each tenant has a counter of the service it received, ``w_in`` per input token computed plus
``w_out`` per output token generated, divided by the weight of the request served, so that a
tenant of weight 2 may receive twice the tokens of a tenant of weight 1 for the same counter.
Admission always takes the earliest waiting request of the tenant with the smallest counter.
When a tenant (re)joins the waiting queue its counter is lifted to the smallest counter among
tenants already queued (or, if none is, to that of the last tenant to leave the queue), so idle
time does not bank credit — VTC's counter lift.

Running requests continue in arrival order (continuous batching, chunked prefill). VTC itself
never preempts (its engine reserves memory); here KV shortage preempts the running request of
the most-served tenant (latest arrival first among equals), and a step that preempted admits
nothing. Service is charged when the executor reports the step done (:meth:`on_step_end`);
recomputed tokens of a preempted request count as input tokens, since they cost the engine
the same.

:meth:`schedule` only proposes: the counter lift and the charges of a plan are committed when
that plan is reported executed, so an executor may plan a step more than once (the vLLM adapter
re-plans without a request vLLM would refuse) and only the plan that ran changes the counters.

A VTC *client* is ``Request.tenant`` by default. PROSERVE's evaluation weights clients by
priority tier; with ``client="tier"`` the tiers themselves are the clients, which reproduces
that setting on workloads without tenant labels (where every request is tenant "default" and
VTC would reduce to FCFS).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar, Literal

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan
from priority.policies.ordering import all_decode_repeatable, arrival_order, fill, room_for_new
from priority.request import Request

DEFAULT_INPUT_WEIGHT = 1.0
DEFAULT_OUTPUT_WEIGHT = 2.0
"""VTC's default w_p : w_q = 1 : 2 (output tokens cost more per token)."""


@dataclass(slots=True)
class _Proposal:
    """What executing one planned step commits: VTC's lift, then the service charges."""

    plan: StepPlan
    queued: frozenset[str]
    lifted: dict[str, float]
    """New counters of the clients that joined the waiting queue."""
    last_left_counter: float
    charges: list[tuple[str, float]]
    lift_committed: bool = False


@dataclass(frozen=True, slots=True)
class WvtcParams:
    input_weight: float = DEFAULT_INPUT_WEIGHT
    """Counter cost of one input token."""
    output_weight: float = DEFAULT_OUTPUT_WEIGHT
    """Counter cost of one output token."""
    client: Literal["tenant", "tier"] = "tenant"
    """The request attribute that identifies a VTC client."""

    def __post_init__(self) -> None:
        if self.input_weight < 0 or self.output_weight < 0:
            raise ValueError("token weights must be >= 0")
        if self.client not in ("tenant", "tier"):
            raise ValueError(f"client must be 'tenant' or 'tier', got {self.client!r}")


class WeightedVtcPolicy(SchedulingPolicy):
    """Token fairness across tenants, weighted by request weight."""

    name: ClassVar[str] = "wvtc"
    default_params: ClassVar[WvtcParams] = WvtcParams()
    params: WvtcParams

    def __init__(self, estimator: BatchLatencyEstimator, params: WvtcParams | None = None) -> None:
        super().__init__(estimator, params)
        self._client = attrgetter(self.params.client)
        self.input_weight = self.params.input_weight
        self.output_weight = self.params.output_weight
        self._counters: dict[str, float] = {}
        self._queued_tenants: frozenset[str] = frozenset()
        self._last_left_counter = 0.0
        self._proposals: deque[_Proposal] = deque(maxlen=64)
        """Plans made and not yet reported executed, oldest first (bounded: a plan that never
        runs is dropped once a later one is reported)."""

    @property
    def counters(self) -> Mapping[str, float]:
        """Virtual token counter of every client seen so far."""
        return self._counters

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        client = self._client
        queued = frozenset(client(r) for r in inp.waiting)
        lifted, last_left = self._lift(queued)
        counters = self._counters

        def counter_of(tenant: str) -> float:
            return lifted.get(tenant, counters.get(tenant, 0.0))

        builder = BatchBuilder(inp)
        running = arrival_order(inp.running)
        victims = running[::-1]  # most-served tenant first, latest arrival first among equals
        victims.sort(key=lambda r: counter_of(client(r)), reverse=True)
        fill(builder, running, victims=victims, preempt_self=True)
        if inp.waiting and not builder.plan.preempted and room_for_new(builder):
            self._admit(builder, inp.waiting, counter_of)
        plan = builder.plan
        plan.repeatable = all_decode_repeatable(inp, plan)
        charges = [(client(r), self._charge(r, t)) for r, t in plan.scheduled]
        self._proposals.append(_Proposal(plan, queued, lifted, last_left, charges))
        return plan

    def on_step_end(self, plan: StepPlan, now: float) -> None:
        """Commit the step that ran: its lift (once), then its charges (each call is a step)."""
        counters = self._counters
        proposal = self._executed(plan)
        if proposal is None:  # a plan we did not make: requests already advanced, charge by tokens
            charges = [
                (
                    self._client(r),
                    (self.input_weight * t if t > 1 else self.output_weight) / r.weight,
                )
                for r, t in plan.scheduled
            ]
        else:
            charges = proposal.charges
            if not proposal.lift_committed:
                proposal.lift_committed = True
                for tenant, value in proposal.lifted.items():
                    # max: a charge committed after this plan was made is never undone
                    counters[tenant] = max(counters.get(tenant, 0.0), value)
                self._queued_tenants = proposal.queued
                self._last_left_counter = proposal.last_left_counter
        for tenant, amount in charges:
            counters[tenant] = counters.get(tenant, 0.0) + amount

    # ---- internals ------------------------------------------------------------------------

    def _charge(self, request: Request, tokens: int) -> float:
        """Counter cost of computing ``tokens`` of ``request`` (before the step runs)."""
        left = request.prompt_tokens + request.num_output_tokens - request.num_computed_tokens
        cost = self.input_weight * tokens if left > 1 else 0.0
        if tokens == left:
            cost += self.output_weight  # completing the compute samples one output token
        return cost / request.weight

    def _executed(self, plan: StepPlan) -> _Proposal | None:
        """The proposal of ``plan``, dropping older ones (plans never run: steps execute in
        the order they were planned). It stays first: a fast-forward reports it once per step."""
        proposals = self._proposals
        if not any(p.plan is plan for p in proposals):
            return None
        while proposals[0].plan is not plan:
            proposals.popleft()
        return proposals[0]

    def _lift(self, queued: frozenset[str]) -> tuple[dict[str, float], float]:
        """VTC's counter lift for clients that joined the waiting queue since the last executed
        step: their new counters, and the counter of the last client to leave (not applied)."""
        previous = self._queued_tenants
        counters = self._counters
        last_left = self._last_left_counter
        left = previous - queued
        if left:
            last_left = max(counters.get(t, 0.0) for t in left)
        lifted: dict[str, float] = {}
        joined = queued - previous
        if joined:
            stayed = previous & queued
            floor = min(counters.get(t, 0.0) for t in stayed) if stayed else last_left
            for tenant in joined:
                lifted[tenant] = max(counters.get(tenant, 0.0), floor)
        return lifted, last_left

    def _admit(
        self,
        builder: BatchBuilder,
        waiting: list[Request],
        counter_of: Callable[[str], float],
    ) -> None:
        """Admit the earliest request of the least-served tenant until one does not fit."""
        queues: dict[str, list[Request]] = {}
        for request in arrival_order(waiting):
            queues.setdefault(self._client(request), []).append(request)
        heads = dict.fromkeys(queues, 0)
        heap = [(counter_of(t), t) for t in queues]
        heapq.heapify(heap)
        while heap and room_for_new(builder):
            counter, tenant = heap[0]
            request = queues[tenant][heads[tenant]]
            granted = builder.add(request)
            if granted == 0:
                break
            heads[tenant] += 1
            if heads[tenant] == len(queues[tenant]):
                heapq.heappop(heap)
            else:  # this step's admissions already count toward the tenant's turn
                heapq.heapreplace(heap, (counter + self._charge(request, granted), tenant))
