"""What the emulated engines were sent: each submitted core request, recorded as it arrives.

Tests that check what reaches an engine (kinds, deadlines, length distributions) read the
requests the engine's own parser made of the gateway's ``vllm_xargs``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from engine_emulated import EngineSpec, EngineThread
from gateway.app import BackendSpec
from priority.request import Request as CoreRequest


def record_submissions(engines: Sequence[Any]) -> list[CoreRequest]:
    """Wrap every running engine's ``submit``; return the list it appends each request to."""
    submitted: list[CoreRequest] = []
    for running in engines:
        loop = running.sim.engine
        original = loop.submit

        def spy(request: CoreRequest, reason: str, _original: Any = original) -> Any:
            submitted.append(request)
            return _original(request, reason)

        loop.submit = spy
    return submitted


@contextmanager
def spied_engine(
    model: str, profile: str = "a100-qwen2-7b", policy: str = "vllm-v1-priority"
) -> Iterator[tuple[list[BackendSpec], list[CoreRequest]]]:
    """One emulated engine serving ``model``: its backend spec and what it was sent."""
    with EngineThread([EngineSpec(profile, policy, model)]) as engines:
        submitted = record_submissions(engines)
        backends = [BackendSpec("engine-0", engines[0].url, model, engines[0].spec.profile)]
        yield backends, submitted
