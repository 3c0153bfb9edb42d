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

A VTC *client* is ``Request.tenant`` by default. PROSERVE's evaluation weights clients by
priority tier; with ``client="tier"`` the tiers themselves are the clients, which reproduces
that setting on workloads without tenant labels (where every request is tenant "default" and
VTC would reduce to FCFS).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from operator import attrgetter
from typing import ClassVar, Literal

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan
from priority.policies.ordering import all_decode_repeatable, arrival_order, fill, room_for_new
from priority.request import Request

DEFAULT_INPUT_WEIGHT = 1.0
DEFAULT_OUTPUT_WEIGHT = 2.0
"""VTC's default w_p : w_q = 1 : 2 (output tokens cost more per token)."""


class WeightedVtcPolicy(SchedulingPolicy):
    """Token fairness across tenants, weighted by request weight."""

    name: ClassVar[str] = "wvtc"

    def __init__(
        self,
        estimator: BatchLatencyEstimator,
        *,
        input_weight: float = DEFAULT_INPUT_WEIGHT,
        output_weight: float = DEFAULT_OUTPUT_WEIGHT,
        client: Literal["tenant", "tier"] = "tenant",
    ) -> None:
        """``input_weight`` / ``output_weight``: counter cost of one input / output token;
        ``client``: the request attribute that identifies a VTC client."""
        super().__init__(estimator)
        if input_weight < 0 or output_weight < 0:
            raise ValueError("token weights must be >= 0")
        if client not in ("tenant", "tier"):
            raise ValueError(f"client must be 'tenant' or 'tier', got {client!r}")
        self._client = attrgetter(client)
        self.input_weight = input_weight
        self.output_weight = output_weight
        self._counters: dict[str, float] = {}
        self._queued_tenants: frozenset[str] = frozenset()
        self._last_left_counter = 0.0
        self._pending: tuple[StepPlan, list[tuple[str, float]]] | None = None

    @property
    def counters(self) -> Mapping[str, float]:
        """Virtual token counter of every client seen so far."""
        return self._counters

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        client = self._client
        self._lift({client(r) for r in inp.waiting})
        builder = BatchBuilder(inp)
        running = arrival_order(inp.running)
        counter_of = self._counters.get
        victims = running[::-1]  # most-served tenant first, latest arrival first among equals
        victims.sort(key=lambda r: counter_of(client(r), 0.0), reverse=True)
        fill(builder, running, victims=victims, preempt_self=True)
        if inp.waiting and not builder.plan.preempted and room_for_new(builder):
            self._admit(builder, inp.waiting)
        plan = builder.plan
        plan.repeatable = all_decode_repeatable(inp, plan)
        self._pending = (plan, [(client(r), self._charge(r, t)) for r, t in plan.scheduled])
        return plan

    def on_step_end(self, plan: StepPlan, now: float) -> None:
        """Charge the service of the step that ran (each call is one executed step)."""
        if self._pending is not None and self._pending[0] is plan:
            charges = self._pending[1]
        else:  # a plan we did not make: requests already advanced, charge by token count
            charges = [
                (
                    self._client(r),
                    (self.input_weight * t if t > 1 else self.output_weight) / r.weight,
                )
                for r, t in plan.scheduled
            ]
        for tenant, amount in charges:
            self._counters[tenant] = self._counters.get(tenant, 0.0) + amount

    # ---- internals ------------------------------------------------------------------------

    def _charge(self, request: Request, tokens: int) -> float:
        """Counter cost of computing ``tokens`` of ``request`` (before the step runs)."""
        left = request.prompt_tokens + request.num_output_tokens - request.num_computed_tokens
        cost = self.input_weight * tokens if left > 1 else 0.0
        if tokens == left:
            cost += self.output_weight  # completing the compute samples one output token
        return cost / request.weight

    def _lift(self, queued: set[str]) -> None:
        """VTC's counter lift for tenants that joined the waiting queue since the last step."""
        previous = self._queued_tenants
        counters = self._counters
        left = previous - queued
        if left:
            self._last_left_counter = max(counters.get(t, 0.0) for t in left)
        joined = queued - previous
        if joined:
            stayed = previous & queued
            floor = min(counters.get(t, 0.0) for t in stayed) if stayed else self._last_left_counter
            for tenant in joined:
                counters[tenant] = max(counters.get(tenant, 0.0), floor)
        self._queued_tenants = frozenset(queued)

    def _admit(self, builder: BatchBuilder, waiting: list[Request]) -> None:
        """Admit the earliest request of the least-served tenant until one does not fit."""
        queues: dict[str, list[Request]] = {}
        for request in arrival_order(waiting):
            queues.setdefault(self._client(request), []).append(request)
        heads = dict.fromkeys(queues, 0)
        heap = [(self._counters.get(t, 0.0), t) for t in queues]
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
