"""The fleet on a virtual clock, real side: every instance a real vLLM scheduler, a router in front
(imports vLLM).

Each instance is a scheduler built as :func:`engine_harness.replay.build_scheduler` builds one
(stock vLLM or ``TiergateScheduler`` with a policy, the instance's own profile); the router is
one of :mod:`priority.routing`'s, fed the events the gateway reports (dispatch, first token,
finish, free KV blocks). The event loop follows the cluster simulator's rules
(:mod:`priority.sim.cluster`), so that the two agree request by request:

* events at one instant: trace arrivals first, then KV landings, then step ends, then an idle
  instance's start (a "wake-up", so that every simultaneous arrival reached it first);
* an arrival is routed on the router's state as it stands, dispatched, and added to the chosen
  scheduler; an idle scheduler wakes up at that instant;
* a step is ``schedule()`` at its start, its outputs applied (``update_from_output()``) at its
  end, ``step_time`` of the batch later; its first tokens and finishes go to the router, then
  the instance's free KV blocks, and the instance starts its next step at once if it has work.

The requests the router sees are the simulator's (:func:`engine_harness.sim_replay.request_of`),
their output tokens kept in step with vLLM's.

**PD-disaggregation** (``pd``): the first ``pd.num_prefill`` instances prefill, the others
decode, and the KV moves through vLLM's own KV-connector interface (``kv_transfer_config``,
:class:`HandoffConnector` on both sides). A request reaches its prefill instance with
``kv_transfer_params = {"do_remote_decode": true}``, computes its prompt there and samples its
first token, which ends it there (a stop token); vLLM frees its blocks and asks the connector,
whose ``request_finished`` returns the transfer parameters (the prompt tokens computed, the
instance) that vLLM puts in the request's output. The router then binds the decode instance
(``decode_at_handoff``), and the KV lands there after the simulator's transfer time
(:class:`~priority.sim.cluster.KvTransferModel`): the request is added to the decode scheduler
with those parameters (``kv_transfer_params = {"do_remote_prefill": true, ...}``) and its first
token as its first output token (the client already has it); when vLLM admits it, it asks the
connector (``get_num_new_matched_tokens``), which answers with the prompt's tokens, loaded
synchronously, so vLLM computes the one token left and samples the second. A request preempted
on its decode instance recomputes there (the connector loads a request's KV once).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from engine_harness.replay import (
    STOP,
    TOKEN,
    FakeClock,
    build_scheduler,
    make_request,
    model_output,
    step_time,
)
from engine_harness.sim_replay import (
    Arrival,
    ArrivalQueue,
    FleetReplay,
    Release,
    Replay,
    fleet_admitted,
    fleet_profiles,
    fleet_router_params,
    model_len_for,
    request_of,
)
from priority.profiles import Profile
from priority.request import Request
from priority.routing import InstanceRole, InstanceView, RouteDecision, make_router
from priority.sim.cluster import PdConfig

_LANDING, _STEP_END, _WAKE = 0, 1, 2
"""Event kinds, in the cluster simulator's order at equal times (arrivals come before all)."""

REMOTE_DECODE = "do_remote_decode"
REMOTE_PREFILL = "do_remote_prefill"
"""vLLM's ``kv_transfer_params`` keys for the two halves of a disaggregated request (the keys
its own P/D connectors and proxies use)."""
REMOTE_TOKENS = "remote_num_tokens"
"""Our parameter: the prompt tokens whose KV the prefill instance computed and sends."""
REMOTE_INSTANCE = "remote_instance"
"""Our parameter: the prefill instance the KV comes from."""


class HandoffConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector of a replayed PD fleet: the scheduler side of a prefill-to-decode KV
    handoff; no data moves (the replay has no model) and the transfer's time is the replay's
    (the module docstring).

    Prefill side: a request sent with ``do_remote_decode`` leaves, once finished, with the
    parameters its decode instance needs (its blocks are freed at once: the simulator frees
    them at the handoff). Decode side: a request sent with ``do_remote_prefill`` finds its
    prompt's KV computed when vLLM first admits it (a synchronous load: it has landed); after a
    preemption it recomputes."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.loaded: set[str] = set()
        """Requests whose transferred KV was loaded (never again: a preemption recomputes)."""

    # ---- scheduler side ---------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        if not params.get(REMOTE_PREFILL) or request.request_id in self.loaded:
            return 0, False
        return max(0, int(params[REMOTE_TOKENS]) - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self.loaded.add(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        self.loaded.discard(request.request_id)
        params = request.kv_transfer_params or {}
        if not params.get(REMOTE_DECODE):
            return False, None
        engine = self._kv_transfer_config.engine_id
        return False, {
            REMOTE_PREFILL: True,
            REMOTE_TOKENS: int(request.num_computed_tokens),
            REMOTE_INSTANCE: engine,
        }

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, block_ids)

    # ---- worker side: nothing to move -------------------------------------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


def handoff_config(role: InstanceRole, index: int) -> KVTransferConfig | None:
    """The ``kv_transfer_config`` of a fleet instance: :class:`HandoffConnector` as producer
    (prefill) or consumer (decode); None co-located."""
    if role is InstanceRole.COLOCATED:
        return None
    return KVTransferConfig(
        kv_connector=HandoffConnector.__name__,
        kv_connector_module_path=__name__,
        kv_role="kv_producer" if role is InstanceRole.PREFILL else "kv_consumer",
        engine_id=f"{role.value}-{index}",
    )


def replay_fleet_vllm(
    arrivals: Sequence[Arrival],
    model_dir: Path,
    profiles: Sequence[Profile],
    router: str,
    *,
    num_blocks: int,
    policy: str | None = None,
    params: Mapping[str, Any] | None = None,
    stock_policy: str = "fcfs",
    router_params: Mapping[str, Any] | None = None,
    max_model_len: int | None = None,
    pd: PdConfig | None = None,
) -> FleetReplay:
    """``arrivals`` through one real scheduler per profile behind ``router`` (module docstring):
    ``policy`` None runs stock vLLM in ``stock_policy`` mode on every instance; ``pd``
    disaggregates the fleet (None: co-located). Each arrival first meets the API server's rule
    at ``max_model_len`` (None: from the trace and the pool)."""
    if max_model_len is None:
        max_model_len = model_len_for(arrivals, num_blocks)
    fleet_admitted(arrivals, max_model_len)  # rejects workflow calls, as the simulator side does
    if pd is not None and not 0 < pd.num_prefill < len(profiles):
        raise ValueError(f"PD mode needs 1..{len(profiles) - 1} prefill instances")
    return _Fleet(
        arrivals,
        model_dir,
        fleet_profiles(profiles, num_blocks),
        router,
        num_blocks=num_blocks,
        policy=policy,
        params=params,
        stock_policy=stock_policy,
        router_params=router_params,
        max_model_len=max_model_len,
        pd=pd,
    ).run()


class _Fleet:
    def __init__(
        self,
        arrivals: Sequence[Arrival],
        model_dir: Path,
        profiles: Sequence[Profile],
        router: str,
        *,
        num_blocks: int,
        policy: str | None,
        params: Mapping[str, Any] | None,
        stock_policy: str,
        router_params: Mapping[str, Any] | None,
        max_model_len: int,
        pd: PdConfig | None,
    ) -> None:
        self.clock = FakeClock(min((a.time for a in arrivals), default=0.0))
        self.profiles = list(profiles)
        self.pd = pd
        self.roles = [_role(pd, i) for i in range(len(self.profiles))]
        self.schedulers = [
            build_scheduler(
                model_dir,
                num_blocks=num_blocks,
                policy=policy,
                params=params,
                profile=p.name,
                stock_policy=stock_policy,
                clock=self.clock,
                max_model_len=max_model_len,
                token_budget=p.engine.max_num_batched_tokens,
                max_num_seqs=p.engine.max_num_seqs,
                kv_transfer=handoff_config(role, i),
            )
            for i, (p, role) in enumerate(zip(self.profiles, self.roles, strict=True))
        ]
        views = [
            InstanceView(i, f"{role.value}-{i}", p, p.estimator(), role)
            for i, (p, role) in enumerate(zip(self.profiles, self.roles, strict=True))
        ]
        self.router = make_router(router, views, **fleet_router_params(router, router_params))
        for i, s in enumerate(self.schedulers):  # the gateway's first scrape
            self.router.on_kv_report(i, _free_blocks(s))
        self.queue = ArrivalQueue(arrivals)
        n = len(self.schedulers)
        self.result = FleetReplay(Replay(), steps=[0] * n, preemptions=[0] * n)
        self.release = Release(self.queue, self.result.replay, max_model_len)
        self.requests: dict[str, Request] = {}
        self.arrivals: dict[str, Arrival] = {}
        self.decisions: dict[str, RouteDecision] = {}
        self.lengths: dict[str, int] = {}
        """Request id -> the output token its model samples ``STOP`` as (a prefill instance's
        request: its first)."""
        self.in_flight: list[tuple[Any, Any] | None] = [None] * len(self.schedulers)
        self.heap: list[tuple[float, int, int, int, Any]] = []
        self.seq = 0
        self.waking: set[int] = set()

    def run(self) -> FleetReplay:
        queue, heap = self.queue, self.heap
        while True:
            due = queue.next_time()
            if due is not None and (not heap or due <= heap[0][0]):
                self.clock.t = due
                for arrival in self.release.due(due):
                    self._arrive(arrival, due)
                continue
            if not heap:
                break
            t, kind, _, index, payload = heapq.heappop(heap)
            self.clock.t = t
            if kind == _STEP_END:
                self._step_end(index, t)
            elif kind == _LANDING:
                self._land(index, payload, t)
            else:
                self.waking.discard(index)
                if self.in_flight[index] is None:
                    self._start(index, t)
        busy = [i for i, s in enumerate(self.schedulers) if s.has_unfinished_requests()]
        if busy:
            raise AssertionError(f"instances {busy} stalled with work queued")
        self.result.replay.arrivals = queue.released
        return self.result

    def _arrive(self, arrival: Arrival, now: float) -> None:
        request = request_of(arrival, self.profiles[0])
        started = time.perf_counter()
        decision = self.router.route(request, now)
        self.result.replay.decision_s.append(time.perf_counter() - started)
        self._check(decision)
        self.router.on_dispatch(request, decision, now)
        rid = arrival.request_id
        self.requests[rid], self.decisions[rid], self.arrivals[rid] = request, decision, arrival
        self._place(rid, decision)
        self.result.replay.token_times[rid] = request.token_times  # one list: kept in step
        extra_args = arrival.extra_args
        if self.pd is not None:  # the prefill half: the prompt and the first token
            self.lengths[rid] = 1
            extra_args = {**extra_args, "kv_transfer_params": {REMOTE_DECODE: True}}
        elif arrival.target_tokens < arrival.max_tokens:
            self.lengths[rid] = arrival.target_tokens
        self.schedulers[decision.instance].add_request(
            make_request(
                rid,
                arrival.prompt_tokens,
                arrival.max_tokens,
                arrival_time=arrival.time,
                extra_args=extra_args,
                priority=arrival.priority,
                stop_token_ids=[STOP] if rid in self.lengths else None,
            )
        )
        self._poke(decision.instance, now)

    def _land(self, index: int, handoff: tuple[str, dict[str, Any]], now: float) -> None:
        """The prompt's KV of a request landed on decode instance ``index``: vLLM gets the
        request with the transfer's parameters and its first token."""
        rid, params = handoff
        arrival = self.arrivals[rid]
        if arrival.target_tokens < arrival.max_tokens:
            self.lengths[rid] = arrival.target_tokens
        else:
            self.lengths.pop(rid, None)
        request = make_request(
            rid,
            arrival.prompt_tokens,
            arrival.max_tokens,
            arrival_time=arrival.time,
            extra_args={**arrival.extra_args, "kv_transfer_params": params},
            priority=arrival.priority,
            stop_token_ids=[STOP] if rid in self.lengths else None,
        )
        request.append_output_token_ids(TOKEN)  # sampled on the prefill instance
        self.schedulers[index].add_request(request)
        self._poke(index, now)

    def _poke(self, index: int, now: float) -> None:
        if self.in_flight[index] is None and index not in self.waking:
            self.waking.add(index)
            self._push(now, _WAKE, index)

    def _start(self, index: int, now: float) -> None:
        scheduler = self.schedulers[index]
        if not scheduler.has_unfinished_requests():
            return
        output = scheduler.schedule()
        if output.total_num_scheduled_tokens == 0:  # nothing runnable: idle until poked
            scheduler.update_from_output(output, model_output(scheduler, output, self.lengths))
            return
        end = now + step_time(self.profiles[index].coefficients, scheduler, output)
        self.in_flight[index] = (output, model_output(scheduler, output, self.lengths))
        self.result.steps[index] += 1
        self.result.preemptions[index] += len(output.preempted_req_ids or ())
        self._push(end, _STEP_END, index)

    def _step_end(self, index: int, t: float) -> None:
        scheduler = self.schedulers[index]
        step = self.in_flight[index]
        assert step is not None
        self.in_flight[index] = None
        output, runner_output = step
        emitted = []
        for rid, sampled in zip(
            runner_output.req_ids, runner_output.sampled_token_ids, strict=True
        ):
            if sampled:
                self.requests[rid].token_times.append(t)
                emitted.append(rid)
        outputs = scheduler.update_from_output(output, runner_output)
        sent = {  # what vLLM's outputs carry for the decode half
            o.request_id: o.kv_transfer_params
            for outs in outputs.values()
            for o in outs.outputs
            if o.kv_transfer_params
        }
        prefill = self.roles[index] is InstanceRole.PREFILL
        first, finished, handoffs = [], [], []
        for rid in emitted:
            request = self.requests[rid]
            request.num_output_tokens = len(request.token_times)
            if request.num_output_tokens == 1:
                first.append(request)
            if prefill and request.num_output_tokens < self.arrivals[rid].target_tokens:
                handoffs.append((request, sent[rid]))
                continue
            real = scheduler.requests.get(rid)
            if real is None or real.is_finished():
                finished.append(request)
        router = self.router
        for request, params in handoffs:  # the decode instance, bound now
            rid = request.request_id
            request.num_computed_tokens = int(params[REMOTE_TOKENS])
            self.decisions[rid] = router.decode_at_handoff(request, self.decisions[rid], t)
            self._check(self.decisions[rid])
            self._place(rid, self.decisions[rid])
        for request in first:
            router.on_first_token(request, self.decisions[request.request_id], t)
        for request in finished:
            router.on_finish(request, self.decisions[request.request_id], t, saw_first_token=True)
        if handoffs:
            assert self.pd is not None
            for request, params in handoffs:
                rid = request.request_id
                target = self.decisions[rid].decode_instance
                assert target is not None
                land = t + self.pd.transfer.transfer_s(int(params[REMOTE_TOKENS]))
                self._push(land, _LANDING, target, (rid, params))
        router.on_kv_report(index, _free_blocks(scheduler))
        if scheduler.has_unfinished_requests():
            self._start(index, t)

    def _place(self, rid: str, decision: RouteDecision) -> None:
        self.result.placement[rid] = decision.instance
        if decision.decode_instance is not None:
            self.result.decode_placement[rid] = decision.decode_instance

    def _check(self, decision: RouteDecision) -> None:
        """The simulator's checks of a routing decision (``priority.sim.cluster``)."""
        if self.pd is None:
            if decision.decode_instance is not None:
                raise ValueError("router chose a decode instance outside PD mode")
            return
        target = decision.decode_instance
        if self.roles[decision.instance] is not InstanceRole.PREFILL:
            raise ValueError(f"PD mode: router sent a prefill to instance {decision.instance}")
        if target is None or self.roles[target] is not InstanceRole.DECODE:
            raise ValueError(f"PD mode: router gave no valid decode instance ({target})")

    def _push(self, t: float, kind: int, index: int, payload: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, index, payload))


def _role(pd: PdConfig | None, index: int) -> InstanceRole:
    """Instance ``index``'s role, as ``priority.sim.cluster.ClusterConfig.role`` assigns it."""
    if pd is None:
        return InstanceRole.COLOCATED
    return InstanceRole.PREFILL if index < pd.num_prefill else InstanceRole.DECODE


def _free_blocks(scheduler: Any) -> int:
    """The scheduler's free KV blocks (its null block excluded), as the engine reports them."""
    return int(scheduler.kv_cache_manager.block_pool.get_num_free_blocks())
