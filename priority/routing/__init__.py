"""Routers: pick the engine instance(s) for each request, behind :class:`Router`.

Routers are looked up by the names the CLI, the simulator and the gateway accept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from priority.routing.base import (
    ExternalPrefills,
    InstanceRole,
    InstanceView,
    RouteDecision,
    Router,
)
from priority.routing.goroute import GoRouter, InstanceEstimate
from priority.routing.simple import (
    MinLoadRouter,
    NoHealthyInstanceError,
    RoundRobinRouter,
    pick_decode_instance,
    prefill_candidates,
)

_REGISTRY: dict[str, type[Router]] = {
    "round-robin": RoundRobinRouter,
    "min-load": MinLoadRouter,
    "goroute": GoRouter,
}

ROUTER_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def router_class(name: str) -> type[Router]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown router {name!r}; known routers: {', '.join(ROUTER_NAMES)}"
        ) from None


def make_router(name: str, instances: Sequence[InstanceView], **params: Any) -> Router:
    """Instantiate a router by name; ``params`` are its keyword parameters."""
    return router_class(name)(instances, **params)


__all__ = [
    "ROUTER_NAMES",
    "ExternalPrefills",
    "GoRouter",
    "InstanceEstimate",
    "InstanceRole",
    "InstanceView",
    "MinLoadRouter",
    "NoHealthyInstanceError",
    "RoundRobinRouter",
    "RouteDecision",
    "Router",
    "make_router",
    "pick_decode_instance",
    "prefill_candidates",
    "router_class",
]
