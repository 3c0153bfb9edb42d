"""Power-of-two-choices: vllm-router's ``power_of_two`` policy, as the baseline users run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from priority.request import Request
from priority.routing.base import InstanceView, RouteDecision, Router
from priority.routing.plugin import RouterPlugin
from priority.routing.simple import pick_decode_instance, prefill_candidates


@dataclass(frozen=True, slots=True)
class PowerOfTwoParams:
    seed: int | None = None
    """Seeds the two draws (None: fresh entropy, as a deployed router would)."""


class PowerOfTwoRouter(Router):
    """vllm-router's power_of_two: draw two instances at random, send to the less loaded.

    The load signal is the one the router itself tracks, outstanding requests (queued prefills,
    other routers' queued prefills, decoding) — what vllm-router counts per worker. Two samples
    instead of a full scan keep herding away when many routers act on the same stale loads;
    with two instances it is Min-Load. Ties go to the lower index. ``route`` draws from the
    generator and changes nothing else.
    """

    name = "power-of-two"

    def __init__(
        self, instances: Sequence[InstanceView], params: PowerOfTwoParams | None = None
    ) -> None:
        super().__init__(instances)
        self.params = params if params is not None else PowerOfTwoParams()
        self.rng = np.random.default_rng(self.params.seed)

    def route(
        self, request: Request, now: float, *, exclude: frozenset[int] = frozenset()
    ) -> RouteDecision:
        candidates = prefill_candidates(self.instances, exclude)
        if len(candidates) > 2:
            first, second = self.rng.choice(len(candidates), size=2, replace=False).tolist()
            candidates = [candidates[first], candidates[second]]
        chosen = min(candidates, key=lambda i: (i.num_outstanding, i.index))
        return RouteDecision(chosen.index, pick_decode_instance(self.instances, exclude))


def power_of_two(instances: Sequence[InstanceView], **params: Any) -> PowerOfTwoRouter:
    return PowerOfTwoRouter(instances, PowerOfTwoParams(**params))


PLUGIN = RouterPlugin(
    PowerOfTwoRouter.name,
    PowerOfTwoRouter,
    power_of_two,
    PowerOfTwoParams,
    "vLLM's Rust router (vllm-router), policy power_of_two",
)
