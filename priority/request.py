"""The request model shared by the simulator, the emulated engines and the engine plugins.

Token accounting follows vLLM's: a request owns ``num_tokens = prompt_tokens + num_output_tokens``
tokens, of which ``num_computed_tokens`` have their KV computed. It still needs
``num_tokens - num_computed_tokens`` tokens of compute; when that is 1 it is *decoding*, when it
is more it is *prefilling* (a fresh prompt, or the recompute of a preempted request). Completing
the compute of all its tokens samples one new output token.

All times are seconds. ``arrival_s`` is the gateway arrival time on the engine's clock; deadlines
are measured from it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:  # annotation only: keeps priority.lengths free to import this module
    from priority.lengths.distribution import LengthDistribution

REQUEST_KINDS: tuple[str, ...] = ("latency", "deadline", "compound", "best-effort")
"""What a request's value depends on (gains in :mod:`priority.gain`): *latency* —
TTFT + TPOT per token; *deadline* — all tokens count if it ends by its deadline; *compound* — one
call of an agent workflow whose calls count together if the last ends by the workflow deadline
(``slo.deadline_s`` holds this call's sub-deadline); *best-effort* — a default deadline so it
never starves."""


def relative_ttft_s(zero_load_ttft_s: float, scale: float, floor_s: float) -> float:
    """A TTFT objective relative to the hardware: ``scale`` times the prompt's TTFT on an idle
    engine, at least ``floor_s`` (the simulator's default SLOs and the engines' defaults for a
    request that names none: a fixed number of seconds would be lax for a short prompt on an
    H100 and unmeetable for a long one on a small accelerator)."""
    return max(scale * zero_load_ttft_s, floor_s)


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives of one request.

    A *streaming* (latency-sensitive) request has ``ttft_s`` and ``tpot_s``: token i is due at
    ``ttft_s + (i - 1) * tpot_s`` after arrival (PROSERVE Eq. 3). A *deadline-sensitive* request
    has only ``deadline_s``: every token is due by the end-to-end deadline. Both may be set; then
    each token is due at the earlier of the two.
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.ttft_s is None and self.deadline_s is None:
            raise ValueError("an SLO needs ttft_s (streaming) or deadline_s (end-to-end)")
        if (self.ttft_s is None) != (self.tpot_s is None):
            raise ValueError("ttft_s and tpot_s go together")
        for name in ("ttft_s", "tpot_s", "deadline_s"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")

    @property
    def is_streaming(self) -> bool:
        return self.ttft_s is not None

    def token_due_s(self, index: int) -> float:
        """Due time of the ``index``-th output token (1-based), relative to arrival."""
        due = math.inf
        if self.ttft_s is not None and self.tpot_s is not None:
            due = self.ttft_s + (index - 1) * self.tpot_s
        if self.deadline_s is not None:
            due = min(due, self.deadline_s)
        return due

    @property
    def time_unit_s(self) -> float:
        """The natural SLO unit: TPOT for streaming, the deadline otherwise (starvation scale)."""
        if self.tpot_s is not None:
            return self.tpot_s
        assert self.deadline_s is not None
        return self.deadline_s


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """What one request tells the scheduler about itself, beyond its tokens: defined once here,
    in the core's units (seconds, :class:`SLO`), data only.

    The gateway builds it (``gateway.app.slo.resolve_slo``, then kinds and stages), the protocol
    writes and reads it (:func:`engine_common.protocol.encode` / ``parse``: the only code that
    knows key names and milliseconds), and every engine turns it into its :class:`Request`
    with :meth:`Request.from_meta`. A new objective is a field here, a key in the protocol and a
    line in :meth:`Request.from_meta`.
    """

    slo: SLO
    """The objectives the engine schedules for (a workflow call's deadline is its share D_s)."""
    weight: float
    tier: str
    tenant: str
    arrival_s: float | None = None
    """The gateway's arrival time (Unix seconds), or None: the engine's own arrival counts."""
    has_slo: bool = True
    """False: best effort, the request named no objective and :attr:`slo` is the engine's
    default (such a meta is written without objectives, so the engine fills its own in)."""
    ignored: tuple[str, ...] = ()
    """Keys the protocol's reader found malformed or out of range (they took their defaults)."""
    kind: str = "latency"
    """One of :data:`REQUEST_KINDS`."""
    workflow_id: str | None = None
    stage: int = 0
    """The call's stage in its workflow (0 without a workflow)."""
    workflow_deadline_s: float | None = None
    """A workflow call given a share: the time left to its workflow's deadline, from its
    arrival (then ``slo.deadline_s`` is the share, never more); None otherwise."""
    length: LengthDistribution | None = None
    """Output-length distribution, without a cap (each engine caps it by ``max_tokens``)."""

    @property
    def end_to_end_slo(self) -> SLO:
        """The objectives the request is judged by end to end: :attr:`slo`, with a workflow
        call's deadline being its workflow's rather than its share (the gateway's view)."""
        if self.workflow_deadline_s is None:
            return self.slo
        return dataclasses.replace(self.slo, deadline_s=self.workflow_deadline_s)


class RequestStatus(Enum):
    WAITING = "waiting"  # not holding KV: new, or preempted (to be recomputed)
    RUNNING = "running"  # holding KV blocks on an engine
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    """One inference request and its scheduling state on an engine.

    ``true_output_tokens`` exists only in simulation (the oracle length); policies that claim
    not to use it must read ``predicted_output_tokens`` or ``max_output_tokens`` instead.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    slo: SLO
    weight: float = 1.0
    tier: str = "default"
    tenant: str = "default"
    max_output_tokens: int = 4096
    true_output_tokens: int | None = None
    predicted_output_tokens: int | None = None
    kind: str = "latency"
    """One of :data:`REQUEST_KINDS`."""
    workflow_id: str | None = None
    """The compound workflow this call belongs to (None: not a workflow call)."""
    stage: int = 0
    """The call's stage in its workflow (0 = first)."""
    length: LengthDistribution | None = None
    """Output-length distribution, the bound source of length-aware policies (None: they fall
    back to ``predicted_output_tokens``, then ``max_output_tokens``)."""

    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_kv_blocks: int = 0
    num_preemptions: int = 0
    tokens_since_resume: int = 0
    token_times: list[float] = field(default_factory=list)
    first_scheduled_s: float | None = None
    finished_s: float | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {self.max_output_tokens}")
        if self.weight <= 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")
        if self.kind not in REQUEST_KINDS:
            raise ValueError(f"kind must be one of {', '.join(REQUEST_KINDS)}, got {self.kind!r}")
        if self.stage < 0:
            raise ValueError(f"stage must be >= 0, got {self.stage}")

    @classmethod
    def from_meta(
        cls,
        meta: RequestMeta,
        request_id: str,
        *,
        arrival_s: float,
        prompt_tokens: int,
        max_output_tokens: int,
        true_output_tokens: int | None = None,
        end_to_end: bool = False,
    ) -> Self:
        """The one constructor from a request's metadata (engines, replays, the gateway).

        ``arrival_s`` is on the caller's clock (the meta's is a Unix time, or None);
        ``end_to_end`` judges a workflow call by its workflow's deadline instead of its share
        (:attr:`RequestMeta.end_to_end_slo`). The length distribution is capped by
        ``max_output_tokens``: the wire carries no cap.
        """
        length = meta.length
        if length is not None:
            length = dataclasses.replace(length, max_tokens=max_output_tokens)
        return cls(
            request_id=request_id,
            arrival_s=arrival_s,
            prompt_tokens=prompt_tokens,
            slo=meta.end_to_end_slo if end_to_end else meta.slo,
            weight=meta.weight,
            tier=meta.tier,
            tenant=meta.tenant,
            max_output_tokens=max_output_tokens,
            true_output_tokens=true_output_tokens,
            kind=meta.kind,
            workflow_id=meta.workflow_id,
            stage=meta.stage,
            length=length,
        )

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while more than one token needs compute (fresh prompt or recompute)."""
        return self.num_uncomputed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def target_output_tokens(self) -> int:
        """How many tokens the request will produce: the oracle in simulation, else the cap."""
        if self.true_output_tokens is not None:
            return min(self.true_output_tokens, self.max_output_tokens)
        return self.max_output_tokens

    @property
    def expected_output_tokens(self) -> int:
        """The length a non-oracle policy may assume: the prediction, else the cap."""
        if self.predicted_output_tokens is not None:
            return max(self.predicted_output_tokens, self.num_output_tokens + 1)
        return self.max_output_tokens

    def length_bound(self, q: float) -> int:
        """The ``q``-quantile bound of the total output length given what was generated: from
        :attr:`length`, else the prediction, else the cap (never below ``generated + 1``)."""
        generated = self.num_output_tokens
        if self.length is not None:
            bound = self.length.bound(q, generated)
        elif self.predicted_output_tokens is not None:
            bound = self.predicted_output_tokens
        else:
            bound = self.max_output_tokens
        return max(min(bound, self.max_output_tokens), generated + 1)

    def next_token_deadline_s(self) -> float:
        """Absolute due time of the next output token."""
        return self.arrival_s + self.slo.token_due_s(self.num_output_tokens + 1)
