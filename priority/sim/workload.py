"""Workloads: a trace (or a Poisson process) plus priorities and SLOs, ready to simulate.

Defaults follow the papers the project reproduces:

* **Tiers** — PROSERVE: each request is high or low priority with p = 0.5, weights 2 and 1.
* **SLOs** — SLOs-Serve's loose setting: TTFT SLO = 5 x the prompt's zero-load TTFT on the
  reference profile, TPOT SLO = 100 ms. A floor of 200 ms (two TPOT periods) keeps short prompts
  from getting a TTFT SLO below what one in-flight step plus their own step takes on an idle
  engine, which no scheduler could meet.
* **Gain weights** — PROSERVE: ``w_p : w_d`` = the workload's mean prompt : output length.

Everything random is drawn from ``seed`` through independent child streams (arrivals, lengths,
tiers), so changing e.g. the tier mix does not move the arrival times. A :class:`Workload` is
immutable and hands out fresh :class:`Request` objects on every :meth:`Workload.requests` call, so
several policies run on the identical workload.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from priority.gain import DEFAULT_BEST_EFFORT_DEADLINE_S, GainWeights
from priority.lengths.distribution import LengthDistribution
from priority.profiles import Profile
from priority.request import SLO, Request, relative_ttft_s
from priority.sim.length_error import LengthError
from priority.sim.traces import FloatArray, IntArray, Trace, load_trace
from priority.sim.workflows import (
    DEFAULT_MAX_TOKENS,
    LENGTH_MODES,
    WorkflowCall,
    cold_start_offsets,
    length_for,
)


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    weight: float
    share: float
    """Probability that a request gets this tier."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tier needs a name")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"tier {self.name}: weight must be > 0, got {self.weight}")
        if not (self.share >= 0 and math.isfinite(self.share)):
            raise ValueError(f"tier {self.name}: share must be >= 0, got {self.share}")


@dataclass(frozen=True, slots=True)
class TierMix:
    tiers: tuple[Tier, ...] = (Tier("high", 2.0, 0.5), Tier("low", 1.0, 0.5))

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("a tier mix needs at least one tier")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tier names in {names}")
        total = sum(t.share for t in self.tiers)
        if not math.isclose(total, 1.0, rel_tol=1e-9, abs_tol=1e-9):
            raise ValueError(f"tier shares must sum to 1, got {total}")

    @classmethod
    def parse(cls, spec: str) -> TierMix:
        """``"high:2:0.5,low:1:0.5"`` — name:weight:share, comma separated."""
        tiers = []
        for part in spec.split(","):
            fields = part.strip().split(":")
            if len(fields) != 3:
                raise ValueError(f"tier spec {part!r} is not name:weight:share")
            name, weight, share = fields
            try:
                tiers.append(Tier(name.strip(), float(weight), float(share)))
            except ValueError as exc:
                raise ValueError(f"tier spec {part!r}: {exc}") from None
        return cls(tuple(tiers))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiers)

    def weight_of(self, name: str) -> float | None:
        return next((t.weight for t in self.tiers if t.name == name), None)


@dataclass(frozen=True, slots=True)
class SloPolicy:
    """Default SLO assignment: ``TTFT = max(ttft_scale * zero-load TTFT, ttft_floor_s)``."""

    ttft_scale: float = 5.0
    ttft_floor_s: float = 0.2
    tpot_s: float = 0.1
    deadline_s: float | None = None
    """Optional end-to-end deadline added to every request (None: streaming SLO only)."""

    def __post_init__(self) -> None:
        if not (self.ttft_scale > 0 and self.tpot_s > 0 and self.ttft_floor_s >= 0):
            raise ValueError("ttft_scale and tpot_s must be > 0, ttft_floor_s >= 0")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError("deadline_s must be > 0")

    def ttft_for(self, zero_load_ttft_s: float) -> float:
        return relative_ttft_s(zero_load_ttft_s, self.ttft_scale, self.ttft_floor_s)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """The immutable description a fresh :class:`Request` is built from."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    slo: SLO
    tier: str
    weight: float
    tenant: str
    kind: str = "latency"
    workflow_id: str | None = None
    stage: int = 0
    length: LengthDistribution | None = None
    max_tokens: int | None = None
    """The client's cap (None: the true length, the simulator's historic default)."""

    def to_request(self) -> Request:
        return Request(
            request_id=self.request_id,
            arrival_s=self.arrival_s,
            prompt_tokens=self.prompt_tokens,
            slo=self.slo,
            weight=self.weight,
            tier=self.tier,
            tenant=self.tenant,
            max_output_tokens=self.max_tokens or self.output_tokens,
            true_output_tokens=self.output_tokens,
            kind=self.kind,
            workflow_id=self.workflow_id,
            stage=self.stage,
            length=self.length,
        )


@dataclass(frozen=True, eq=False)
class Workload:
    name: str
    specs: tuple[RequestSpec, ...]
    gain_weights: GainWeights
    tiers: TierMix = field(default_factory=TierMix)
    workflow_calls: Mapping[str, WorkflowCall] = field(default_factory=dict)
    """Request id -> its place in a workflow, for every call of a multi-stage workflow (the
    simulator releases stage k > 0 when stage k - 1 finishes)."""

    def __post_init__(self) -> None:
        if not self.specs:
            raise ValueError(f"workload {self.name} has no requests")

    def __len__(self) -> int:
        return len(self.specs)

    def requests(self) -> list[Request]:
        """Fresh requests (no scheduling state), in arrival order."""
        return [spec.to_request() for spec in self.specs]

    @property
    def duration_s(self) -> float:
        return self.specs[-1].arrival_s - self.specs[0].arrival_s

    @property
    def rate_rps(self) -> float:
        """Mean arrival rate, ``(n - 1) / span`` (0 for a single instant)."""
        span = self.duration_s
        return (len(self.specs) - 1) / span if span > 0 else 0.0

    @property
    def tier_weights(self) -> dict[str, float]:
        """Weight of every tier present (the mix's, plus override tiers from the trace)."""
        out = {t.name: t.weight for t in self.tiers.tiers}
        for spec in self.specs:
            out.setdefault(spec.tier, spec.weight)
        return out


def build_workload(
    trace: str | Path | Trace,
    *,
    reference_profile: Profile,
    rate_scale: float | None = None,
    rps: float | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    tiers: TierMix | None = None,
    slo: SloPolicy | None = None,
    lengths: str | None = None,
    length_error: LengthError | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> Workload:
    """A workload from a trace.

    ``lengths`` (``oracle|predicted|max-tokens``, :mod:`priority.sim.workflows`) sets each
    request's length distribution and a realistic ``max_tokens`` cap; None keeps the historic
    behaviour (no distribution, cap = true length). ``length_error`` is ``predicted``'s error
    model (:mod:`priority.sim.length_error`; None: the measured one).

    ``rate_scale`` multiplies the trace's native rate (divides every arrival time); ``rps``
    rescales it to that mean rate, the native one being ``(n - 1) / span``. A lengths-only trace
    (``arxiv``) needs ``rps`` and gets Poisson arrivals; with ``duration_s`` its rows are drawn
    with replacement, else all rows are used in file order. ``duration_s`` keeps the arrivals
    strictly before it (after scaling).
    """
    tr = trace if isinstance(trace, Trace) else load_trace(trace)
    if rate_scale is not None and rps is not None:
        raise ValueError("give rate_scale or rps, not both")
    for label, value in (("rate_scale", rate_scale), ("rps", rps), ("duration_s", duration_s)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{label} must be a positive number, got {value}")
    if lengths is not None and lengths not in LENGTH_MODES:
        raise ValueError(f"unknown lengths mode {lengths!r}; known: {', '.join(LENGTH_MODES)}")
    streams = np.random.SeedSequence(seed).spawn(4)
    arrival_rng, length_rng, tier_rng = (np.random.default_rng(s) for s in streams[:3])

    rows: IntArray = np.arange(len(tr), dtype=np.int64)
    if tr.arrival_s is None:
        if rps is None or rate_scale is not None:
            raise ValueError(f"trace {tr.name} holds lengths only: give rps (Poisson arrivals)")
        if duration_s is not None:
            arrivals = _poisson_arrivals(arrival_rng, rps, duration_s=duration_s)
            rows = length_rng.integers(0, len(tr), size=arrivals.size)
        else:
            arrivals = _poisson_arrivals(arrival_rng, rps, count=len(tr))
    else:
        arrivals = tr.arrival_s.copy()
        if rate_scale is not None:
            arrivals /= rate_scale
        elif rps is not None:
            span = float(arrivals[-1] - arrivals[0])
            if span <= 0 or arrivals.size < 2:
                raise ValueError(f"trace {tr.name}: all arrivals at one instant, no native rate")
            arrivals *= ((arrivals.size - 1) / span) / rps
        if duration_s is not None:
            keep = int(np.searchsorted(arrivals, duration_s, side="left"))
            rows, arrivals = rows[:keep], arrivals[:keep]
    if rows.size == 0:
        raise ValueError(f"trace {tr.name}: no request arrives before duration_s={duration_s}")
    workload = _assemble(
        tr.name,
        tr,
        rows,
        arrivals,
        tier_rng,
        tiers or TierMix(),
        slo or SloPolicy(),
        reference_profile,
    )
    if lengths is not None:
        workload = with_lengths(
            workload, lengths, np.random.default_rng(streams[3]), length_error, max_tokens
        )
    return workload


def with_lengths(
    workload: Workload,
    mode: str,
    rng: np.random.Generator,
    error: LengthError | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> Workload:
    """``workload`` with every request's length distribution and cap set by ``mode``; compound
    sub-deadlines are recomputed from the (no longer oracle) expected lengths."""
    specs = []
    for spec in workload.specs:
        cap = max(max_tokens, spec.output_tokens)
        length = length_for(mode, spec.output_tokens, cap, rng, error)
        specs.append(replace(spec, length=length, max_tokens=cap))
    calls, specs = _plan_workflows(specs, prior=workload.workflow_calls)
    return Workload(
        name=workload.name,
        specs=tuple(specs),
        gain_weights=workload.gain_weights,
        tiers=workload.tiers,
        workflow_calls=calls,
    )


def poisson_workload(
    rps: float,
    *,
    reference_profile: Profile,
    duration_s: float | None = None,
    num_requests: int | None = None,
    prompt_tokens: int | Sequence[int] = 512,
    output_tokens: int | Sequence[int] = 128,
    seed: int = 0,
    tiers: TierMix | None = None,
    slo: SloPolicy | None = None,
    name: str = "poisson",
) -> Workload:
    """Synthetic Poisson arrivals at ``rps`` for ``duration_s`` or ``num_requests``.

    Lengths are fixed ints or sequences sampled with replacement; two sequences of equal length
    are sampled as pairs (keeping the prompt/output correlation of a dataset).
    """
    if (duration_s is None) == (num_requests is None):
        raise ValueError("give exactly one of duration_s and num_requests")
    if not (rps > 0 and math.isfinite(rps)):
        raise ValueError(f"rps must be a positive number, got {rps}")
    streams = np.random.SeedSequence(seed).spawn(3)
    arrival_rng, length_rng, tier_rng = (np.random.default_rng(s) for s in streams)
    arrivals = _poisson_arrivals(arrival_rng, rps, duration_s=duration_s, count=num_requests)
    n = arrivals.size
    if n == 0:
        raise ValueError(f"no arrival within duration_s={duration_s} at {rps} req/s")
    prompts, outputs = _sample_lengths(length_rng, n, prompt_tokens, output_tokens)
    trace = Trace(name=name, arrival_s=arrivals, prompt_tokens=prompts, output_tokens=outputs)
    return _assemble(
        name,
        trace,
        np.arange(n, dtype=np.int64),
        arrivals,
        tier_rng,
        tiers or TierMix(),
        slo or SloPolicy(),
        reference_profile,
    )


def _poisson_arrivals(
    rng: np.random.Generator,
    rps: float,
    *,
    duration_s: float | None = None,
    count: int | None = None,
) -> FloatArray:
    if count is not None:
        if count < 1:
            raise ValueError(f"num_requests must be >= 1, got {count}")
        return np.cumsum(rng.exponential(1.0 / rps, size=count))
    assert duration_s is not None
    # Draw in chunks until the process passes the horizon (expected count + 6 sigma first).
    expected = rps * duration_s
    times = np.cumsum(rng.exponential(1.0 / rps, size=int(expected + 6 * math.sqrt(expected)) + 8))
    while times[-1] < duration_s:
        more = np.cumsum(rng.exponential(1.0 / rps, size=times.size)) + times[-1]
        times = np.concatenate((times, more))
    return times[: int(np.searchsorted(times, duration_s, side="left"))]


def _sample_lengths(
    rng: np.random.Generator,
    n: int,
    prompt: int | Sequence[int],
    output: int | Sequence[int],
) -> tuple[IntArray, IntArray]:
    if not isinstance(prompt, int) and not isinstance(output, int) and len(prompt) == len(output):
        idx = rng.integers(0, len(prompt), size=n)
        return np.asarray(prompt, dtype=np.int64)[idx], np.asarray(output, dtype=np.int64)[idx]

    def draw(spec: int | Sequence[int]) -> IntArray:
        if isinstance(spec, int):
            return np.full(n, spec, dtype=np.int64)
        return np.asarray(spec, dtype=np.int64)[rng.integers(0, len(spec), size=n)]

    prompts, outputs = draw(prompt), draw(output)
    if prompts.min() < 1 or outputs.min() < 1:
        raise ValueError("token lengths must be >= 1")
    return prompts, outputs


def _assemble(
    name: str,
    trace: Trace,
    rows: IntArray,
    arrivals: FloatArray,
    tier_rng: np.random.Generator,
    tiers: TierMix,
    slo_policy: SloPolicy,
    profile: Profile,
) -> Workload:
    """Assign tiers and SLOs (defaults, then the trace's per-row overrides) and build specs."""
    n = rows.size
    shares = np.array([t.share for t in tiers.tiers])
    drawn = tier_rng.choice(len(tiers.tiers), size=n, p=shares / shares.sum())
    prompts = trace.prompt_tokens[rows]
    outputs = trace.output_tokens[rows]
    zero_load: dict[int, float] = {}
    specs = []
    think: dict[str, float] = {}
    for k in range(n):
        row = int(rows[k])
        line = row + 2  # the file line, for error messages
        default = tiers.tiers[int(drawn[k])]
        tier_name, weight = default.name, default.weight
        if trace.tier is not None and trace.tier[row] is not None:
            tier_name = str(trace.tier[row])
            mix_weight = tiers.weight_of(tier_name)
            if mix_weight is None and (trace.weight is None or math.isnan(trace.weight[row])):
                raise ValueError(
                    f"trace {trace.name} line {line}: tier {tier_name!r} is not in the tier mix "
                    f"({', '.join(tiers.names)}) and the row gives no weight"
                )
            weight = mix_weight if mix_weight is not None else weight
        if trace.weight is not None and not math.isnan(trace.weight[row]):
            weight = float(trace.weight[row])
        # Without a tenant column each tier acts as one tenant: PROSERVE evaluates Weighted VTC
        # with the priority classes as its clients.
        tenant = tier_name
        if trace.tenant is not None and trace.tenant[row] is not None:
            tenant = str(trace.tenant[row])

        prompt = int(prompts[k])
        if prompt not in zero_load:
            zero_load[prompt] = profile.zero_load_ttft_s(prompt)
        ttft: float | None = slo_policy.ttft_for(zero_load[prompt])
        tpot: float | None = slo_policy.tpot_s
        deadline = slo_policy.deadline_s
        if trace.ttft_slo_s is not None and not math.isnan(trace.ttft_slo_s[row]):
            ttft = float(trace.ttft_slo_s[row])
        if trace.tpot_slo_s is not None and not math.isnan(trace.tpot_slo_s[row]):
            tpot = float(trace.tpot_slo_s[row])
        if trace.deadline_s is not None and not math.isnan(trace.deadline_s[row]):
            deadline = float(trace.deadline_s[row])
        if ttft == math.inf or tpot == math.inf:
            ttft = tpot = None  # "none": a deadline-only request
        kind = "latency"
        if trace.kind is not None and trace.kind[row] is not None:
            kind = str(trace.kind[row])
        workflow = None
        if trace.workflow_id is not None and trace.workflow_id[row] is not None:
            workflow = f"{name}-{trace.workflow_id[row]}"
        if kind == "best-effort" and deadline is None:
            deadline = DEFAULT_BEST_EFFORT_DEADLINE_S
        if kind != "latency":  # judged end to end (priority.gain.kind_slo)
            if deadline is None:
                raise ValueError(f"trace {trace.name} line {line}: a {kind} row needs deadline_ms")
            ttft = tpot = None
        if kind == "compound" and workflow is None:
            raise ValueError(f"trace {trace.name} line {line}: a compound row needs workflow_id")
        try:
            slo = SLO(ttft_s=ttft, tpot_s=tpot, deadline_s=deadline)
        except ValueError as exc:
            raise ValueError(f"trace {trace.name} line {line}: {exc}") from None
        specs.append(
            RequestSpec(
                request_id=f"{name}-{k}",
                arrival_s=float(arrivals[k]),
                prompt_tokens=prompt,
                output_tokens=int(outputs[k]),
                slo=slo,
                tier=tier_name,
                weight=weight,
                tenant=tenant,
                kind=kind,
                workflow_id=workflow,
                stage=int(trace.stage[row]) if trace.stage is not None else 0,
            )
        )
        if trace.think_s is not None:
            think[specs[-1].request_id] = float(trace.think_s[row])
    gain_weights = GainWeights.from_lengths(float(prompts.mean()), float(outputs.mean()))
    calls, specs = _plan_workflows(specs, think=think)
    return Workload(
        name=name,
        specs=tuple(specs),
        gain_weights=gain_weights,
        tiers=tiers,
        workflow_calls=calls,
    )


def _expected_tokens(spec: RequestSpec) -> float:
    """Prompt plus expected output: the distribution's median when known, else the length."""
    length = spec.length
    output = length.quantile(0.5) if length is not None else float(spec.output_tokens)
    return spec.prompt_tokens + output


def _plan_workflows(
    specs: list[RequestSpec],
    *,
    think: Mapping[str, float] | None = None,
    prior: Mapping[str, WorkflowCall] | None = None,
) -> tuple[dict[str, WorkflowCall], list[RequestSpec]]:
    """Order each workflow's calls by stage, give compound calls their cold-start sub-deadline
    (:func:`~priority.sim.workflows.cold_start_offsets`) and record where each call sits.

    ``think`` (request id -> think time) comes from the trace; re-planning passes the ``prior``
    plan, whose think times and workflow deadlines it keeps. Stage 0's sub-deadline is final
    here; later stages' are set on arrival."""
    think = dict(think or {})
    if prior:
        think.update({rid: call.think_s for rid, call in prior.items()})
    groups: dict[str, list[int]] = {}
    for k, spec in enumerate(specs):
        if spec.workflow_id is not None:
            groups.setdefault(spec.workflow_id, []).append(k)
    calls: dict[str, WorkflowCall] = {}
    out = list(specs)
    for workflow, members in groups.items():
        members.sort(key=lambda k: specs[k].stage)
        stages = [specs[k].stage for k in members]
        if len(set(stages)) != len(stages):
            raise ValueError(f"workflow {workflow}: repeated stage numbers {stages}")
        first = specs[members[0]]
        thinks = [think.get(specs[k].request_id, 0.0) for k in members]
        known = prior.get(first.request_id) if prior else None
        deadline = known.deadline_s if known is not None else first.slo.deadline_s
        if deadline is None:
            deadline = math.inf
        expected = [_expected_tokens(specs[k]) for k in members]
        offsets = (
            cold_start_offsets(expected, thinks, deadline)
            if math.isfinite(deadline)
            else [math.inf] * len(members)
        )
        previous = None
        for k, gap, offset in zip(members, thinks, offsets, strict=True):
            spec = specs[k]
            call = WorkflowCall(workflow, spec.stage, previous, gap, offset, deadline)
            calls[spec.request_id] = call
            if spec.kind == "compound" and math.isfinite(offset):
                start = first.arrival_s
                out[k] = replace(
                    spec, slo=SLO(deadline_s=call.sub_deadline_s(start, spec.arrival_s))
                )
            previous = spec.request_id
    return calls, out
