"""Replays on a virtual clock, simulator side (imports nothing from vLLM).

A replay is a list of :class:`Arrival` (what a client sends vLLM: lengths, SLO metadata as
``vllm_xargs``, a ``priority``) run to completion, every step lasting the profile's prediction
(beta = 1, no noise) for the batch that ran. :mod:`engine_harness.replay` runs the same arrivals
through the real vLLM scheduler; both return a :class:`Replay`, so the two can be compared
request by request and step by step (``bench/sim_fidelity.py``, ``tests/engines/``).

The simulator side reads each request's metadata (SLO, weight, tier, tenant, kind, workflow,
length distribution) from the arrival's extra args with the plugin's own reader
(:func:`engine_common.protocol.parse`), so both sides plan with bit-identical inputs.

**Workflows.** An arrival that is a later stage of an agent workflow (``call.previous`` set) has
no fixed time: :class:`ArrivalQueue` holds it until its previous stage finishes *in that replay*
and releases it ``think_s`` later, with the ``tiergate_sub_deadline_ms`` and
``tiergate_deadline_ms`` the gateway would send at that moment (its share of the workflow
deadline, the time left to it). Both replays use the one queue, so they release identically
given identical finish times. :func:`request_goodput` scores a replay with the simulator's own
scorer (:func:`priority.sim.metrics.kind_metrics`) on the arrivals as that replay released them.

**Context length.** A replay runs with a ``max_model_len`` (None: no limit), and every arrival
first meets what vLLM's OpenAI server does with a token-id prompt (:func:`api_max_tokens`): a
prompt of ``max_model_len`` tokens or more, or a ``max_tokens`` above it, is refused with 400
before the engine sees it; otherwise ``max_tokens`` is cut to ``max_model_len - prompt``. Both
sides apply the one rule at release, so a refused request is counted (:attr:`Replay.refused`) and
produces nothing on either side, instead of waiting forever in a scheduler that cannot run it.
:func:`model_len_for` sets the length from the trace, capped by what the KV pool can hold (vLLM
does not start with a ``max_model_len`` its KV cache cannot hold once).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_common.protocol import (
    DEADLINE_MS,
    KIND,
    LENGTH,
    STAGE,
    SUB_DEADLINE_MS,
    TENANT,
    TIER,
    TPOT_MS,
    TTFT_MS,
    WEIGHT,
    WORKFLOW_ID,
    BestEffortDefaults,
    RequestMeta,
    parse,
    priority_from_weight,
)
from priority.gain import GainWeights, ideal_tdg, tdg
from priority.policies import make_policy
from priority.profiles import EngineConfig, Profile
from priority.request import SLO, Request, RequestStatus
from priority.sim.cluster import PdConfig
from priority.sim.engine import EngineCore
from priority.sim.metrics import kind_metrics
from priority.sim.rules import DEFAULT_ENGINE_RULES, EngineRules
from priority.sim.workflows import MIN_SUB_DEADLINE_S, WorkflowCall
from priority.sim.workload import Workload

BLOCK_SIZE = 16
TOKEN_BUDGET = 8192
MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class Arrival:
    """One request as a client sends it to vLLM (``ignore_eos``: it produces ``output_tokens``,
    by default ``max_tokens``)."""

    time: float
    """When it arrives; for a later workflow stage (``call.previous`` set) only the planned time:
    the replay releases it ``call.think_s`` after its previous stage finished."""
    request_id: str
    prompt_tokens: int
    max_tokens: int
    extra_args: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    """vLLM's ``priority`` (lower first), consistent with the weight: ``2 ** -priority``."""
    output_tokens: int | None = None
    """The true output length, below the cap the client sent (None: ``max_tokens``); the real
    replay's model ends the request there with a stop token."""
    call: WorkflowCall | None = None
    """Its place in an agent workflow (None: not a workflow call)."""

    @property
    def target_tokens(self) -> int:
        """How many output tokens it produces."""
        if self.output_tokens is None:
            return self.max_tokens
        return min(self.output_tokens, self.max_tokens)


@dataclass
class Replay:
    """What a replay produced, in the same shape on both sides."""

    token_times: dict[str, list[float]] = field(default_factory=dict)
    batches: list[dict[str, int]] = field(default_factory=list)
    """Per step: request id -> tokens computed, in the engine's batch order."""
    preempted: list[set[str]] = field(default_factory=list)
    """Per step: requests preempted in it."""
    decision_s: list[float] = field(default_factory=list)
    """Per step: wall-clock seconds of the scheduling decision (vLLM: ``schedule()``)."""
    arrivals: dict[str, Arrival] = field(default_factory=dict)
    """Every request as this replay released it (a workflow stage at its actual time, with its
    sub-deadline, its ``max_tokens`` as the API server passed it on); a request missing here
    never arrived."""
    refused: list[str] = field(default_factory=list)
    """Requests the API server refused (prompt beyond the model length), in release order."""

    @property
    def preemptions(self) -> int:
        return sum(len(p) for p in self.preempted)


def priority_of(weight: float) -> int:
    """vLLM's ``priority`` for a tier weight, as the gateway sends it."""
    return priority_from_weight(weight)


def arrivals_from_workload(workload: Workload) -> list[Arrival]:
    """The workload's requests as vLLM would receive them from the gateway: SLO, kind, workflow
    and length distribution in ``vllm_xargs`` (keys: :mod:`engine_common.protocol`).

    As in the simulator, a deadline or compound request carries no TTFT/TPOT (the gateway adds
    its tier's, which kind-aware policies ignore and the scorer does too). A compound call's
    ``tiergate_deadline_ms`` is the time left to its workflow's deadline and
    ``tiergate_sub_deadline_ms`` its share, both as planned here and set again when a replay
    releases it (:class:`ArrivalQueue`)."""
    arrivals = []
    calls = workload.workflow_calls
    for spec in workload.specs:
        xargs: dict[str, Any] = {
            WEIGHT: spec.weight,
            TIER: spec.tier,
            TENANT: spec.tenant,
            KIND: spec.kind,
        }
        if spec.slo.ttft_s is not None and spec.slo.tpot_s is not None:
            xargs[TTFT_MS] = spec.slo.ttft_s * 1e3
            xargs[TPOT_MS] = spec.slo.tpot_s * 1e3
        if spec.slo.deadline_s is not None:
            xargs[DEADLINE_MS] = spec.slo.deadline_s * 1e3
        call = calls.get(spec.request_id)
        if spec.workflow_id is not None:
            xargs[WORKFLOW_ID] = spec.workflow_id
            xargs[STAGE] = spec.stage
        if spec.length is not None:
            xargs[LENGTH] = spec.length.to_wire()
        arrival = Arrival(
            time=spec.arrival_s,
            request_id=spec.request_id,
            prompt_tokens=spec.prompt_tokens,
            max_tokens=spec.max_tokens or spec.output_tokens,
            extra_args=xargs,
            priority=priority_of(spec.weight),
            output_tokens=spec.output_tokens,
            call=call,
        )
        arrivals.append(arrival)
    starts = {a.call.workflow_id: a.time for a in arrivals if a.call and a.call.previous is None}
    return [
        released(a, starts.get(a.call.workflow_id, a.time), a.time) if a.call is not None else a
        for a in arrivals
    ]


def released(arrival: Arrival, start_s: float, now: float) -> Arrival:
    """``arrival`` arriving at ``now`` in a workflow started at ``start_s``: a compound call
    gets the gateway's ``tiergate_deadline_ms`` (time left to the workflow deadline) and
    ``tiergate_sub_deadline_ms`` (the simulator's cold-start share,
    :meth:`~priority.sim.workflows.WorkflowCall.sub_deadline_s`; the gateway answers 409 once
    the workflow expired, the simulator still runs the call against a 1 ms deadline)."""
    call = arrival.call
    xargs = dict(arrival.extra_args)
    if call is not None and xargs.get(KIND) == "compound" and math.isfinite(call.offset_s):
        left = max(start_s + call.deadline_s - now, MIN_SUB_DEADLINE_S)
        xargs[DEADLINE_MS] = left * 1e3
        xargs[SUB_DEADLINE_MS] = call.sub_deadline_s(start_s, now) * 1e3
    return dataclasses.replace(arrival, time=now, extra_args=xargs)


class ArrivalQueue:
    """One replay's arrivals in time order; a later workflow stage is held until its previous
    stage finishes (:meth:`finished`) and arrives ``think_s`` after that (the simulator's rule,
    ``priority.sim.cluster``). Simultaneous arrivals keep their order."""

    def __init__(self, arrivals: Iterable[Arrival]) -> None:
        self._heap: list[tuple[float, int, Arrival]] = []
        self._held: dict[str, Arrival] = {}
        """Previous stage's request id -> the stage waiting for it."""
        self._start: dict[str, float] = {}
        """Workflow id -> its first call's arrival."""
        self._seq = 0
        self.released: dict[str, Arrival] = {}
        """Every arrival handed out, as released."""
        for a in sorted(arrivals, key=lambda a: a.time):
            if a.call is not None and a.call.previous is not None:
                self._held[a.call.previous] = a
            else:
                self._push(a.time, a)

    def _push(self, t: float, arrival: Arrival) -> None:
        heapq.heappush(self._heap, (t, self._seq, arrival))
        self._seq += 1

    def next_time(self) -> float | None:
        """When the next arrival is due (None: none is scheduled; some may still be held)."""
        return self._heap[0][0] if self._heap else None

    @property
    def held(self) -> int:
        """Stages still waiting for their previous stage to finish."""
        return len(self._held)

    def pop_due(self, now: float) -> list[Arrival]:
        """The arrivals due by ``now``, in order, as they are sent."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            t, _, arrival = heapq.heappop(self._heap)
            if arrival.call is not None:
                start = self._start.setdefault(arrival.call.workflow_id, t)
                arrival = released(arrival, start, t)
            self.released[arrival.request_id] = arrival
            out.append(arrival)
        return out

    def finished(self, request_id: str, t: float) -> None:
        """``request_id`` finished at ``t``: its workflow's next stage arrives ``think_s`` on."""
        nxt = self._held.pop(request_id, None)
        if nxt is not None:
            assert nxt.call is not None
            self._push(t + nxt.call.think_s, nxt)


def api_max_tokens(prompt_tokens: int, max_tokens: int, max_model_len: int | None) -> int | None:
    """The ``max_tokens`` vLLM 0.33's OpenAI server passes to its engine for a token-id prompt,
    or None where it answers 400 instead: ``max_tokens`` above ``max_model_len``
    (``TokenizeParams``), a prompt longer than it (``_token_len_check``) or exactly as long (no
    room for one output token: the engine's ``_validate_prompt_len``). Otherwise ``max_tokens``
    is cut to the room left (``get_max_tokens``): the request is served, shorter.
    ``max_model_len`` None: no limit."""
    if max_model_len is None:
        return max_tokens
    if max_tokens > max_model_len or prompt_tokens >= max_model_len:
        return None
    return min(max_tokens, max_model_len - prompt_tokens)


def admitted(arrival: Arrival, max_model_len: int | None) -> Arrival | None:
    """``arrival`` as the API server passes it on (``max_tokens`` cut to the model length), or
    None where it refuses it (:func:`api_max_tokens`)."""
    cap = api_max_tokens(arrival.prompt_tokens, arrival.max_tokens, max_model_len)
    if cap is None:
        return None
    if cap == arrival.max_tokens:
        return arrival
    return dataclasses.replace(arrival, max_tokens=cap)


def model_len_for(
    arrivals: Iterable[Arrival], num_blocks: int, block_size: int = BLOCK_SIZE
) -> int:
    """A ``max_model_len`` set from the trace: its longest request (prompt + ``max_tokens``),
    capped at what one sequence can hold of a pool of ``num_blocks`` (vLLM keeps one as its null
    block), the most vLLM starts with on that pool."""
    longest = max((a.prompt_tokens + a.max_tokens for a in arrivals), default=1)
    return max(1, min(longest, (num_blocks - 1) * block_size))


class Release:
    """One replay's admission of due arrivals, the same on both sides: the API server's rule
    (:func:`admitted`), a refused request recorded in the replay and finished at once for its
    workflow (the client has its answer: the next stage follows ``think_s`` later)."""

    def __init__(self, queue: ArrivalQueue, replay: Replay, max_model_len: int | None) -> None:
        self.queue, self.replay, self.max_model_len = queue, replay, max_model_len

    def due(self, now: float) -> list[Arrival]:
        """The arrivals due by ``now`` that reach the engine, as the API server passes them on."""
        out = []
        for arrival in self.queue.pop_due(now):
            sent = admitted(arrival, self.max_model_len)
            if sent is None:
                self.replay.refused.append(arrival.request_id)
                self.replay.token_times[arrival.request_id] = []
                self.queue.finished(arrival.request_id, now)
                continue
            self.queue.released[arrival.request_id] = sent
            out.append(sent)
        return out


REPLAY_DEFAULTS = BestEffortDefaults()
"""The plugin's defaults in a replay (``TIERGATE_DEFAULT_*`` unset)."""


def meta_of(arrival: Arrival, profile: Profile | None = None) -> RequestMeta:
    """What the plugin parses from the arrival's ``priority`` and extra args (the default TTFT of
    a request without an objective needs the ``profile``; replays always send one)."""
    zero_load = profile.zero_load_ttft_s(max(1, arrival.prompt_tokens)) if profile else 0.0
    return parse(
        arrival.extra_args, arrival.priority, defaults=REPLAY_DEFAULTS, zero_load_ttft_s=zero_load
    )


def slo_of(arrival: Arrival) -> SLO:
    """The SLO the plugin parses from the arrival's extra args."""
    return meta_of(arrival).slo


def request_of(arrival: Arrival, profile: Profile | None = None) -> Request:
    """The simulator's request for an arrival, with the metadata the plugin would read (its
    length distribution capped by ``max_tokens``, as the plugin does)."""
    return Request.from_meta(
        meta_of(arrival, profile),
        arrival.request_id,
        arrival_s=arrival.time,
        prompt_tokens=max(1, arrival.prompt_tokens),
        max_output_tokens=arrival.max_tokens,
        true_output_tokens=arrival.output_tokens,
    )


def engine_profile(
    profile: Profile,
    num_blocks: int,
    *,
    block_size: int = BLOCK_SIZE,
    token_budget: int = TOKEN_BUDGET,
    max_num_seqs: int = MAX_NUM_SEQS,
) -> Profile:
    """``profile`` on the engine a vLLM replay builds: ``num_blocks`` in vLLM's pool, one of
    which vLLM keeps as its null block, so the simulator gets ``num_blocks - 1``."""
    engine = EngineConfig(
        block_size=block_size,
        num_kv_blocks=num_blocks - 1,
        max_num_batched_tokens=token_budget,
        max_num_seqs=max_num_seqs,
    )
    return dataclasses.replace(profile, engine=engine)


def replay_simulator(
    arrivals: Iterable[Arrival],
    profile: Profile,
    policy: str,
    *,
    num_blocks: int,
    params: Mapping[str, Any] | None = None,
    block_size: int = BLOCK_SIZE,
    token_budget: int = TOKEN_BUDGET,
    max_num_seqs: int = MAX_NUM_SEQS,
    rules: EngineRules = DEFAULT_ENGINE_RULES,
    max_model_len: int | None = None,
) -> Replay:
    """Run ``arrivals`` through :class:`EngineCore` step by step (no fast-forward), each first
    through the API server's context-length rule at ``max_model_len`` (None: from the trace,
    :func:`model_len_for`, as the vLLM side sets it; module docstring)."""
    arrivals = list(arrivals)
    if max_model_len is None:
        max_model_len = model_len_for(arrivals, num_blocks, block_size)
    engine = engine_profile(
        profile,
        num_blocks,
        block_size=block_size,
        token_budget=token_budget,
        max_num_seqs=max_num_seqs,
    )
    core = EngineCore(
        engine,
        make_policy(policy, engine.estimator(), **dict(params or {})),
        fast_forward=False,
        rules=rules,
    )
    queue = ArrivalQueue(arrivals)
    requests: list[Request] = []
    replay = Replay()
    release = Release(queue, replay, max_model_len)
    now = queue.next_time() or 0.0
    while True:
        for arrival in release.due(now):
            request = request_of(arrival, profile)
            requests.append(request)
            if not core.add_request(request, now):
                raise ValueError(f"{request.request_id} can never fit {num_blocks} blocks")
        started = time.perf_counter()
        step = core.start_step(now) if core.has_work else None
        decided = time.perf_counter() - started
        if step is None:
            due = queue.next_time()
            if due is None:
                break
            now = due
            continue
        replay.decision_s.append(decided)
        replay.batches.append({r.request_id: tokens for r, tokens in step.plan.scheduled})
        replay.preempted.append({r.request_id for r in step.plan.preempted})
        outcome = core.finish_step(step)
        now = step.end_s
        for request in outcome.finished:
            queue.finished(request.request_id, now)
    if queue.held:
        raise AssertionError(f"{queue.held} workflow stage(s) never released")
    replay.token_times |= {r.request_id: list(r.token_times) for r in requests}
    replay.arrivals = queue.released
    return replay


# ---- comparing two replays ------------------------------------------------------------------


def tdg_ratio(replay: Replay, arrivals: Sequence[Arrival], weights: GainWeights) -> float:
    """PROSERVE's TDG ratio of the replayed requests (gain / gain if every token were on time)."""
    gain = ideal = 0.0
    for a in arrivals:
        sent = replay.arrivals.get(a.request_id, a)
        meta = meta_of(sent)
        times = replay.token_times.get(a.request_id, [])
        gain += tdg(sent.time, meta.slo, meta.weight, times, weights)
        ideal += ideal_tdg(meta.weight, a.target_tokens, weights)
    return gain / ideal if ideal > 0 else math.nan


def request_goodput(replay: Replay, arrivals: Sequence[Arrival]) -> dict[str, Any]:
    """The replay's request goodput by the simulator's scorer (``bench/goodput.py``'s numbers):
    ``request_goodput`` (requests on time by their kind's rule, a workflow's calls together),
    its ``request_goodput_share`` of the submitted, ``per_kind`` and ``jain_tenant``
    (:func:`priority.sim.metrics.kind_metrics`), on the arrivals as the replay released them. A
    request finished when it produced its ``target_tokens``."""
    requests = []
    calls: dict[str, WorkflowCall] = {}
    for a in arrivals:
        request = request_of(replay.arrivals.get(a.request_id, a))
        times = list(replay.token_times.get(a.request_id, []))
        request.token_times = times
        request.num_output_tokens = len(times)
        if times and len(times) >= a.target_tokens:
            request.status = RequestStatus.FINISHED
            request.finished_s = times[-1]
        if a.call is not None:
            calls[a.request_id] = a.call
        requests.append(request)
    metrics = kind_metrics(requests, calls)
    good = sum(int(v["goodput_requests"]) for v in metrics["per_kind"].values())
    return {
        "request_goodput": good,
        "request_goodput_share": good / len(requests) if requests else math.nan,
        **metrics,
    }


def identical_share(
    real: Replay, sim: Replay, arrivals: Sequence[Arrival], *, atol: float = 1e-9
) -> float:
    """Share of requests whose every token time agrees within ``atol`` seconds."""
    same = 0
    for a in arrivals:
        x = real.token_times.get(a.request_id, [])
        y = sim.token_times.get(a.request_id, [])
        if len(x) == len(y) and np.allclose(x, y, rtol=0.0, atol=atol):
            same += 1
    return same / len(arrivals) if arrivals else math.nan


def ttft_abs_p99_s(real: Replay, sim: Replay, arrivals: Sequence[Arrival]) -> float:
    """p99 of |TTFT real - TTFT simulated| over requests with a first token on both sides."""
    gaps = [
        abs(real.token_times[a.request_id][0] - sim.token_times[a.request_id][0])
        for a in arrivals
        if real.token_times.get(a.request_id) and sim.token_times.get(a.request_id)
    ]
    return float(np.percentile(gaps, 99)) if gaps else math.nan


def first_divergence(real: Replay, sim: Replay) -> int | None:
    """Index of the first step whose batch differs between the two replays (None: none)."""
    for k, (x, y) in enumerate(zip(real.batches, sim.batches, strict=False)):
        if x != y:
            return k
    if len(real.batches) != len(sim.batches):
        return min(len(real.batches), len(sim.batches))
    return None


# ---- the fleet: a router in front of several instances ------------------------------------------


@dataclass
class FleetReplay:
    """What a fleet replay produced, the same shape on both sides: the requests' tokens (and
    refusals) as one :class:`Replay`, and the instance each request was routed to."""

    replay: Replay
    placement: dict[str, int] = field(default_factory=dict)
    """Request id -> the instance the router chose (PD: the prefill instance)."""
    decode_placement: dict[str, int] = field(default_factory=dict)
    """PD-disaggregated: request id -> the decode instance of the router's last decision (the
    one it was handed off to; a request that ended on its first token: the one chosen at
    dispatch). Empty co-located."""
    steps: list[int] = field(default_factory=list)
    """Per instance: the steps it ran."""
    preemptions: list[int] = field(default_factory=list)
    """Per instance: the requests it preempted."""


def fleet_profiles(
    profiles: Sequence[Profile], num_blocks: int, *, token_budget: int = TOKEN_BUDGET
) -> list[Profile]:
    """Each instance's profile on the engine a vLLM replay builds (:func:`engine_profile`)."""
    return [engine_profile(p, num_blocks, token_budget=token_budget) for p in profiles]


def fleet_admitted(
    arrivals: Sequence[Arrival], max_model_len: int
) -> tuple[list[Arrival], list[str]]:
    """The arrivals the API server passes on (cut to the model length) and those it refuses, in
    arrival order. A fleet replay has no workflows: every arrival's time is fixed."""
    if any(a.call is not None for a in arrivals):
        raise ValueError("a fleet replay takes no workflow calls (their times depend on the run)")
    sent, refused = [], []
    for a in sorted(arrivals, key=lambda a: a.time):
        out = admitted(a, max_model_len)
        if out is None:
            refused.append(a.request_id)
        else:
            sent.append(out)
    return sent, refused


def fleet_router_params(router: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``params`` for ``router``, seeded (0) where the router draws at random and no seed is
    given, as the simulator's comparisons seed it: both sides of a fleet replay then draw the
    same numbers."""
    from priority.routing import router_plugin

    out = dict(params or {})
    if router_plugin(router).accepts("seed"):
        out.setdefault("seed", 0)
    return out


@dataclass
class _Requests:
    """The simulator's workload protocol (``requests()``) over a fixed list."""

    items: list[Request]

    def requests(self) -> list[Request]:
        return self.items


def replay_fleet_simulator(
    arrivals: Sequence[Arrival],
    profiles: Sequence[Profile],
    policy: str,
    router: str,
    *,
    num_blocks: int,
    params: Mapping[str, Any] | None = None,
    router_params: Mapping[str, Any] | None = None,
    max_model_len: int | None = None,
    pd: PdConfig | None = None,
) -> FleetReplay:
    """``arrivals`` through the cluster simulator (:func:`priority.sim.cluster.simulate`, step by
    step, no noise, co-located or, with ``pd``, PD-disaggregated): one instance per profile, each
    on a ``num_blocks`` pool, the router in front; each arrival first through the API server's
    rule at ``max_model_len`` (None: from the trace and the pool)."""
    from priority.sim.cluster import ClusterConfig, simulate

    if max_model_len is None:
        max_model_len = model_len_for(arrivals, num_blocks)
    sent, refused = fleet_admitted(arrivals, max_model_len)
    engines = fleet_profiles(profiles, num_blocks)
    requests = [request_of(a, engines[0]) for a in sent]
    config = ClusterConfig(
        engines,
        policy,
        router,
        policy_params=dict(params or {}),
        router_params=fleet_router_params(router, router_params),
        fast_forward=False,
        pd=pd,
    )
    result = simulate(_Requests(requests), config)
    if result.rejected or result.stalled:
        raise AssertionError(f"rejected {len(result.rejected)}, stalled {result.stalled}")
    replay = Replay(refused=refused)
    replay.token_times = {a.request_id: [] for a in arrivals}
    replay.token_times |= {r.request_id: list(r.token_times) for r in result.requests}
    replay.arrivals = {a.request_id: a for a in arrivals} | {a.request_id: a for a in sent}
    placement = {rid: d.instance for rid, d in result.placement.items()}
    decode = {
        rid: d.decode_instance
        for rid, d in result.placement.items()
        if d.decode_instance is not None
    }
    stats = result.instances
    return FleetReplay(
        replay, placement, decode, [s.steps for s in stats], [s.preemptions for s in stats]
    )


def placement_share(real: FleetReplay, sim: FleetReplay) -> float:
    """Share of routed requests placed on the same instance on both sides (PD: the same
    prefill and the same decode instance)."""
    ids = set(real.placement) | set(sim.placement)
    same = sum(
        real.placement.get(r) == sim.placement.get(r)
        and real.decode_placement.get(r) == sim.decode_placement.get(r)
        for r in ids
    )
    return same / len(ids) if ids else math.nan
