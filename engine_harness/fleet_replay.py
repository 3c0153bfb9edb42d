"""The fleet on a virtual clock, real side: every instance a real vLLM scheduler, a router in front
(imports vLLM).

Each instance is a scheduler built as :func:`engine_harness.replay.build_scheduler` builds one
(stock vLLM or ``TiergateScheduler`` with a policy, the instance's own profile); the router is
one of :mod:`priority.routing`'s, fed the events the gateway reports (dispatch, first token,
finish, free KV blocks). The event loop follows the cluster simulator's rules
(:mod:`priority.sim.cluster`), so that the two agree request by request:

* events at one instant: trace arrivals first, then step ends, then an idle instance's start
  (a "wake-up", so that every simultaneous arrival reached it first);
* an arrival is routed on the router's state as it stands, dispatched, and added to the chosen
  scheduler; an idle scheduler wakes up at that instant;
* a step is ``schedule()`` at its start, its outputs applied (``update_from_output()``) at its
  end, ``step_time`` of the batch later; its first tokens and finishes go to the router, then
  the instance's free KV blocks, and the instance starts its next step at once if it has work.

The requests the router sees are the simulator's (:func:`engine_harness.sim_replay.request_of`),
their output count kept in step with vLLM's. Co-located only: a PD-disaggregated fleet needs a
KV connector between the schedulers (vLLM's ``kv_transfer_config``), not built here.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine_harness.replay import (
    STOP,
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

_STEP_END, _WAKE = 1, 2
"""Event kinds, in the cluster simulator's order at equal times (arrivals come before both)."""


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
) -> FleetReplay:
    """``arrivals`` through one real scheduler per profile behind ``router`` (module docstring):
    ``policy`` None runs stock vLLM in ``stock_policy`` mode on every instance. Each arrival
    first meets the API server's rule at ``max_model_len`` (None: from the trace and the pool)."""
    if max_model_len is None:
        max_model_len = model_len_for(arrivals, num_blocks)
    fleet_admitted(arrivals, max_model_len)  # rejects workflow calls, as the simulator side does
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
    ) -> None:
        self.clock = FakeClock(min((a.time for a in arrivals), default=0.0))
        self.profiles = list(profiles)
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
            )
            for p in self.profiles
        ]
        role = InstanceRole.COLOCATED
        views = [
            InstanceView(i, f"{role.value}-{i}", p, p.estimator(), role)
            for i, p in enumerate(self.profiles)
        ]
        self.router = make_router(router, views, **fleet_router_params(router, router_params))
        for i, s in enumerate(self.schedulers):  # the gateway's first scrape
            self.router.on_kv_report(i, _free_blocks(s))
        self.queue = ArrivalQueue(arrivals)
        n = len(self.schedulers)
        self.result = FleetReplay(Replay(), steps=[0] * n, preemptions=[0] * n)
        self.release = Release(self.queue, self.result.replay, max_model_len)
        self.requests: dict[str, Request] = {}
        self.decisions: dict[str, RouteDecision] = {}
        self.lengths: dict[str, int] = {}
        self.in_flight: list[tuple[Any, Any] | None] = [None] * len(self.schedulers)
        self.heap: list[tuple[float, int, int, int]] = []
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
            t, kind, _, index = heapq.heappop(heap)
            self.clock.t = t
            if kind == _STEP_END:
                self._step_end(index, t)
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
        if decision.decode_instance is not None:
            raise ValueError("a fleet replay is co-located: the router chose a decode instance")
        self.router.on_dispatch(request, decision, now)
        rid = arrival.request_id
        self.requests[rid], self.decisions[rid] = request, decision
        self.result.placement[rid] = decision.instance
        self.result.replay.token_times[rid] = []
        stop = arrival.target_tokens < arrival.max_tokens
        if stop:
            self.lengths[rid] = arrival.target_tokens
        self.schedulers[decision.instance].add_request(
            make_request(
                rid,
                arrival.prompt_tokens,
                arrival.max_tokens,
                arrival_time=arrival.time,
                extra_args=arrival.extra_args,
                priority=arrival.priority,
                stop_token_ids=[STOP] if stop else None,
            )
        )
        index = decision.instance
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
        token_times = self.result.replay.token_times
        emitted = []
        for rid, sampled in zip(
            runner_output.req_ids, runner_output.sampled_token_ids, strict=True
        ):
            if sampled:
                token_times[rid].append(t)
                emitted.append(rid)
        scheduler.update_from_output(output, runner_output)
        first, finished = [], []
        for rid in emitted:
            request = self.requests[rid]
            request.num_output_tokens = len(token_times[rid])
            if request.num_output_tokens == 1:
                first.append(request)
            real = scheduler.requests.get(rid)
            if real is None or real.is_finished():
                finished.append(request)
        router = self.router
        for request in first:
            router.on_first_token(request, self.decisions[request.request_id], t)
        for request in finished:
            router.on_finish(request, self.decisions[request.request_id], t, saw_first_token=True)
        router.on_kv_report(index, _free_blocks(scheduler))
        if scheduler.has_unfinished_requests():
            self._start(index, t)

    def _push(self, t: float, kind: int, index: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, index))


def _free_blocks(scheduler: Any) -> int:
    """The scheduler's free KV blocks (its null block excluded), as the engine reports them."""
    return int(scheduler.kv_cache_manager.block_pool.get_num_free_blocks())
