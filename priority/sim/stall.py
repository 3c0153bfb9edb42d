"""A livelock guard for step loops: fail loudly when a run stops making progress.

A scheduler bug can leave an engine busy forever without serving anyone (GMAX once started
one long prompt's first chunk each step and preempted the one it had started the step before).
A replay or a simulation without a step limit then hangs instead of failing. Every step loop
(:class:`priority.sim.engine.EngineCore`, the vLLM replay) feeds a :class:`StallGuard` whether
the step made progress — a token emitted or a request finished — and the guard raises
:class:`LivelockError` after ``limit`` consecutive steps without any, naming the policy and the
requests it was stuck on. A long prompt's chunked prefill makes no token for a few steps, so
the limit is large (a prefill of the longest prompt takes at most a few hundred steps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

DEFAULT_MAX_STALLED_STEPS = 100_000
"""Consecutive steps without a token or a finish before a run is declared livelocked."""


class LivelockError(RuntimeError):
    """A step loop ran ``limit`` consecutive steps without emitting a token (a scheduler bug)."""


class StallGuard:
    """Counts consecutive steps without progress; raises once they reach ``limit``.

    ``limit`` None never raises (a caller that bounds its run otherwise)."""

    __slots__ = ("label", "limit", "stalled")

    def __init__(self, label: str, limit: int | None = DEFAULT_MAX_STALLED_STEPS) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"the stall limit must be >= 1 or None, got {limit}")
        self.label = label
        self.limit = limit
        self.stalled = 0

    def step(self, progressed: bool, stuck: Callable[[], Iterable[str]], steps: int = 1) -> None:
        """Record ``steps`` executed steps; ``stuck`` describes the queued requests (called
        only when the guard fires)."""
        if progressed:
            self.stalled = 0
            return
        self.stalled += steps
        if self.limit is not None and self.stalled >= self.limit:
            shown = list(stuck())
            more = f" (+{len(shown) - 10} more)" if len(shown) > 10 else ""
            raise LivelockError(
                f"policy {self.label!r} made no progress (no token, no finish) in "
                f"{self.stalled} steps: livelocked on {', '.join(shown[:10])}{more}"
            )
