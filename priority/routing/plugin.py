"""The router plugin shape: a name, a parameters dataclass with defaults, a factory.

Modelled on llm-d's scheduler plugins: every router is registered once under the name the CLI,
the simulator and the gateway accept, with the dataclass of its parameters (so a caller can see
what it takes, and a wrong keyword fails at build time with the dataclass's own message) and a
factory ``factory(instances, **params)``. Routers written before this shape take their
parameters as constructor keywords; their plugin has ``params=None`` and the class as factory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from priority.routing.base import InstanceView, Router

RouterFactory = Callable[..., Router]
"""Called as ``factory(instances, **params)``."""


@dataclass(frozen=True, slots=True)
class RouterPlugin:
    name: str
    router_type: type[Router]
    factory: RouterFactory
    params: type[Any] | None = None
    """Dataclass of the router's parameters, every field defaulted (None: keyword arguments of
    the class itself)."""
    summary: str = ""
    """One line: the system the router stands for."""

    def __post_init__(self) -> None:
        if self.params is not None and not is_dataclass(self.params):
            raise TypeError(f"router {self.name!r}: params must be a dataclass")

    def build(self, instances: Sequence[InstanceView], **params: Any) -> Router:
        return self.factory(instances, **params)

    def accepts(self, param: str) -> bool:
        """Whether the router takes keyword ``param`` (a dataclass field, or an ``__init__``
        keyword of a class-shaped router)."""
        if self.params is not None:
            return any(f.name == param for f in fields(self.params))
        code = self.router_type.__init__.__code__
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        return param in names


def class_plugin(router_type: type[Router], summary: str = "") -> RouterPlugin:
    """The plugin of a router whose constructor takes its parameters as keywords."""
    return RouterPlugin(router_type.name, router_type, router_type, None, summary)
