"""The router contract: pick the engine instance(s) for a request.

Routers keep gateway-side state about each instance from the events the caller reports
(dispatch, first token, finish, scraped metrics), so the same objects serve the simulator and the
gateway. PROSERVE's GoRouting needs exactly this state: each instance's queued prefills with the
time they were last updated, and its count of decoding requests.

A router that is one of several in front of the same engines (gateway workers) also sees the
prefills the *others* queued there, as one :class:`ExternalPrefills` summary per instance that
its caller fills in (:attr:`InstanceView.external_prefills`); this package never learns where
the summary comes from.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from math import inf

from priority.estimator import BatchLatencyEstimator
from priority.profiles import Profile
from priority.request import Request
from priority.routing.prefill_queue import PrefillQueue, PrefillTotals


class InstanceRole(Enum):
    COLOCATED = "colocated"  # prefill and decode on the same instance
    PREFILL = "prefill"  # PD-disaggregated prefill-only instance
    DECODE = "decode"  # PD-disaggregated decode-only instance


@dataclass(frozen=True, slots=True)
class ExternalPrefills:
    """Prefills queued on an instance by other routers (other gateway workers), summarised.

    Pure data, so that it can cross a process boundary as a few numbers: what GoRouting's
    ``phi`` needs of a queue, not the requests themselves. ``raw_work`` and ``chunks`` are in
    the instance's own estimator units (every router in front of an instance uses its profile).
    Frozen and compared by value: an unchanged summary keeps a router's memo of the queue.
    """

    count: int
    prompt_tokens: int
    raw_work: float
    """Sum of the uncorrected (beta = 1) chunked prefill time of the prompts (seconds)."""
    chunks: int
    min_tpot_s: float = inf
    """Smallest TPOT SLO among them (inf: none)."""
    earliest_deadline_s: float = inf
    """Earliest first-token deadline among them (same clock as ``Request.arrival_s``)."""
    updated_s: float = 0.0
    """When the latest of those queues last changed (for lag compensation)."""


@dataclass(slots=True)
class InstanceView:
    """What a router knows about one instance."""

    index: int
    name: str
    profile: Profile
    estimator: BatchLatencyEstimator
    role: InstanceRole = InstanceRole.COLOCATED
    healthy: bool = True
    prefill_queue: dict[str, Request] = field(default_factory=PrefillQueue)
    """Dispatched requests whose first token has not been seen (PROSERVE's PrefillQueueMap).
    A :class:`PrefillQueue` (a plain dict given here is copied into one), whose running totals
    :attr:`prefill_totals` reads in O(1)."""
    queue_updated_s: float = 0.0
    """When ``prefill_queue`` last changed (for lag compensation)."""
    num_decoding: int = 0
    """Requests past their first token and not finished (n_d)."""
    num_free_kv_blocks: int | None = None
    """Last reported free KV blocks (decode-instance choice in PD-disaggregation)."""
    external_prefills: ExternalPrefills | None = None
    """Prefills other routers queued here and have not seen a first token for (None: none
    known). Counted as queued prefill work, so callers must not count them again in
    :attr:`num_decoding`."""

    def __post_init__(self) -> None:
        if not isinstance(self.prefill_queue, PrefillQueue):
            self.prefill_queue = PrefillQueue(self.prefill_queue)

    @property
    def prefill_totals(self) -> PrefillTotals:
        """Count, prompt tokens, raw work and chunks (in this instance's estimator units), smallest
        TPOT SLO and earliest first-token deadline of :attr:`prefill_queue`: O(1), from the
        queue's running totals (recomputed once if the estimator's coefficients or the chunk
        size changed since the last call). A plain dict assigned after construction is summed
        afresh, O(W), on every call: correct, only slow."""
        queue = self.prefill_queue
        if not isinstance(queue, PrefillQueue):
            queue = PrefillQueue(queue)
        return queue.totals(self.estimator.coefficients, self.profile.engine.max_num_batched_tokens)

    @property
    def num_external_prefills(self) -> int:
        return 0 if self.external_prefills is None else self.external_prefills.count

    @property
    def num_outstanding(self) -> int:
        return len(self.prefill_queue) + self.num_external_prefills + self.num_decoding


@dataclass(frozen=True, slots=True)
class RouteDecision:
    instance: int
    """Co-located instance, or the prefill instance under PD-disaggregation."""
    decode_instance: int | None = None
    """Decode instance under PD-disaggregation, else None."""
    expected_gain: float | None = None
    """The router's estimate of the gain this placement adds (GoRouting's Delta), if any."""
    predicted_ttft_s: float | None = None
    """The router's estimate of the time from dispatch to the first token on this placement
    (GoRouting's Exec(p, r)), if it makes one: what admission control adds its own queue wait to."""


def _decode_target(decision: RouteDecision) -> int:
    """Where the request decodes: its decode instance under PD-disaggregation, else in place."""
    if decision.decode_instance is not None:
        return decision.decode_instance
    return decision.instance


class Router(ABC):
    name: str = "router"

    def __init__(self, instances: Sequence[InstanceView]) -> None:
        if not instances:
            raise ValueError("a router needs at least one instance")
        for position, inst in enumerate(instances):
            if inst.index != position:
                raise ValueError(
                    f"instance {inst.name!r} has index {inst.index} but sits at position {position}"
                )
        self.instances = list(instances)

    def candidates(
        self, role: InstanceRole, exclude: frozenset[int] = frozenset()
    ) -> list[InstanceView]:
        """Healthy instances of ``role``, less those whose index is in ``exclude``."""
        return [
            i for i in self.instances if i.healthy and i.role is role and i.index not in exclude
        ]

    @abstractmethod
    def route(
        self, request: Request, now: float, *, exclude: frozenset[int] = frozenset()
    ) -> RouteDecision:
        """Choose where ``request`` runs. Must not mutate state (see :meth:`on_dispatch`).

        ``exclude``: instance indices that sit this decision out, as if unhealthy, for the
        prefill and the decode instance alike (a caller retrying a request elsewhere after those
        failed it, without touching :attr:`InstanceView.healthy`, which other requests read).
        With every eligible instance excluded, :class:`NoHealthyInstanceError` is raised."""

    # ---- state updates reported by the caller -----------------------------------------------

    def on_dispatch(self, request: Request, decision: RouteDecision, now: float) -> None:
        inst = self.instances[decision.instance]
        inst.prefill_queue[request.request_id] = request
        inst.queue_updated_s = now

    def on_first_token(self, request: Request, decision: RouteDecision, now: float) -> None:
        inst = self.instances[decision.instance]
        if inst.prefill_queue.pop(request.request_id, None) is not None:
            inst.queue_updated_s = now
        self.instances[_decode_target(decision)].num_decoding += 1

    def on_finish(
        self, request: Request, decision: RouteDecision, now: float, *, saw_first_token: bool
    ) -> None:
        inst = self.instances[decision.instance]
        if inst.prefill_queue.pop(request.request_id, None) is not None:
            inst.queue_updated_s = now
        if saw_first_token:
            target = _decode_target(decision)
            self.instances[target].num_decoding = max(0, self.instances[target].num_decoding - 1)

    def decode_at_handoff(
        self, request: Request, decision: RouteDecision, now: float
    ) -> RouteDecision:
        """PD-disaggregation: the decision to hand ``request`` off with, now that its first
        token is out (called before :meth:`on_first_token`). By default the decode instance
        chosen at dispatch; a router may re-pick it from what it knows now (a decode instance
        that pulls the KV when it admits the request can be named this late)."""
        return decision

    def on_kv_report(self, index: int, num_free_kv_blocks: int) -> None:
        self.instances[index].num_free_kv_blocks = num_free_kv_blocks
