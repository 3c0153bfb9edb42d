"""How long the gateway waits on an engine, from the request's own SLO.

Three bounds, each ``factor x objective`` clamped to ``[min, max]`` (``TIERGATE_*`` settings):

* **first token** (streaming): ``ttft x first_token_timeout_factor``, measured from the
  request's first dispatch — time in the gateway's admission queue is the gateway's, not the
  engine's, and the admission queue has its own TTL. An attempt without its first token by then
  is abandoned (its connection closed, so the engine aborts it) and retried on another backend;
  a retry gets what is left of that budget, never a fresh one, but at least ``min`` (a retry
  with no time at all would be a failure with extra steps). A best-effort request — its tier
  allows best effort and the router saw no backend meeting its TTFT — gets ``max``.
* **whole response** (non-streaming: no first token can be seen): the time the engine should
  need at the SLO, ``ttft + tpot x expected_output`` (``max_tokens``, else the default), times
  the same factor, bounded below by the first-token ``min`` and above by the upstream read
  timeout; best effort gets that read timeout.
* **stall** (after the first token): no event for ``tpot x stall_timeout_factor`` ends the
  stream with an error event. Generous on purpose: an engine may preempt a request (vLLM
  recomputes it later), which pauses one stream without anything being wrong.

A deadline (``x-slo-deadline-ms`` or the tier's) caps the first two, from arrival: nothing is
worth waiting for past it — except for a best-effort request, which has given its deadline up
(it was demoted because the deadline could not be met) and is served as best effort.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.settings import Settings
from priority.request import RequestMeta


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), max(low, high))


@dataclass(frozen=True, slots=True)
class AttemptBudget:
    """When a request's attempts must have produced (a first token, or the whole response)."""

    end: float
    """Monotonic time by which the engine must have answered."""
    floor_s: float
    """The least time any single attempt is given."""

    def timeout(self, now: float) -> float:
        """Seconds the attempt starting at ``now`` may take: what is left, at least the floor."""
        return max(self.floor_s, self.end - now)


def attempt_budget(
    settings: Settings,
    meta: RequestMeta,
    *,
    stream: bool,
    expected_output: int,
    best_effort: bool,
    arrival: float,
    first_dispatch: float,
) -> AttemptBudget:
    """The budget of a request's attempts, starting at its first dispatch (module docstring);
    a workflow call's deadline is its workflow's (:attr:`RequestMeta.end_to_end_slo`)."""
    slo = meta.end_to_end_slo
    ttft_s, tpot_s = _streaming(meta)
    floor = settings.first_token_timeout_min_s
    factor = settings.first_token_timeout_factor
    if stream:
        ceiling = settings.first_token_timeout_max_s
        wanted = ceiling if best_effort else factor * ttft_s
    else:
        ceiling = settings.upstream_timeout_s
        at_slo = ttft_s + tpot_s * max(0, expected_output)
        wanted = ceiling if best_effort else factor * at_slo
    end = first_dispatch + _clamp(wanted, floor, ceiling)
    if slo.deadline_s is not None and not best_effort:  # best effort gave its deadline up
        end = min(end, arrival + slo.deadline_s)
    return AttemptBudget(end=end, floor_s=floor)


def stall_timeout(settings: Settings, meta: RequestMeta) -> float:
    """Seconds a stream may go without an event after its first token."""
    wanted = settings.stall_timeout_factor * _streaming(meta)[1]
    return _clamp(wanted, settings.stall_timeout_min_s, settings.stall_timeout_max_s)


def _streaming(meta: RequestMeta) -> tuple[float, float]:
    """The request's TTFT and TPOT: the gateway gives every request both (its tier's)."""
    ttft_s, tpot_s = meta.slo.ttft_s, meta.slo.tpot_s
    if ttft_s is None or tpot_s is None:
        raise ValueError("a gateway request's SLO has a TTFT and a TPOT (its tier's at least)")
    return ttft_s, tpot_s
