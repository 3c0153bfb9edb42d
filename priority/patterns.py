"""Historical pattern graphs: sub-deadlines ``D_s = φ(s)·D`` for agent workflows (JITServe §4.1).

A finished workflow is kept as a compact :class:`PatternGraph`: per stage (call) the model id's
hash, its input and output tokens and the time it took; edges are the stage order (a chain — the
gateway and the simulator see calls one after another, and a DAG's branches would need the
client to name each call's parents, which no header does). No prompt text is kept.

**Matching** (:meth:`PatternHistory.match`). At stage s the partial workflow is known: stages
0..s-1 whole (tokens in and out), stage s's model and input tokens when the caller knows them.

* *Structure pruning*: a candidate needs at least s + 1 stages and the same model at every stage
  whose model is known so far (JITServe's "prefix structures that diverge" are pruned).
* *Similarity*: a Gaussian kernel on token counts, ``exp(-Σ d² / 2σ²)`` over every known count
  (inputs of stages 0..s, outputs of stages 0..s-1), with ``d = ln(1 + a) - ln(1 + b)``: the
  difference of *log* token counts, so σ is a relative scale — :data:`DEFAULT_SIGMA` = 0.5 puts
  a count twice (or half) the other's at ``exp(-ln²2 / 0.5) ≈ 0.38`` per term, whether the counts
  are 20 or 20,000. The paper's artifact uses σ = 1 on raw counts, where any two counts more than
  a few tokens apart are dissimilar (``exp(-50) ≈ 0`` at 10 tokens' difference).
* *φ*: ``φ(s) = t_≤s / t_total`` of the candidates, **blended** with their normalised
  similarities (a Nadaraya–Watson estimate) rather than the paper's single best match: when
  several past workflows are about as similar, picking one copies that one's noise (its stragglers)
  into the sub-deadline; the blend averages it out, and it tends to the best match as one
  candidate dominates (small σ, or a close match). None when no candidate survives pruning: the
  caller's cold start.

**Stage time** (:func:`timeline_graph`, the one definition the simulator and the gateway both
use): what the stage added to the workflow's timeline — the end of its last token minus the
latest end of the stages before it (stage 0: minus the workflow's start), never below 0. The
client's own time between calls (tool calls, thinking) is *in* it: JITServe's graphs weigh tool
nodes by their time too, and ``D_s = φ(s)·D`` is a point on the timeline of ``D``, which counts
that time. φ(s) is then "how far along its deadline's timeline a workflow like this was when
stage s ended", whatever part of it was queueing, decoding or the client's. A definition without
the client's time would need each future think time to place ``φ(s)`` on ``D``'s timeline, which
only a simulator replaying a trace knows. :func:`stage_due` turns φ into a call's sub-deadline.

φ is in (0, 1] (a candidate's stage times are ≥ 0 and its total > 0) and each candidate's φ is
non-decreasing in s. Across stages the candidates and their weights change, so a caller that
wants a non-decreasing sequence along one workflow passes the last φ it used as ``at_least``.

**Bounded history** (:class:`PatternHistory`): at most ``capacity`` graphs. Each has a *reuse
score*: 1 when stored, plus its normalised blend weight every time it takes part in a match, and
decayed by :data:`DECAY_PER_HOUR` (0.9, the paper's) per hour of the injectable clock. A graph
added to a full history evicts the one with the lowest decayed score (the oldest among equals).
The paper also clusters the history offline with K-medoids; that is left out here: at the
capacity's 500 graphs a full scan is already well under the paper's 5 ms (``bench/
pattern_match.py``), and eviction by reuse keeps the history the size it is given.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

DEFAULT_SIGMA = 0.5
"""Kernel width on ``ln(1 + tokens)`` (see the module docstring)."""
DEFAULT_CAPACITY = 500
"""Graphs kept (the paper's matching accuracy saturates at about this many)."""
DECAY_PER_HOUR = 0.9
"""A graph's reuse score is multiplied by this every hour (JITServe)."""


def model_hash(model: str) -> int:
    """A stable 63-bit id of a model (or tool) name: what a graph stores instead of the name."""
    digest = hashlib.blake2b(model.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(frozen=True, slots=True)
class PatternStage:
    """One call of a finished workflow."""

    model: int
    """:func:`model_hash` of the model it called."""
    input_tokens: int
    output_tokens: int
    time_s: float
    """What this stage added to the workflow's timeline (>= 0; :func:`timeline_graph`)."""

    def __post_init__(self) -> None:
        if self.input_tokens < 0 or self.output_tokens < 0:
            raise ValueError("token counts must be >= 0")
        if not (self.time_s >= 0 and math.isfinite(self.time_s)):
            raise ValueError(f"a stage's time must be finite and >= 0, got {self.time_s!r}")


@dataclass(frozen=True, slots=True)
class EndedStage:
    """One call of a workflow as it ended: what its graph keeps, and when its last token came
    (on the clock of the workflow's start)."""

    model: int
    """:func:`model_hash` of the model it called."""
    input_tokens: int
    output_tokens: int
    end_s: float


def timeline_graph(start_s: float, ended: Sequence[EndedStage]) -> PatternGraph | None:
    """The pattern graph of a workflow that started at ``start_s`` and whose stages ended as
    ``ended`` (in stage order), each stage's time what it added to the workflow's timeline (module
    docstring); None when they add no time at all (no φ to learn)."""
    stages: list[PatternStage] = []
    latest = start_s
    for done in ended:
        added = max(done.end_s - latest, 0.0)
        latest = max(latest, done.end_s)
        stages.append(PatternStage(done.model, done.input_tokens, done.output_tokens, added))
    if not stages or not latest > start_s:
        return None
    return PatternGraph(tuple(stages))


def stage_due(phi: float, phi_before: float, deadline: float, elapsed: float) -> float:
    """Call s's sub-deadline measured from now (any unit; ``deadline`` D and ``elapsed`` since
    the workflow's start in it): ``φ(s)·D − elapsed``, but never less than the stage's share of
    what is left, ``(φ(s) − φ(s−1)) / (1 − φ(s−1)) · (D − elapsed)``: a workflow behind its
    learned schedule re-plans from now instead of handing a call a deadline already past.
    ``phi_before`` above ``phi`` (a clamped φ) counts as ``phi``."""
    before = min(phi_before, phi)
    share = (phi - before) / (1.0 - before) if before < 1.0 else 1.0
    return max(phi * deadline - elapsed, share * (deadline - elapsed))


@dataclass(frozen=True, slots=True)
class KnownStage:
    """What is known of a stage of the workflow being matched: all of a finished one, the model
    and input (output None) of the one being released; None: not known (not compared)."""

    model: int | None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True, eq=False)
class PatternGraph:
    """A finished workflow: a chain of stages with its cumulative time shares."""

    stages: tuple[PatternStage, ...]
    models: tuple[int, ...] = field(init=False)
    log_tokens: tuple[tuple[float, float], ...] = field(init=False)
    """``(ln(1 + input), ln(1 + output))`` of every stage (the kernel's coordinates)."""
    shares: tuple[float, ...] = field(init=False)
    """``φ(s) = t_≤s / t_total`` for every stage s (the last is 1)."""

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a pattern graph needs at least one stage")
        total = math.fsum(s.time_s for s in self.stages)
        if not total > 0:
            raise ValueError("a pattern graph needs a positive total time")
        cumulative, shares = 0.0, []
        for stage in self.stages:
            cumulative += stage.time_s
            shares.append(min(cumulative / total, 1.0))
        shares[-1] = 1.0
        object.__setattr__(self, "models", tuple(s.model for s in self.stages))
        object.__setattr__(self, "shares", tuple(shares))
        logs = tuple((math.log1p(s.input_tokens), math.log1p(s.output_tokens)) for s in self.stages)
        object.__setattr__(self, "log_tokens", logs)

    def __len__(self) -> int:
        return len(self.stages)

    def phi(self, stage: int) -> float:
        """φ(stage); 0 before the first stage (``stage`` = -1)."""
        return self.shares[stage] if stage >= 0 else 0.0


@dataclass(frozen=True, slots=True)
class Match:
    """The matcher's answer for stage ``stage`` of a partial workflow."""

    phi: float
    """Blended φ(s), in (0, 1]."""
    phi_before: float
    """Blended φ(s - 1) under the same weights (0 at stage 0): the share already behind."""
    candidates: int
    """Graphs that survived structure pruning."""
    best_similarity: float
    """The largest kernel value among them (1: a candidate equal on every known count)."""

    def phi_at_least(self, at_least: float) -> float:
        """φ(s), never below ``at_least`` (the φ used for the stage before: φ never decreases
        along a workflow); a φ of 0 (stages of no time so far) becomes the smallest positive
        float, so it lies in (0, 1]."""
        return min(max(self.phi, at_least, math.ulp(0.0)), 1.0)


@dataclass(slots=True)
class _Entry:
    graph: PatternGraph
    score: float
    stamp_s: float
    order: int


class PatternHistory:
    """A bounded, decaying store of pattern graphs and the matcher over it (module docstring)."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        *,
        sigma: float = DEFAULT_SIGMA,
        decay_per_hour: float = DECAY_PER_HOUR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        if not (sigma > 0 and math.isfinite(sigma)):
            raise ValueError("sigma must be a positive finite number")
        if not 0 < decay_per_hour <= 1:
            raise ValueError("decay_per_hour must be in (0, 1]")
        self.capacity = capacity
        self.sigma = sigma
        self._rate = -math.log(decay_per_hour) / 3600.0
        self._clock = clock
        self._entries: list[_Entry] = []
        self._added = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def graphs(self) -> list[PatternGraph]:
        return [e.graph for e in self._entries]

    def _decayed(self, entry: _Entry, now: float) -> float:
        return entry.score * math.exp(-self._rate * max(now - entry.stamp_s, 0.0))

    def reuse(self, graph: PatternGraph) -> float:
        """``graph``'s decayed reuse score now (0 if it is not stored)."""
        now = self._clock()
        return next((self._decayed(e, now) for e in self._entries if e.graph is graph), 0.0)

    def add(self, graph: PatternGraph) -> PatternGraph | None:
        """Store ``graph``; return the graph evicted to make room, if any."""
        now = self._clock()
        evicted = None
        if len(self._entries) >= self.capacity:
            victim = min(self._entries, key=lambda e: (self._decayed(e, now), e.order))
            self._entries.remove(victim)
            evicted = victim.graph
        self._added += 1
        self._entries.append(_Entry(graph, 1.0, now, self._added))
        return evicted

    def match(self, known: Sequence[KnownStage]) -> Match | None:
        """Match the partial workflow ``known`` (stages 0..s, s = ``len(known) - 1``); None when
        no stored graph has its structure (cold start)."""
        s = len(known) - 1
        if s < 0:
            raise ValueError("match needs at least the stage being released")
        models = tuple(k.model for k in known)
        partial = None in models
        checks = [(i, m) for i, m in enumerate(models) if m is not None]
        coords = [
            (stage, side, math.log1p(value))
            for stage, k in enumerate(known)
            for side, value in enumerate((k.input_tokens, k.output_tokens))
            if value is not None
        ]
        scale = 1.0 / (2.0 * self.sigma * self.sigma)
        found: list[tuple[_Entry, float]] = []
        for entry in self._entries:
            graph = entry.graph
            if len(graph.models) <= s:
                continue
            if partial:
                if any(graph.models[i] != m for i, m in checks):
                    continue
            elif graph.models[: s + 1] != models:
                continue
            logs = graph.log_tokens
            d2 = math.fsum((v - logs[stage][side]) ** 2 for stage, side, v in coords)
            found.append((entry, -scale * d2))
        if not found:
            return None
        top = max(log_w for _, log_w in found)
        weights = [math.exp(log_w - top) for _, log_w in found]
        norm = math.fsum(weights)
        phi = math.fsum(w * e.graph.shares[s] for (e, _), w in zip(found, weights, strict=True))
        before = math.fsum(w * e.graph.phi(s - 1) for (e, _), w in zip(found, weights, strict=True))
        now = self._clock()
        for (entry, _), w in zip(found, weights, strict=True):
            entry.score = self._decayed(entry, now) + w / norm
            entry.stamp_s = now
        return Match(
            phi=min(max(phi / norm, 0.0), 1.0),
            phi_before=min(max(before / norm, 0.0), 1.0),
            candidates=len(found),
            best_similarity=math.exp(top),
        )

    def phi(self, known: Sequence[KnownStage], *, at_least: float = 0.0) -> float | None:
        """The matched φ(s) (:meth:`Match.phi_at_least`); None for no match."""
        found = self.match(known)
        return None if found is None else found.phi_at_least(at_least)
