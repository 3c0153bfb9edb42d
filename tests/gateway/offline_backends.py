"""Backends that no engine stands behind, for tests of routing and dispatch without a server."""

from __future__ import annotations

from gateway.app.backends import Backend, BackendSpec
from priority.profiles import load_profile
from priority.routing.base import InstanceView


def offline_backends(model: str, *names: str) -> list[Backend]:
    """One A100-profiled backend per name at ``http://<name>:8000`` (never contacted)."""
    profile = load_profile("a100-qwen2-7b")
    return [
        Backend(
            BackendSpec(name, f"http://{name}:8000", model, profile),
            profile,
            InstanceView(index, name, profile, profile.estimator()),
        )
        for index, name in enumerate(names)
    ]
