"""Compound workflows and length bounds in the simulator.

**Sub-deadlines, cold start.** A workflow of S calls has an end-to-end deadline D from stage 0's
arrival; call s gets the absolute sub-deadline ``start + think(1..s) + φ(s) · (D − think(all))``
with ``φ(s)`` the share of the workflow's expected tokens (prompt + expected output) in stages
0..s. Think times are not compute, so they are taken out of D first and added back where they
fall. This is JITServe's ``D_s = φ(s)·D`` with φ from token shares — the rule for a workflow
without history. With ``--workflow-history on`` (``ClusterConfig.workflow_history``) JITServe's
*historical pattern graphs* (:mod:`priority.patterns`) replace this rule when a match exists:
workflows that finished earlier in the run are matched against each call's partial workflow at
its release, and the call is due where the gateway would put it — φ(s) of the whole timeline,
think times included, as the gateway learns it (:mod:`priority.sim.history`); a call without a
match keeps the cold start.

**Length bounds** (``--lengths``): ``oracle`` gives each request its true length as a point
distribution; ``max-tokens`` gives none (policies fall back to the cap); ``predicted`` gives the
distribution a predictor would have sent, the truth blurred by ``--length-error``
(:mod:`priority.sim.length_error`). Its default, ``measured``, replays the error the real
predictor (the quantile regression forest of :mod:`priority.lengths`) shows on held-out HH-RLHF
data (``data/length_error_hh.csv``, written by ``scripts/length_error_model.py``): the median's
log-error is drawn from the measured empirical distribution of ``log(true / forest median)``,
and the quantile vector at the forest's levels is shaped so that each simulated ``l``-quantile
covers the true length as often as the forest's did (e.g. its 0.95-quantile 95.6% of
the time). ``lognormal:SIGMA`` is the earlier calibrated lognormal stand-in. The cap
(``max_tokens``) of every request becomes ``max(DEFAULT_MAX_TOKENS, true)`` in these modes, so
a cap never reveals the length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from priority.lengths.distribution import LengthDistribution
from priority.sim.length_error import LengthError, load_measured

LENGTH_MODES: tuple[str, ...] = ("oracle", "predicted", "max-tokens")
DEFAULT_MAX_TOKENS = 4096
"""The ``max_tokens`` a simulated client sends (the trace holds none)."""
MIN_SUB_DEADLINE_S = 1e-3
"""A call arriving after its sub-deadline still gets a positive (already missed) deadline."""


@dataclass(frozen=True, slots=True)
class WorkflowCall:
    """Where one call sits in its workflow (what the simulator needs to release it)."""

    workflow_id: str
    stage: int
    previous: str | None
    """Request id of the stage before (None for stage 0)."""
    think_s: float
    """Delay after the previous stage finishes."""
    offset_s: float
    """Its absolute sub-deadline minus the workflow's start."""
    deadline_s: float
    """The workflow's end-to-end deadline D."""

    def sub_deadline_s(
        self, start_s: float, arrival_s: float, offset_s: float | None = None
    ) -> float:
        """The call's ``slo.deadline_s`` (relative to its own arrival); ``offset_s`` replaces
        the planned (cold-start) offset, e.g. one from the workflow history."""
        offset = self.offset_s if offset_s is None else offset_s
        return max(start_s + offset - arrival_s, MIN_SUB_DEADLINE_S)


def cold_start_offsets(
    expected_tokens: Sequence[float], think_s: Sequence[float], deadline_s: float
) -> list[float]:
    """Sub-deadline of each stage relative to the workflow start (the module's cold-start rule).

    ``think_s[k]`` is stage k's delay after stage k − 1 (``think_s[0]`` is ignored).
    """
    total = float(sum(expected_tokens)) or 1.0
    thinks = [0.0, *map(float, think_s[1:])]
    compute = max(deadline_s - sum(thinks), 0.0)
    offsets = []
    share = think = 0.0
    for tokens, gap in zip(expected_tokens, thinks, strict=True):
        share += float(tokens) / total
        think += gap
        offsets.append(think + min(share, 1.0) * compute)
    return offsets


def length_for(
    mode: str,
    true_tokens: int,
    cap: int,
    rng: np.random.Generator,
    error: LengthError | None = None,
) -> LengthDistribution | None:
    """The ``Request.length`` of one simulated request under ``mode`` (see the module doc);
    ``error`` is the ``predicted`` mode's error model (None: the measured one)."""
    if mode == "oracle":
        return LengthDistribution.point(true_tokens, max_tokens=cap)
    if mode == "max-tokens":
        return None
    if mode != "predicted":
        raise ValueError(f"unknown lengths mode {mode!r}; known: {', '.join(LENGTH_MODES)}")
    return (error or load_measured()).sample(true_tokens, cap, rng)
