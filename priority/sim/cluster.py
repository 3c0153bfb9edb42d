"""Discrete-event simulation of a cluster: a router in front of engine instances.

Events are kept in a heap keyed by ``(time, kind, seq)``; trace arrivals are merged in from the
time-sorted request list and come first at equal times (then KV landings, then step ends), so a
request arriving exactly when a step ends is seen by the next step — the rule the engine's
fast-forward assumes. Each instance is an :class:`~priority.sim.engine.EngineCore` with its own
policy (built per instance around that instance's estimator) and its own noise stream.

**PD-disaggregation.** The first ``num_prefill`` instances are prefill instances, the rest decode
instances. A prefill instance runs the prompt and emits the first token; the request then leaves
it (its KV there is freed at once) and lands on the decode instance the router chose
(``RouteDecision.decode_instance``, which the router may re-pick at that first token:
``Router.decode_at_handoff``) after the KV transfer time, where it joins the waiting queue with
its prompt computed, and the policy admits it as it admits any waiting request (one token to
compute, the whole sequence's blocks: vLLM's decode side, where the KV connector's tokens count
as computed when the scheduler admits the request). The transfer is modelled as a delay only
(no link contention): ``fixed_s + prompt_tokens * per_token_s``, with ``per_token_s`` either
given directly or derived from the model shape and the link bandwidth
(:meth:`KvTransferModel.from_model_shape`).

**Profile error.** ``true_time_scale`` runs each instance at a true speed other than its
profile's (1.3: every step takes 1.3x what the profile predicts), while its policy and the
router start from the profile. Each engine's estimator learns its momentum correction from its
real steps; the router receives a copy of each engine's current estimator every
``estimator_scrape_s`` seconds of simulated time (the gateway scraping the engines' exported
estimator; None: never, the router keeps the profile). A copy taken at a step end holds what the
engine had learnt at the last scrape tick, since an engine's estimator changes only when a step
ends (a fast-forwarded run of decode steps counts as ending at its last step).
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from priority.estimator import BatchLatencyEstimator, LatencyCoefficients
from priority.patterns import PatternHistory
from priority.policies import SchedulingPolicy, make_policy
from priority.profiles import Profile
from priority.request import SLO, Request
from priority.routing.base import InstanceRole, InstanceView, RouteDecision, Router
from priority.sim.engine import EngineCore, StepInFlight
from priority.sim.history import SimWorkflowHistory
from priority.sim.rules import DEFAULT_ENGINE_RULES, EngineRules
from priority.sim.workflows import WorkflowCall

PolicyFactory = Callable[[BatchLatencyEstimator], SchedulingPolicy]
RouterFactory = Callable[..., Router]
"""Called as ``factory(instances, **router_params)``; a :class:`Router` subclass is one."""

_ARRIVE, _LANDING, _STEP_END, _WAKE = -1, 0, 1, 2
"""Event kinds; at equal times released workflow calls (``_ARRIVE``) come first, landings and
step ends before wake-ups, so an idle instance starts its step only after every arrival and
event of that instant reached it."""


class WorkloadLike(Protocol):
    def requests(self) -> list[Request]: ...


@dataclass(frozen=True, slots=True)
class KvTransferModel:
    """Time to move a request's prompt KV from a prefill to a decode instance."""

    per_token_s: float = 0.0
    fixed_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.per_token_s >= 0 and self.fixed_s >= 0):
            raise ValueError("transfer costs must be >= 0")

    @classmethod
    def from_model_shape(
        cls,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        bandwidth_bytes_per_s: float,
        dtype_bytes: int = 2,
        fixed_s: float = 0.0,
    ) -> KvTransferModel:
        """K and V of every layer: ``2 * layers * kv_heads * head_dim * dtype_bytes`` per token."""
        if bandwidth_bytes_per_s <= 0:
            raise ValueError("bandwidth must be > 0")
        bytes_per_token = 2 * num_layers * num_kv_heads * head_dim * dtype_bytes
        return cls(per_token_s=bytes_per_token / bandwidth_bytes_per_s, fixed_s=fixed_s)

    def transfer_s(self, tokens: int) -> float:
        return self.fixed_s + tokens * self.per_token_s


@dataclass(frozen=True, slots=True)
class PdConfig:
    """PD-disaggregation: the first ``num_prefill`` instances prefill, the others decode."""

    num_prefill: int
    transfer: KvTransferModel = KvTransferModel()


@dataclass(frozen=True)
class ClusterConfig:
    profiles: Sequence[Profile]
    """One profile per instance (heterogeneous fleets: different profiles)."""
    policy: str | PolicyFactory
    """A registered policy name (``priority.policies.make_policy``) or a factory."""
    router: str | RouterFactory
    """A registered router name (``priority.routing.make_router``) or a factory."""
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    router_params: Mapping[str, Any] = field(default_factory=dict)
    noise_sigma: float = 0.0
    """Lognormal sigma of the true step time around the profile's prediction (0 = exact)."""
    seed: int = 0
    """Seeds every instance's noise stream (the workload has its own seed)."""
    pd: PdConfig | None = None
    fast_forward: bool = True
    rules: EngineRules = DEFAULT_ENGINE_RULES
    """The engine software's own admission and queue rules (``priority.sim.rules``)."""
    workflow_history: bool = False
    """Compound calls' sub-deadlines from the run's finished workflows (``priority.sim.history``)
    instead of the cold start alone."""
    true_time_scale: Sequence[float] | None = None
    """Per instance: its true step time over its profile's prediction (None: the profiles are
    exact). See the module docstring."""
    estimator_scrape_s: float | None = None
    """How often the router receives each engine's corrected estimator (None: never)."""

    def __post_init__(self) -> None:
        if not self.profiles:
            raise ValueError("a cluster needs at least one instance profile")
        scale = self.true_time_scale
        if scale is not None and (
            len(scale) != len(self.profiles) or not all(x > 0 and math.isfinite(x) for x in scale)
        ):
            raise ValueError("true_time_scale needs one positive finite factor per instance")
        if self.estimator_scrape_s is not None and not self.estimator_scrape_s > 0:
            raise ValueError("estimator_scrape_s must be > 0 (None: the router never learns)")
        if self.pd is not None and not 0 < self.pd.num_prefill < len(self.profiles):
            raise ValueError(
                f"PD mode needs 1..{len(self.profiles) - 1} prefill instances, "
                f"got {self.pd.num_prefill}"
            )

    def role(self, index: int) -> InstanceRole:
        if self.pd is None:
            return InstanceRole.COLOCATED
        return InstanceRole.PREFILL if index < self.pd.num_prefill else InstanceRole.DECODE

    @property
    def policy_name(self) -> str:
        return self.policy if isinstance(self.policy, str) else _callable_name(self.policy)

    @property
    def router_name(self) -> str:
        return self.router if isinstance(self.router, str) else _callable_name(self.router)


@dataclass(frozen=True, slots=True)
class InstanceStats:
    name: str
    role: str
    profile: str
    steps: int
    policy_calls: int
    busy_s: float
    preemptions: int
    prefill_tokens: int
    decode_tokens: int
    rejected: int
    transfers_in: int


@dataclass
class SimResult:
    requests: list[Request]
    """Every submitted request, in arrival order, with its token times."""
    rejected: list[Request]
    """Requests an instance refused because they could never fit its KV cache."""
    instances: list[InstanceStats]
    placement: dict[str, RouteDecision]
    horizon_s: float
    """Simulated time of the last event."""
    wall_s: float
    """Wall-clock run time of the simulation."""
    policy: str
    router: str
    stalled: list[str] = field(default_factory=list)
    """Instances left holding work with no event to wake them (a policy that stopped
    scheduling); their requests are in :attr:`unfinished`."""

    @property
    def finished(self) -> list[Request]:
        return [r for r in self.requests if r.is_finished]

    @property
    def unfinished(self) -> list[Request]:
        return [r for r in self.requests if not r.is_finished]


def simulate(
    workload: WorkloadLike,
    config: ClusterConfig,
    *,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Run ``workload`` (fresh requests) on the cluster; ``progress`` gets the done fraction."""
    started = time.perf_counter()
    calls = getattr(workload, "workflow_calls", None) or {}
    return _Simulation(workload.requests(), config, progress, calls).run(started)


class _Simulation:
    def __init__(
        self,
        requests: list[Request],
        config: ClusterConfig,
        progress: Callable[[float], None] | None,
        calls: Mapping[str, WorkflowCall] | None = None,
    ) -> None:
        self.requests = requests
        self.calls = calls or {}
        by_id = {r.request_id: r for r in requests} if self.calls else {}
        self.successor: dict[str, Request] = {}
        """A workflow call's next stage, released ``think_s`` after it finishes."""
        self.workflow_start: dict[str, float] = {}
        for rid, call in self.calls.items():
            if call.previous is not None and rid in by_id and call.previous in by_id:
                self.successor[call.previous] = by_id[rid]
        self.history: SimWorkflowHistory | None = None
        if config.workflow_history and self.calls:
            self.history = SimWorkflowHistory(self.calls, PatternHistory(clock=lambda: self.now))
        deferred = {id(r) for r in self.successor.values()}
        self.stream = [r for r in requests if id(r) not in deferred]
        self.config = config
        self.progress = progress
        seeds = np.random.SeedSequence(config.seed).spawn(len(config.profiles))
        self.engines: list[EngineCore] = []
        views: list[InstanceView] = []
        scales = config.true_time_scale or [1.0] * len(config.profiles)
        for i, (profile, seed) in enumerate(zip(config.profiles, seeds, strict=True)):
            role = config.role(i)
            name = f"{role.value}-{i}"
            self.engines.append(
                EngineCore(
                    true_profile(profile, scales[i]),
                    _make_policy(config, profile.estimator()),
                    noise_sigma=config.noise_sigma,
                    rng=np.random.default_rng(seed),
                    name=name,
                    role=role,
                    fast_forward=config.fast_forward,
                    rules=config.rules,
                )
            )
            views.append(InstanceView(i, name, profile, profile.estimator(), role))
        self.router = _make_router(config, views)
        for i, engine in enumerate(self.engines):  # the gateway's first scrape
            self.router.on_kv_report(i, engine.num_free_blocks)
        self.scrape_s = config.estimator_scrape_s
        self.scraped_tick = [0] * len(self.engines)
        """Per instance: the last scrape tick (a multiple of ``scrape_s``) the router has."""
        self.transfer = config.pd.transfer if config.pd is not None else None
        self.heap: list[tuple[float, int, int, int, Any]] = []
        self.seq = 0
        self.waking: set[int] = set()
        self.placement: dict[str, RouteDecision] = {}
        self.rejected: list[Request] = []
        self.done = 0
        self.now = 0.0

    # ---- main loop ------------------------------------------------------------------------

    def run(self, started: float) -> SimResult:
        requests, heap = self.stream, self.heap
        total = len(self.requests)
        n = len(requests)
        next_report = 0.01
        i = 0
        while i < n or heap:
            if i < n and (not heap or requests[i].arrival_s <= heap[0][0]):
                self._arrive(requests[i])
                i += 1
            else:
                t, kind, _, index, payload = heapq.heappop(heap)
                self.now = t
                if kind == _ARRIVE:
                    self._arrive(payload)
                elif kind == _STEP_END:
                    self._step_end(index, payload, t)
                elif kind == _WAKE:
                    self.waking.discard(index)
                    if self.engines[index].in_flight is None:
                        self._start(index, t)
                else:
                    self._land(index, payload, t)
            if self.progress is not None and total and self.done >= next_report * total:
                self.progress(self.done / total)
                next_report = math.floor(self.done / total * 100 + 1) / 100
        if self.progress is not None:
            self.progress(1.0)
        return SimResult(
            requests=self.requests,
            rejected=self.rejected,
            instances=[_stats(e) for e in self.engines],
            placement=self.placement,
            horizon_s=self.now,
            wall_s=time.perf_counter() - started,
            policy=self.config.policy_name,
            router=self.config.router_name,
            stalled=[e.name for e in self.engines if e.has_work],
        )

    # ---- events ---------------------------------------------------------------------------

    def _arrive(self, request: Request) -> None:
        now = self.now = request.arrival_s
        if self.calls:
            self._start_call(request, now)
        router = self.router
        for index, engine in enumerate(self.engines):
            step = engine.in_flight
            if step is not None and step.num_steps > 1:
                router.on_kv_report(index, engine.free_blocks_at(now))
        decision = router.route(request, now)
        self._check_decision(decision)
        router.on_dispatch(request, decision, now)
        self.placement[request.request_id] = decision
        if self.engines[decision.instance].add_request(request, now):
            self._poke(decision.instance, now)
        else:
            self._reject(request, decision, now, saw_first_token=False)

    def _step_end(self, index: int, step: StepInFlight, t: float) -> None:
        engine = self.engines[index]
        if engine.in_flight is not step or step.end_s != t:
            return  # superseded by an interrupt
        if self.scrape_s is not None:
            self._scrape(index, t)
        outcome = engine.finish_step(step)
        router, placement = self.router, self.placement
        for request in outcome.handoffs:  # the decode instance, bound now (Router docstring)
            rid = request.request_id
            placement[rid] = router.decode_at_handoff(request, placement[rid], t)
            self._check_decision(placement[rid])
        for request in outcome.first_tokens:
            router.on_first_token(request, placement[request.request_id], t)
        for request in outcome.finished:
            router.on_finish(request, placement[request.request_id], t, saw_first_token=True)
            if self.history is not None:
                self.history.finished(request, t)
            if self.successor:
                self._release_next(request, t)
        self.done += len(outcome.finished)
        if outcome.handoffs:
            assert self.transfer is not None
            for request in outcome.handoffs:
                target = placement[request.request_id].decode_instance
                assert target is not None
                land_s = t + self.transfer.transfer_s(request.num_computed_tokens)
                self._push(land_s, _LANDING, target, request)
        router.on_kv_report(index, engine.num_free_blocks)
        if engine.has_work:
            self._start(index, t)

    def _land(self, index: int, request: Request, t: float) -> None:
        if self.engines[index].add_transferred(request, t):
            self._poke(index, t)
        else:
            self._reject(request, self.placement[request.request_id], t, saw_first_token=True)

    # ---- helpers --------------------------------------------------------------------------

    def _start_call(self, request: Request, now: float) -> None:
        """A workflow call arrives: stage 0 starts the workflow's clock; a compound call gets
        its sub-deadline relative to its own arrival (cold-start shares, see workflows.py, or
        the run's history of finished workflows, see history.py)."""
        call = self.calls.get(request.request_id)
        if call is None:
            return
        start = self.workflow_start.setdefault(call.workflow_id, now)
        if request.kind == "compound" and math.isfinite(call.offset_s):
            offset = self.history.offset_s(request) if self.history is not None else None
            request.slo = SLO(deadline_s=call.sub_deadline_s(start, now, offset))

    def _release_next(self, request: Request, t: float) -> None:
        """Stage k finished at ``t``: stage k + 1 arrives ``think_s`` later."""
        nxt = self.successor.pop(request.request_id, None)
        if nxt is None:
            return
        nxt.arrival_s = t + self.calls[nxt.request_id].think_s
        self._push(nxt.arrival_s, _ARRIVE, -1, nxt)

    def _scrape(self, index: int, t: float) -> None:
        """Before the step ending at ``t`` is observed: if a scrape tick passed since the last
        one the router has, it gets the engine's estimator as it stood at that tick (unchanged
        since the previous step end)."""
        assert self.scrape_s is not None
        tick = math.floor(t / self.scrape_s)
        if tick > self.scraped_tick[index]:
            self.scraped_tick[index] = tick
            view = self.router.instances[index]
            view.estimator = copy.deepcopy(self.engines[index].policy.estimator)

    def _poke(self, index: int, now: float) -> None:
        """New work for an instance: start it if idle, else cut a fast-forward short."""
        engine = self.engines[index]
        step = engine.in_flight
        if step is None:
            # start once everything else at this instant (e.g. simultaneous arrivals) is in
            if index not in self.waking:
                self.waking.add(index)
                self._push(now, _WAKE, index, None)
            return
        old_end = step.end_s
        new_end = engine.interrupt(now)
        if new_end is not None and new_end != old_end:
            self._push(new_end, _STEP_END, index, step)

    def _start(self, index: int, now: float) -> None:
        step = self.engines[index].start_step(now)
        if step is not None:
            self._push(step.end_s, _STEP_END, index, step)

    def _push(self, t: float, kind: int, index: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, index, payload))

    def _reject(
        self, request: Request, decision: RouteDecision, now: float, *, saw_first_token: bool
    ) -> None:
        self.rejected.append(request)
        self.router.on_finish(request, decision, now, saw_first_token=saw_first_token)
        self.done += 1

    def _check_decision(self, decision: RouteDecision) -> None:
        n = len(self.engines)
        if not 0 <= decision.instance < n:
            raise ValueError(f"router chose instance {decision.instance} of {n}")
        role = self.engines[decision.instance].role
        if self.config.pd is None:
            if decision.decode_instance is not None:
                raise ValueError("router chose a decode instance outside PD mode")
            return
        target = decision.decode_instance
        if role is not InstanceRole.PREFILL:
            raise ValueError(f"PD mode: router sent a prefill to {role.value} instance")
        if target is None or not 0 <= target < n:
            raise ValueError(f"PD mode: router gave no valid decode instance ({target})")
        if self.engines[target].role is not InstanceRole.DECODE:
            raise ValueError(f"PD mode: instance {target} is not a decode instance")


def true_profile(profile: Profile, time_scale: float) -> Profile:
    """``profile`` with every step ``time_scale`` times as long: an instance's true speed."""
    if time_scale == 1.0:
        return profile
    c = profile.coefficients
    scaled = LatencyCoefficients(
        a_p=c.a_p * time_scale,
        b_p=c.b_p * time_scale,
        c_p=c.c_p * time_scale,
        a_d=c.a_d * time_scale,
        b_d=c.b_d * time_scale,
        t_c=c.t_c * time_scale,
        d_p=c.d_p * time_scale,
    )
    return dataclasses.replace(profile, coefficients=scaled)


def _make_policy(config: ClusterConfig, estimator: BatchLatencyEstimator) -> SchedulingPolicy:
    if isinstance(config.policy, str):
        return make_policy(config.policy, estimator, **config.policy_params)
    return config.policy(estimator, **config.policy_params)


def _make_router(config: ClusterConfig, views: list[InstanceView]) -> Router:
    if isinstance(config.router, str):
        from priority.routing import make_router

        return make_router(config.router, views, **config.router_params)
    return config.router(views, **config.router_params)


def _stats(engine: EngineCore) -> InstanceStats:
    s = engine.stats
    return InstanceStats(
        name=engine.name,
        role=engine.role.value,
        profile=engine.profile.name,
        steps=s.steps,
        policy_calls=s.policy_calls,
        busy_s=s.busy_s,
        preemptions=s.preemptions,
        prefill_tokens=s.prefill_tokens,
        decode_tokens=s.decode_tokens,
        rejected=s.rejected,
        transfers_in=s.transfers_in,
    )


def _callable_name(obj: object) -> str:
    return str(getattr(obj, "name", None) or getattr(obj, "__name__", type(obj).__name__))
