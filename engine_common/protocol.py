"""The gateway→engine protocol: every field tiergate sends an engine, its bounds and defaults.

Like vLLM's ``v1/core/sched/output.py`` this module is data only — key names, bounds, the
engine's defaults and the two functions that write and read a request's metadata — and imports
neither vLLM nor a web framework, so the gateway, the emulated engine and the vLLM plugins all
load the same copy. The metadata itself is the core's :class:`~priority.request.RequestMeta`
(seconds, the core's ``SLO``), defined once there; this module alone knows its wire form (key
names, milliseconds): :func:`encode` writes it, :func:`parse` reads it back.

The wire format is vLLM's own OpenAI body, nothing added:

* ``priority`` — vLLM's field (an integer, lower is served first); the engine turns it into a
  weight only when ``tiergate_weight`` is absent or unusable;
* ``vllm_xargs`` — vLLM's extension dict (``SamplingParams.extra_args`` inside the engine),
  carrying the ``tiergate_*`` keys below. vLLM's API server already answers 400 for a value that
  is not a string, a number or a list of them; everything else reaches the scheduler.

**Who writes:** the gateway (``gateway.app.proxy``, with :func:`encode` and
:func:`priority_from_weight`) and the replays (``engine_harness.sim_replay``).
**Who reads:** the vLLM plugins (``engine_cuda``, ``engine_ascend``, through
:func:`engine_common.slo.parse_meta` in ``engine_common.scheduler``) and the emulated engine
(``engine_emulated.mapping``, through the same ``parse_meta``), both with :func:`parse`.

**Rule for values: a strict writer, a lenient reader.** :func:`encode` raises ``ValueError``
on a value outside its bounds, so a gateway bug fails in the gateway (and its tests). :func:`parse`
never rejects a request: a key that is absent takes its default, and so does one whose value is
malformed (wrong type, not a number) or out of range (not finite, not positive) — that key is
listed in :attr:`RequestMeta.ignored` for the caller to count and log. vLLM's scheduler cannot
answer 400 (``add_request`` runs in the engine core after the API server accepted the request),
so the real plugin can only fall back; the emulated engine does exactly the same, so tests
against it see what the real engine does. Keys without the ``tiergate_`` prefix are not ours and
are ignored silently, as vLLM ignores ``vllm_xargs`` no extension reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from priority.lengths.distribution import LengthDistribution
from priority.request import REQUEST_KINDS, SLO, RequestMeta, relative_ttft_s

KEY_PREFIX = "tiergate_"
"""Every key of ours in ``vllm_xargs`` starts with it (and nothing else of ours does)."""

WEIGHT = "tiergate_weight"
"""Number > 0, finite. The tier's weight after tenant overrides; larger is served first.
Written by the gateway (``EffectivePolicy.weight``); read into ``Request.weight`` (every policy's
gain). Absent or ignored: ``defaults.weight * 2 ** -priority`` (:func:`weight_from_priority`)."""
TTFT_MS = "tiergate_ttft_ms"
"""Number > 0 (ms), finite. Time-to-first-token objective. Written by the gateway (tier default
or the ``x-slo-ttft-ms`` header); read into ``Request.slo.ttft_s``. Absent or ignored while
``tiergate_tpot_ms`` is given, or while no deadline is: :meth:`BestEffortDefaults.ttft_for`."""
TPOT_MS = "tiergate_tpot_ms"
"""Number > 0 (ms), finite. Time-per-output-token objective. Written by the gateway; read into
``Request.slo.tpot_s``. Absent or ignored (with a streaming SLO): ``defaults.tpot_s``."""
DEADLINE_MS = "tiergate_deadline_ms"
"""Number > 0 (ms), finite. End-to-end deadline, counted from the arrival. Written by the gateway
(only when the tier or the request has one); read into ``Request.slo.deadline_s``. Alone (no
TTFT/TPOT) it makes a deadline-only request; absent or ignored: no deadline."""
ARRIVAL_UNIX_S = "tiergate_arrival_unix_s"
"""Number >= 0 (Unix seconds), finite. When the gateway received the request, so objectives count
from there, queueing at the gateway included. Written by the gateway; read into
``Request.arrival_s``. A time in the engine's future (clock skew) counts as the engine's now;
absent or ignored: the engine's own arrival time."""
TIER = "tiergate_tier"
"""Non-blank string (surrounding spaces dropped). The tier's name, for tier-aware policies.
Written by the gateway; read into ``Request.tier``. Absent or ignored: ``defaults.tier``."""
TENANT = "tiergate_tenant"
"""Non-blank string (surrounding spaces dropped). The tenant's name, for tenant-fair policies.
Written by the gateway; read into ``Request.tenant``. Absent or ignored: :data:`DEFAULT_TENANT`."""
KIND = "tiergate_kind"
"""One of :data:`~priority.request.REQUEST_KINDS` (``latency``, ``deadline``, ``compound``,
``best-effort``): what the request's value depends on, so a kind-aware policy (``gmax``,
``tempo``) picks its gain. Written by the gateway (:mod:`gateway.app.kinds`: a workflow header
makes ``compound``, ``x-slo-deadline-ms`` ``deadline``, else the tier's default kind); read into
``Request.kind``. Absent or ignored: ``compound`` with a ``tiergate_workflow_id``, ``deadline``
for a deadline-only SLO, else ``latency``. The SLO keys are written as before for every kind, so
kind-unaware policies schedule as they always did."""
WORKFLOW_ID = "tiergate_workflow_id"
"""Non-blank string (surrounding spaces dropped). The agent workflow a compound call belongs to
(the client's ``x-tiergate-workflow-id``). Written by the gateway for workflow calls only; read
into ``Request.workflow_id``. Absent or ignored: None (not a workflow call)."""
STAGE = "tiergate_stage"
"""Integer >= 0 (an integral number or its text). The call's stage in its workflow, 0 for the
call that created it, in arrival order. Written by the gateway with ``tiergate_workflow_id``;
read into ``Request.stage``. Absent or ignored: 0."""
SUB_DEADLINE_MS = "tiergate_sub_deadline_ms"
"""Number > 0 (ms), finite. This call's share of its workflow's deadline, from the gateway's
arrival: D_s. Written by the gateway for workflow calls (then ``tiergate_deadline_ms`` is the
time left to the workflow's own deadline, and this is never more); read into
``RequestMeta.slo.deadline_s`` (so ``Request.slo.deadline_s``), in place of
``tiergate_deadline_ms``, which is then read into ``RequestMeta.workflow_deadline_s``. Absent or
ignored: ``tiergate_deadline_ms`` is the deadline."""
LENGTH = "tiergate_length"
"""List of numbers ``[l1, v1, l2, v2, ...]``: the output-length distribution
(:meth:`~priority.lengths.distribution.LengthDistribution.to_wire`; levels strictly increasing
in (0, 1), values >= 1 and non-decreasing), which the engine refines as tokens are generated
without the gateway's predictor. Written by the gateway when a length model is loaded
(``TIERGATE_LENGTH_MODEL``); read into ``Request.length``. Absent or ignored: None (policies
fall back to ``max_tokens``)."""
XARG_KEYS = (
    WEIGHT,
    TTFT_MS,
    TPOT_MS,
    DEADLINE_MS,
    ARRIVAL_UNIX_S,
    TIER,
    TENANT,
    KIND,
    WORKFLOW_ID,
    STAGE,
    SUB_DEADLINE_MS,
    LENGTH,
)

PRIORITY = "priority"
"""vLLM's own body field (integer, lower first), named in :attr:`RequestMeta.ignored` when it is
not an integer (only possible offline: vLLM's API server checks it)."""
PRIORITY_CLIP = 10
"""A ``priority`` beyond ±10 counts as ±10: a weight ratio of ``2 ** 10`` is already strict
precedence under every policy's gain, and the weights stay well-conditioned in gain sums."""
DEFAULT_TENANT = "default"
MAX_LENGTH_LEVELS = 64
"""A :data:`LENGTH` of more quantile levels than this is ignored (a bound on the reader's work)."""


@dataclass(frozen=True, slots=True)
class BestEffortDefaults:
    """What a request gets for each objective it does not carry (``TIERGATE_DEFAULT_*``).

    The TTFT default is relative to the hardware: ``ttft_scale`` times the prompt's TTFT on an
    idle engine (from the latency profile), at least ``ttft_floor_s`` — a fixed number of seconds
    would be lax for a short prompt on an H100 and unmeetable for a long one on a small GPU.
    """

    tier: str = "default"
    weight: float = 1.0
    ttft_s: float | None = None
    """None: :meth:`ttft_for` scales the prompt's zero-load TTFT."""
    tpot_s: float = 0.1
    """100 ms: about 10 tokens a second, faster than people read."""
    ttft_scale: float = 5.0
    ttft_floor_s: float = 0.2

    def ttft_for(self, zero_load_ttft_s: float) -> float:
        """The default TTFT objective of a prompt that takes ``zero_load_ttft_s`` when alone."""
        if self.ttft_s is not None:
            return self.ttft_s
        return relative_ttft_s(zero_load_ttft_s, self.ttft_scale, self.ttft_floor_s)


def weight_from_priority(priority: int, default_weight: float = 1.0) -> float:
    """vLLM's ``priority`` (lower first) as a weight (larger first):
    ``default_weight * 2 ** -priority``, ``priority`` clipped to ±:data:`PRIORITY_CLIP`."""
    return default_weight * 2.0 ** -max(-PRIORITY_CLIP, min(PRIORITY_CLIP, priority))


def priority_from_weight(weight: float) -> int:
    """The ``priority`` the gateway sends for a weight: the inverse of :func:`weight_from_priority`
    for powers of two (weights 4 / 2 / 1 → -2 / -1 / 0), so stock vLLM under
    ``--scheduling-policy priority`` serves tiers in the same order."""
    _check(WEIGHT, weight, minimum=0.0)
    return max(-PRIORITY_CLIP, min(PRIORITY_CLIP, -round(math.log2(weight))))


def encode(meta: RequestMeta) -> dict[str, str | float | list[float]]:
    """The ``tiergate_*`` keys of one request: the one writer of the protocol, the inverse of
    :func:`parse` (``parse(encode(meta), ...)`` gives ``meta`` back, with the same defaults).

    ``ValueError`` for a value :func:`parse` would ignore (a gateway bug, surfaced where it
    happens). A best-effort meta (``has_slo`` False) is written without objectives, so the engine
    fills its own defaults in; ``ignored`` is the reader's and is not written. vLLM's
    ``priority`` goes beside it: :func:`priority_from_weight` of ``meta.weight``.
    """
    slo = meta.slo
    _check(WEIGHT, meta.weight, minimum=0.0)
    for key, label in ((TIER, meta.tier), (TENANT, meta.tenant)):
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"{key} must be a non-blank string, got {label!r}")
    if meta.kind not in REQUEST_KINDS:
        raise ValueError(f"{KIND} must be one of {', '.join(REQUEST_KINDS)}, got {meta.kind!r}")
    xargs: dict[str, str | float | list[float]] = {WEIGHT: meta.weight}
    if meta.has_slo and slo.ttft_s is not None and slo.tpot_s is not None:
        xargs[TTFT_MS] = _ms(TTFT_MS, slo.ttft_s)
        xargs[TPOT_MS] = _ms(TPOT_MS, slo.tpot_s)
    if meta.arrival_s is not None:
        _check(ARRIVAL_UNIX_S, meta.arrival_s, minimum=0.0, inclusive=True)
        xargs[ARRIVAL_UNIX_S] = meta.arrival_s
    xargs[TIER] = meta.tier
    xargs[TENANT] = meta.tenant
    xargs[KIND] = meta.kind
    # a workflow call given a share: the deadline key is its workflow's, the share its own
    deadline_s, share_s = slo.deadline_s, None
    if meta.workflow_deadline_s is not None:
        if deadline_s is None:
            raise ValueError(f"{SUB_DEADLINE_MS}: a workflow deadline needs the call's share")
        deadline_s, share_s = meta.workflow_deadline_s, deadline_s
    if meta.has_slo and deadline_s is not None:
        xargs[DEADLINE_MS] = _ms(DEADLINE_MS, deadline_s)
    if meta.workflow_id is not None:
        if not isinstance(meta.workflow_id, str) or not meta.workflow_id.strip():
            raise ValueError(f"{WORKFLOW_ID} must be a non-blank string, got {meta.workflow_id!r}")
        xargs[WORKFLOW_ID] = meta.workflow_id
        xargs[STAGE] = _checked_stage(meta.stage)
    elif meta.stage != 0:
        raise ValueError(f"{STAGE} needs {WORKFLOW_ID}, got stage {meta.stage!r} without one")
    if meta.has_slo and share_s is not None:
        xargs[SUB_DEADLINE_MS] = _ms(SUB_DEADLINE_MS, share_s)
    if meta.length is not None:
        xargs[LENGTH] = meta.length.to_wire()
    return xargs


def milliseconds(seconds: float) -> float:
    """``seconds`` as the milliseconds the wire (and the request log) carries: of the doubles
    next to ``seconds * 1e3`` that read back as exactly ``seconds``, the one with the shortest
    decimal — so a header's ``"7"`` travels as ``7.0``, not ``7.000000000000001``, every value
    of up to 15 significant digits travels as it was written, and the engine reads back exactly
    the gateway's seconds (which come from milliseconds; the few doubles of seconds that no
    double of milliseconds divides into come back within a unit in the last place)."""
    product = seconds * 1e3
    if product / 1e3 == seconds and len(repr(product)) <= _SHORT:
        return product  # the common case: a short decimal, the only one this near
    candidates = [product]
    for direction in (-math.inf, math.inf):
        near = product
        for _ in range(2):
            near = math.nextafter(near, direction)
            candidates.append(near)
    exact = [c for c in candidates if c / 1e3 == seconds] or [product]
    return min(exact, key=lambda c: len(repr(c)))


_SHORT = 16
"""A float's ``repr`` this long or shorter has at most 15 significant digits (it always holds a
``.`` or an ``e``), and no other double within a few units in the last place has as few."""


def _ms(key: str, seconds: float) -> float:
    _check(key, seconds, minimum=0.0)
    return milliseconds(seconds)


def _checked_stage(stage: int) -> int:
    if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
        raise ValueError(f"{STAGE} must be an integer >= 0, got {stage!r}")
    return stage


def without_protocol_keys(xargs: Mapping[str, object] | None) -> dict[str, object]:
    """A client's own ``vllm_xargs`` minus our keys: only the gateway may set those."""
    return {k: v for k, v in (xargs or {}).items() if not k.startswith(KEY_PREFIX)}


def parse(
    xargs: Mapping[str, object] | None,
    priority: object,
    *,
    defaults: BestEffortDefaults,
    zero_load_ttft_s: float,
    now_unix_s: float | None = None,
) -> RequestMeta:
    """The one reader of the protocol (see the module docstring for the rule).

    ``zero_load_ttft_s`` is the prompt's TTFT on an idle engine (:meth:`Profile.zero_load_ttft_s`)
    for the default TTFT; ``now_unix_s`` (None: no clamp) bounds the gateway's arrival time.
    Numbers may come as strings (``"250"``): vLLM passes ``vllm_xargs`` through untyped.
    """
    args: Mapping[str, object] = xargs if isinstance(xargs, Mapping) else {}
    ignored: list[str] = []

    def number(key: str, *, positive: bool, scale: float = 1.0) -> float | None:
        raw = args.get(key)
        if raw is None:
            return None
        value = _finite(raw)
        if value is not None:
            value /= scale
            if value > 0 or (not positive and value == 0):
                return value
        ignored.append(key)
        return None

    def label(key: str) -> str | None:
        raw = args.get(key)
        if raw is None:
            return None
        if isinstance(raw, str) and raw.strip():
            return raw.strip()
        ignored.append(key)
        return None

    weight = number(WEIGHT, positive=True)
    ttft = number(TTFT_MS, positive=True, scale=1e3)
    tpot = number(TPOT_MS, positive=True, scale=1e3)
    deadline = number(DEADLINE_MS, positive=True, scale=1e3)
    arrival = number(ARRIVAL_UNIX_S, positive=False)
    tier, tenant = label(TIER), label(TENANT)
    sub_deadline = number(SUB_DEADLINE_MS, positive=True, scale=1e3)
    workflow_deadline = None
    if sub_deadline is not None:  # a workflow call: its share is the deadline it schedules for
        workflow_deadline, deadline = deadline, sub_deadline
    kind, workflow_id = label(KIND), label(WORKFLOW_ID)
    if kind is not None and kind not in REQUEST_KINDS:
        ignored.append(KIND)
        kind = None
    stage = _stage(args.get(STAGE))
    if stage is None:
        ignored.append(STAGE)
    length = _length(args.get(LENGTH))
    if length is None:
        ignored.append(LENGTH)

    has_slo = ttft is not None or tpot is not None or deadline is not None
    if ttft is not None or tpot is not None or deadline is None:  # a streaming SLO: fill it in
        ttft = ttft if ttft is not None else defaults.ttft_for(zero_load_ttft_s)
        tpot = tpot if tpot is not None else defaults.tpot_s
    if weight is None:
        shift = 0
        if isinstance(priority, int) and not isinstance(priority, bool):
            shift = priority
        elif priority is not None:
            ignored.append(PRIORITY)
        weight = weight_from_priority(shift, defaults.weight)
    if arrival is not None and now_unix_s is not None:
        arrival = min(arrival, now_unix_s)
    if kind is None:
        kind = _default_kind(workflow_id, deadline, ttft is None and tpot is None)
    return RequestMeta(
        slo=SLO(ttft_s=ttft, tpot_s=tpot, deadline_s=deadline),
        weight=weight,
        tier=tier or defaults.tier,
        tenant=tenant or DEFAULT_TENANT,
        arrival_s=arrival,
        has_slo=has_slo,
        ignored=tuple(ignored),
        kind=kind,
        workflow_id=workflow_id,
        stage=stage or 0,
        workflow_deadline_s=workflow_deadline,
        length=length if isinstance(length, LengthDistribution) else None,
    )


def _default_kind(workflow_id: str | None, deadline: float | None, no_streaming: bool) -> str:
    """The kind of a request that names none (an older gateway, a replay): see :data:`KIND`."""
    if workflow_id is not None:
        return "compound"
    if deadline is not None and no_streaming:
        return "deadline"
    return "latency"


_ABSENT = object()


def _stage(raw: object) -> int | None:
    """:data:`STAGE` as an int; 0 when absent, None when malformed (then ignored)."""
    if raw is None:
        return 0
    value = _finite(raw)
    if value is None or value < 0 or value != int(value) or value >= 2**31:
        return None
    return int(value)


def _length(raw: object) -> LengthDistribution | object | None:
    """:data:`LENGTH` as a distribution; ``_ABSENT`` when absent, None when malformed."""
    if raw is None:
        return _ABSENT
    if not isinstance(raw, list | tuple) or len(raw) > 2 * MAX_LENGTH_LEVELS:
        return None
    numbers = [_finite(x) for x in raw]
    if any(x is None for x in numbers):
        return None
    try:
        return LengthDistribution.from_wire([x for x in numbers if x is not None])
    except ValueError:
        return None


def _finite(value: object) -> float | None:
    """``value`` as a finite float; None for bools, lists, text that is no number, inf, nan and
    integers too large for a float."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _check(key: str, value: float, *, minimum: float, inclusive: bool = False) -> None:
    number = None if isinstance(value, str) else _finite(value)
    if number is None or number < minimum or (number == minimum and not inclusive):
        bound = ">=" if inclusive else ">"
        raise ValueError(f"{key} must be a finite number {bound} {minimum:g}, got {value!r}")
