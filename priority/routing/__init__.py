"""Routers: pick the engine instance(s) for each request, behind :class:`Router`.

Routers are looked up by the names the CLI, the simulator and the gateway accept, in one
registry of :class:`~priority.routing.plugin.RouterPlugin` (name, parameters, factory).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from priority.routing import least_ttft, power_of_two
from priority.routing.base import (
    ExternalPrefills,
    InstanceRole,
    InstanceView,
    RouteDecision,
    Router,
)
from priority.routing.goroute import GoRouter, InstanceEstimate
from priority.routing.least_ttft import LeastTtftParams, LeastTtftRouter
from priority.routing.plugin import RouterPlugin, class_plugin
from priority.routing.power_of_two import PowerOfTwoParams, PowerOfTwoRouter
from priority.routing.simple import (
    MinLoadRouter,
    NoHealthyInstanceError,
    RoundRobinRouter,
    pick_decode_instance,
    prefill_candidates,
)

_PLUGINS: tuple[RouterPlugin, ...] = (
    class_plugin(RoundRobinRouter, "round-robin, as every load balancer offers"),
    class_plugin(MinLoadRouter, "fewest outstanding requests (PROSERVE's Min-Load baseline)"),
    class_plugin(GoRouter, "PROSERVE's GoRouting (Algorithm 2), fallback by expected gain"),
    power_of_two.PLUGIN,
    least_ttft.PLUGIN,
)
_REGISTRY: dict[str, RouterPlugin] = {p.name: p for p in _PLUGINS}

ROUTER_NAMES: tuple[str, ...] = tuple(_REGISTRY)

USERS_ROUTERS: tuple[str, ...] = ("round-robin", "min-load", "power-of-two", "least-predicted-ttft")
"""The routers a team runs today (the honest baselines of the fleet benchmarks)."""


def router_plugin(name: str) -> RouterPlugin:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown router {name!r}; known routers: {', '.join(ROUTER_NAMES)}"
        ) from None


def router_class(name: str) -> type[Router]:
    return router_plugin(name).router_type


def make_router(name: str, instances: Sequence[InstanceView], **params: Any) -> Router:
    """Instantiate a router by name; ``params`` are its keyword parameters."""
    return router_plugin(name).build(instances, **params)


__all__ = [
    "ROUTER_NAMES",
    "USERS_ROUTERS",
    "ExternalPrefills",
    "GoRouter",
    "InstanceEstimate",
    "InstanceRole",
    "InstanceView",
    "LeastTtftParams",
    "LeastTtftRouter",
    "MinLoadRouter",
    "NoHealthyInstanceError",
    "PowerOfTwoParams",
    "PowerOfTwoRouter",
    "RoundRobinRouter",
    "RouteDecision",
    "Router",
    "RouterPlugin",
    "make_router",
    "pick_decode_instance",
    "prefill_candidates",
    "router_class",
    "router_plugin",
]
