"""Load-balancing baselines (Round-Robin, Min-Load) and the instance choices every router shares.

Both baselines ignore SLOs and gains; they exist to be compared with GoRouting (PROSERVE uses
Min-Load as its multi-node baseline). Under PD-disaggregation the load-balancing routers pick the
decode instance the same way, :func:`pick_decode_instance`: the one with the most free KV, since
decode instances are memory-bound and do not interfere with prefills (PROSERVE §4.3). Free KV is
compared in *tokens* (blocks times the instance's block size): a 910B's 128-token blocks and an
A100's 16-token blocks are not the same unit, and comparing block counts sent every decode of a
2 x A100 + 2 x 910B PD fleet to the A100 while the 910B decode instance stood idle.
"""

from __future__ import annotations

from collections.abc import Sequence

from priority.request import Request
from priority.routing.base import InstanceRole, InstanceView, RouteDecision, Router

PREFILL_ROLES = (InstanceRole.COLOCATED, InstanceRole.PREFILL)
"""Roles that can take a new request's prefill."""


class NoHealthyInstanceError(RuntimeError):
    """No healthy instance can take the request (the caller should reject or retry it)."""


def prefill_candidates(
    instances: Sequence[InstanceView], exclude: frozenset[int] = frozenset()
) -> list[InstanceView]:
    """Healthy instances that can run a prefill (co-located or PD prefill), in index order,
    less those whose index is in ``exclude`` (treated as unhealthy)."""
    found = [i for i in instances if i.healthy and i.role in PREFILL_ROLES]
    if exclude:
        found = [i for i in found if i.index not in exclude]
    if not found:
        raise NoHealthyInstanceError("no healthy co-located or prefill instance")
    return found


def healthy_decode(
    instances: Sequence[InstanceView], exclude: frozenset[int] = frozenset()
) -> list[InstanceView] | None:
    """The healthy DECODE instances not in ``exclude``; None when there are no DECODE roles at
    all (co-located), :class:`NoHealthyInstanceError` when there are but none is left."""
    decode = [i for i in instances if i.role is InstanceRole.DECODE]
    if not decode:
        return None
    healthy = [i for i in decode if i.healthy and i.index not in exclude]
    if not healthy:
        raise NoHealthyInstanceError("no healthy decode instance")
    return healthy


def pick_decode_instance(
    instances: Sequence[InstanceView], exclude: frozenset[int] = frozenset()
) -> int | None:
    """The decode instance for a PD-disaggregated request; None when there are no DECODE roles.

    Most free KV tokens first (free blocks x block size; an instance that has not reported
    counts as fewest), then fewest decoding requests, then lowest index. Instances in
    ``exclude`` are passed over, as if unhealthy.
    """
    healthy = healthy_decode(instances, exclude)
    if healthy is None:
        return None
    best = min(
        healthy,
        key=lambda i: (
            -(
                i.num_free_kv_blocks * i.profile.engine.block_size
                if i.num_free_kv_blocks is not None
                else -1
            ),
            i.num_decoding,
            i.index,
        ),
    )
    return best.index


class RoundRobinRouter(Router):
    """Cycle over healthy prefill-capable instances, skipping unhealthy ones.

    The cursor advances in :meth:`on_dispatch` (to just after the instance dispatched to), so
    :meth:`route` stays pure: routing the same request twice without dispatching gives the same
    answer. Keying the cursor on instance indices, not on a position in the healthy list, keeps
    the cycle stable when an instance goes down or comes back.
    """

    name = "round-robin"

    def __init__(self, instances: Sequence[InstanceView]) -> None:
        super().__init__(instances)
        self._cursor = 0

    def route(
        self, request: Request, now: float, *, exclude: frozenset[int] = frozenset()
    ) -> RouteDecision:
        candidates = prefill_candidates(self.instances, exclude)
        chosen = next((i for i in candidates if i.index >= self._cursor), candidates[0])
        return RouteDecision(chosen.index, pick_decode_instance(self.instances, exclude))

    def on_dispatch(self, request: Request, decision: RouteDecision, now: float) -> None:
        super().on_dispatch(request, decision, now)
        self._cursor = decision.instance + 1


class MinLoadRouter(Router):
    """Fewest outstanding requests (queued prefills + decoding), ties to the lowest index."""

    name = "min-load"

    def route(
        self, request: Request, now: float, *, exclude: frozenset[int] = frozenset()
    ) -> RouteDecision:
        candidates = prefill_candidates(self.instances, exclude)
        chosen = min(candidates, key=lambda i: (i.num_outstanding, i.index))
        return RouteDecision(chosen.index, pick_decode_instance(self.instances, exclude))
