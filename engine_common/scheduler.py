"""Our engine policy inside vLLM's scheduler (imports vLLM when a scheduler is built).

vLLM keeps everything it is good at — KV-cache management, prefix caching, the request
lifecycle, outputs and its own stats — and our policy decides, every step, who runs, how many
tokens each computes and whom to preempt. The hooks, all as thin as vLLM allows:

1. **Policy view.** Before vLLM's ``schedule()``, every running request and every schedulable
   waiting request is mirrored into an :class:`EngineRequest` (a :class:`priority.request.Request`
   cached per request id: SLO from ``sampling_params.extra_args`` and ``priority`` once; computed
   and output tokens and KV blocks held refreshed each step for running requests; a waiting
   request's view only when vLLM changed it, see ``EngineRequest.stamp``, and while vLLM's
   queue is unchanged a step reuses the last step's waiting views, re-checking only the
   requests vLLM may change in place, see ``_WaitingSnapshot``: queued requests outnumber
   running ones, and this runs every step) whose tokens to compute are the ones vLLM
   would schedule this step (:func:`compat.step_tokens`: draft tokens of speculative decoding
   included, the chunk cut at ``long_prefill_token_threshold`` and the model length, the
   prefix-cache hit a waiting request will find, a lone decode padded to the spec-decode width;
   what a KV connector will load synchronously on admission counts as computed, as vLLM counts
   it: a PD decode instance's request is the one token left, :func:`compat.connector_hit`);
   the policy plans the step with :class:`EngineLimits` from the scheduler config and the KV
   pool's free blocks. Running requests with nothing to compute this step (all their tokens in
   flight, or prefill held by vLLM's prefill interval / DP throttle) are shown with 0 tokens: they
   hold seats and blocks and are possible victims, as in vLLM (unless vLLM could not free their
   blocks now).
2. **Preemption.** The plan's victims are preempted first, through vLLM's own
   ``_preempt_request`` (free blocks, recompute later), and reported in the step's output.
3. **Order.** ``scheduler.running`` and the waiting queue (a :class:`PolicyOrderedQueue`) are
   re-sorted so the planned requests come first, in the plan's order; waiting requests the
   policy does not see keep their places, and after the step the queue is back in vLLM's own
   order (FCFS, or priority order under ``--scheduling-policy priority``).
4. **Token budget.** ``max_num_scheduled_tokens`` is set to the plan's total for the step, plus
   room for what only vLLM can know: requests the policy does not see (blocked, holding KV)
   should vLLM find them ready, a whole admission whose prefix-cache hit turns out shorter, the
   drafts of a decode a policy planned as one token. Every request the policy saw is capped
   (next item), so that room never goes to a request the plan left out.
5. **Per-request chunk.** vLLM sizes each request's chunk as ``min(needed, budget left)``; a plan
   may chunk a prefill in the middle of the batch. vLLM calls one overridable method per request
   in both of its loops in every supported version — ``_mamba_block_aligned_split`` when
   ``need_mamba_block_aligned_split`` is set — so the adapter keeps that flag on (a property:
   vLLM's own setting is recorded, whenever it is set), chains to vLLM's own split when vLLM
   wants it, and caps the result at the planned tokens (0 for a request the plan leaves out this
   step: vLLM then skips it in the running loop and stops admitting in the waiting loop, which
   is exactly where the planned admissions end).

vLLM admits a waiting request only if its whole current sequence fits in the free blocks
(``scheduler_reserve_full_isl``, on by default) and stops admitting at the first refusal. The
rule reaches the policy in :class:`EngineLimits` (``admission``), and :class:`BatchBuilder` plans
within it, so a plan is not refused; as a safety net for a policy that plans otherwise, the
adapter replays vLLM's check on the plan and re-plans without a request vLLM would refuse
(counted in ``PolicyDriver.replans``). A policy may thus
plan one step several times: only the plan that ran reaches its ``on_step_end`` (once per
executed step), and policies commit their state there, never in ``schedule()``.

Where vLLM may still deviate from the plan, always by doing *less* for a planned request (the
caps are upper bounds): encoder budgets and boundaries, Mamba block alignment, LoRA limits or a
KV allocation that fails (vLLM then preempts from the tail of ``running``: the requests the plan
did not schedule); a longer prefix-cache hit than expected. Requests the policy never sees
(blocked on grammar, remote KV or streaming input; holding KV while waiting) keep vLLM's
handling: where the policy cannot model a request, vLLM runs its own logic for it. Every step
whose executed batch differs from the plan is counted in
``PolicyState.plan_deviations``; if vLLM could run nothing of a non-empty plan, the next step
is left to vLLM's own order, so the engine cannot livelock on a plan it cannot execute.
vLLM's "no admission in a step that preempted" rule does not apply to the plan's own
preemptions: the policy accounted for the freed blocks.

The estimator learns from real step times (:mod:`engine_common.timing` measures them,
:mod:`engine_common.learning` corrects beta, refits the coefficients and logs the steps).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from engine_common import compat
from engine_common.learning import StepLearner, StepShape
from engine_common.settings import EngineSettings
from engine_common.slo import RequestMeta, parse_meta
from engine_common.state import PolicyState, encode, received_key
from engine_common.timing import StepTimer
from priority.estimator_refit import COEFFICIENT_NAMES
from priority.policies.base import EngineLimits, SchedulerInput, StepPlan, cdiv
from priority.policies.ordering import is_decoding
from priority.request import Request, RequestStatus

logger = logging.getLogger(__name__)

_MAX_RECEIVED_KEYS = 64
"""Distinct (tier, kind, objective) counters an engine exports at most (tiers are few)."""
_SWEEP_EVERY = 1024
"""Steps between full sweeps of views whose request vLLM dropped without reporting it as
finished (a request whose blocks a KV connector frees late)."""


class EngineRequest(Request):
    """The policy's mirror of a vLLM request: a :class:`Request` whose tokens to compute this
    step are the ones vLLM itself would schedule (:func:`compat.step_tokens`).

    vLLM verifies a decode's draft tokens (speculative decoding) in the same step as the decode,
    and cuts a chunk at ``long_prefill_token_threshold`` and at the model length; a plan made on
    ``num_tokens - num_computed_tokens`` would drop the drafts and waste the budget vLLM cuts.
    The policy plans on what vLLM can run, so a decode's planned tokens include its drafts and
    the estimator times them as the chunk they are.
    """

    step_tokens: int | None = None
    cache_hit: int = 0
    """Waiting: tokens the adapter expects vLLM to find in its prefix cache on admission."""
    stamp: tuple[int, int, int] | None = None
    """Waiting: what the view was refreshed from (vLLM's ``num_tokens``, output placeholders,
    the step's chunk threshold); None: refresh it (it ran, or it holds a cache lookup)."""

    @property
    def num_uncomputed_tokens(self) -> int:
        if self.step_tokens is not None:
            return self.step_tokens
        return self.prompt_tokens + self.num_output_tokens - self.num_computed_tokens


@dataclasses.dataclass(slots=True)
class _WaitingSnapshot:
    """The policy's waiting views as last built from vLLM's waiting queue, reused while nothing
    they were built from changed (see :meth:`PolicyDriver._waiting_views`).

    A queued request that never ran changes only by leaving the queue (admitted, aborted), which
    changes the queue's version; the rest are re-checked every step: the ones vLLM keeps to
    itself (their status flips in place when grammar or remote KV is ready), the ones that ran
    before (preempted: an output in flight may land on them; resumable streaming sessions), and
    the ones whose prefix-cache hit is looked up (the cache changes every step)."""

    key: tuple[int, compat.StepTokens, int, int]
    """(queue version, the step's token rules, lookups, arrivals) it was built under."""
    views: list[Request]
    """The waiting views in vLLM's queue order, as handed to the policy."""
    lookups: list[Any]
    """vLLM requests of the views whose prefix-cache hit is looked up each step."""
    left: list[Any]
    """Waiting requests vLLM keeps to itself (their tokens count as unseen)."""
    watched: list[tuple[Any, EngineRequest]]
    """(vLLM request, view) of the views vLLM may change in place while they wait."""
    caps: dict[str, int]
    """Every view's request id → 0 (the step's caps start from a copy)."""


class PolicyDriver:
    """Runs one policy against one vLLM scheduler object (see the module docstring)."""

    def __init__(
        self,
        scheduler: Any,
        settings: EngineSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scheduler = scheduler
        self.settings = settings
        self.policy = settings.make_policy()
        self.clock = clock
        """Seconds on the clock of ``Request.arrival_time`` (Unix time: vLLM stamps arrivals
        with ``time.time()`` and the gateway sends Unix times)."""
        config = scheduler.scheduler_config
        self.token_budget = min(
            int(scheduler.max_num_scheduled_tokens), int(config.max_num_batched_tokens)
        )
        self.vllm_admission = compat.admission_rule(scheduler)
        """vLLM's admission rule, read from its configuration (the re-plan safety net checks
        every plan against it)."""
        self.admission = self.vllm_admission
        """The rule handed to the policy, planned within so that a plan is not refused."""
        self.replans = 0
        """Plans redone because vLLM would have refused an admission (policies that plan
        through :class:`BatchBuilder` never need one)."""
        self.state = PolicyState()
        self.timer: StepTimer[tuple[StepPlan | None, StepShape]] = StepTimer()
        self.learner = StepLearner(
            self.policy.estimator,
            refit_every=settings.refit_every,
            step_log=settings.step_log,
        )
        self._views: dict[str, EngineRequest] = {}
        self._left_to_vllm = compat.left_to_vllm(scheduler)
        self._admitted: dict[str, int] = {}
        self._counter = itertools.count()
        self._caps: dict[str, int] | None = None
        self._plan: StepPlan | None = None
        self._preempted: list[str] = []
        self._saved_budget: int | None = None
        self._now = 0.0
        self._threshold = 0
        self._stalled = False
        self._deviations = 0
        self._steps = 0
        self._arrivals = 0
        """Bumped by every ``add_request`` (a streaming session's next input changes a queued
        request in place)."""
        self._snapshot: _WaitingSnapshot | None = None
        self._sweep_countdown = _SWEEP_EVERY
        self.received: dict[str, int] = {}
        """Requests seen so far by tier, kind and objective (exported: :class:`PolicyState`)."""

    # ---- the hooks around vLLM's schedule() ---------------------------------------------------

    def before_schedule(self, throttle_prefills: bool = False) -> None:
        s = self.scheduler
        self._forget_finished()  # aborted since the last output
        defer = compat.defers_prefills(s, throttle_prefills)
        now = self.clock()
        self._caps = None
        self._plan = None
        self._threshold = compat.long_prefill_threshold(s)
        tokens_of = compat.step_tokens(s, self._threshold)
        running: list[Request] = []
        schedulable = 0
        hidden = 0
        blocks = compat.block_table(s)
        admitted = self._admitted.get
        order: list[int] = []  # admission rank of each running view
        for req in s.running:
            view = self._running_view(req, tokens_of, blocks)
            if (
                (req.num_output_placeholders and compat.is_done_in_flight(req))
                or view.num_uncomputed_tokens < 1
                or (defer and req.is_prefill_chunk)  # vLLM holds prefill work this step
            ):
                if not compat.can_free_blocks(s, req):
                    hidden += 1  # neither work nor a victim this step: vLLM's business
                    continue
                # nothing to compute this step (its tokens are in flight), but it holds a seat
                # and KV blocks: the policy sees it, as a possible victim, as vLLM does
                view.step_tokens = 0
            else:
                schedulable += 1
            running.append(view)
            order.append(admitted(req.request_id, -1))
        if order != sorted(order):  # admission order (stable: the unranked keep vLLM's)
            running = [running[i] for i in sorted(range(len(order)), key=order.__getitem__)]
        waiting, unseen, caps = self._waiting_views(tokens_of, defer)
        for req in compat.other_waiting(s):
            unseen += tokens_of.waiting(req)
        if not schedulable and not waiting:
            return  # nothing for the policy: vLLM's own behaviour
        if self._stalled:
            # the last plan could not run at all (a vLLM rule the policy does not model): let
            # vLLM schedule this one step by itself so the engine always makes progress
            self._stalled = False
            logger.warning("tiergate: vLLM could not run the plan; one step on vLLM's order")
            return
        slots = (
            compat.max_admitted(s) - hidden - int(getattr(s, "num_waiting_for_streaming_input", 0))
        )
        limits = EngineLimits(
            token_budget=self.token_budget,
            max_num_seqs=max(slots, len(running)),
            block_size=int(s.block_size),
            num_free_blocks=compat.num_free_blocks(s),
            admission=self.admission,
        )
        candidates = waiting
        for _ in range(len(waiting) + 1):
            plan = self.policy.schedule(SchedulerInput(now, running, candidates, limits))
            refused = self._refused_admission(plan, limits)
            if refused is None:
                break
            # vLLM would refuse this admission and stop admitting there: plan without it
            self.replans += 1
            candidates = [v for v in candidates if v.request_id != refused]
        self._plan = plan
        self._steps += 1

        for shown in running:
            caps[shown.request_id] = 0
        for victim in plan.preempted:
            req = s.requests[victim.request_id]
            if not compat.can_free_blocks(s, req):
                continue  # vLLM would not free its blocks now; the plan then runs short
            s.running.remove(req)
            compat.preempt(s, req)
            self._admitted.pop(victim.request_id, None)
            self._preempted.append(victim.request_id)
        rank: dict[str, int] = {}
        admissions: list[Any] = []
        waiting_status = RequestStatus.WAITING
        for i, (planned, tokens) in enumerate(plan.scheduled):
            request_id = planned.request_id
            caps[request_id] = tokens
            rank[request_id] = i
            if planned.status is waiting_status:
                admissions.append(s.requests[request_id])
            if tokens >= planned.num_uncomputed_tokens:
                # admitted whole: should vLLM's cache hit be shorter than expected (it caps
                # hits by rules of its own), it computes the difference, not less
                hit = getattr(planned, "cache_hit", 0)  # 0 but for an EngineRequest
                if hit:
                    caps[request_id] += hit
                    unseen += hit
            elif isinstance(planned, EngineRequest) and tokens == 1 and is_decoding(planned):
                # a policy that plans a decode as one token (``is_decoding`` looks at the
                # sequence, not the drafts): vLLM verifies the drafts with it, as it would
                drafts = planned.num_uncomputed_tokens - 1
                caps[request_id] += drafts
                unseen += drafts
        if rank:  # the plan's order first; the others keep theirs, after it
            last = len(rank)
            keys = [rank.get(r.request_id, last) for r in s.running]
            if keys != sorted(keys):  # already in order in most steps
                by_rank = sorted(range(len(keys)), key=keys.__getitem__)
                s.running[:] = [s.running[i] for i in by_rank]
        # the planned admissions first, in the plan's order; only the requests the policy saw
        # move, the others keep their places in vLLM's queue
        s.waiting.reorder(admissions, movable=caps.__contains__)
        self._caps = caps
        self._saved_budget = s.max_num_scheduled_tokens
        # the plan's tokens, and room for the requests the policy does not see should vLLM
        # find them ready this step (every request the policy saw is capped at its plan)
        s.max_num_scheduled_tokens = min(self._saved_budget, plan.num_tokens + max(0, unseen))
        self._now = now
        urgent = plan.num_urgent
        self.state = PolicyState(
            num_urgent=urgent,
            num_normal=len(running) + len(waiting) - urgent,
            latency_budget_s=plan.time_budget_s or 0.0,
            beta=self.policy.estimator.beta,
            estimator_error=self.policy.estimator.last_ratio_error,
            plan_deviations=self._deviations,
            steps=self._steps,
            num_hopeless=len(plan.hopeless),
        )

    def current_state(self) -> PolicyState:
        """The state to export now: the latest plan's split, and the estimator as it is.

        vLLM makes stats after every output, also the one that finishes the last request; the
        latest plan then still counts that request. With nothing left to schedule the split is
        empty, so the gauges read 0 like vLLM's own while the engine idles."""
        estimator = self.policy.estimator
        state = dataclasses.replace(
            self.state,
            beta=estimator.beta,
            estimator_error=estimator.last_ratio_error,
            refits=self.learner.refits,
            received=tuple(self.received.items()),
            coefficients=tuple(getattr(estimator.coefficients, name) for name in COEFFICIENT_NAMES),
        )
        if not self.scheduler.has_unfinished_requests():
            state = dataclasses.replace(
                state, num_urgent=0, num_normal=0, num_hopeless=0, latency_budget_s=0.0
            )
        return state

    def _waiting_views(
        self, tokens_of: compat.StepTokens, defer: bool
    ) -> tuple[list[Request], int, dict[str, int]]:
        """The policy's waiting views in vLLM's queue order (new requests appended, preempted
        ones put back at the front, as the simulator keeps its queue; a policy that wants
        another order sorts), the tokens of the waiting requests vLLM keeps to itself, and the
        step's caps with every view at 0.

        This runs every step over the whole queue, so a step whose queue is as the last one
        read it (:class:`_WaitingSnapshot`) re-checks only what vLLM may have changed in place.
        """
        s = self.scheduler
        # a prefix-cache lookup per waiting request costs ~35 us: only as many as there are
        # free seats, in vLLM's queue order (the others plan their whole prompt; vLLM then
        # computes less, never more)
        lookups = compat.max_admitted(s) - len(s.running)
        threshold = tokens_of.threshold
        version = getattr(s.waiting, "version", None)
        snap = self._snapshot
        if (
            not defer
            and snap is not None
            and version is not None
            and snap.key == (version, tokens_of, lookups, self._arrivals)
            and self._snapshot_holds(snap, threshold)
        ):
            for req in snap.lookups:
                self._waiting_view(req, tokens_of, True)
            unseen = sum(map(tokens_of.waiting, snap.left))
            return list(snap.views), unseen, snap.caps.copy()
        waiting: list[Request] = []
        unseen = 0  # tokens of waiting requests vLLM handles by itself (see the module doc)
        left_to_vllm = self._left_to_vllm
        views = self._views
        looked_up: list[Any] = []
        left: list[Any] = []
        watched: list[tuple[Any, EngineRequest]] = []
        for req in s.waiting:
            if left_to_vllm(req):
                unseen += tokens_of.waiting(req)
                left.append(req)
            elif not (defer and req.num_computed_tokens < req.num_tokens - 1):
                lookup = len(waiting) < lookups
                kept = views.get(req.request_id)
                if (
                    kept is None
                    or lookup
                    or kept.stamp != (req.num_tokens, req.num_output_placeholders, threshold)
                ):
                    kept = self._waiting_view(req, tokens_of, lookup)
                waiting.append(kept)
                if lookup:
                    looked_up.append(req)
                if req.num_preemptions or getattr(req, "resumable", False):
                    watched.append((req, kept))
            # else: vLLM admits no prompt to prefill this step
        caps = dict.fromkeys([v.request_id for v in waiting], 0)
        self._snapshot = (
            None
            if defer or version is None
            else _WaitingSnapshot(
                key=(version, tokens_of, lookups, self._arrivals),
                views=waiting,
                lookups=looked_up,
                left=left,
                watched=watched,
                caps=caps,
            )
        )
        return list(waiting), unseen, caps.copy()

    def _snapshot_holds(self, snap: _WaitingSnapshot, threshold: int) -> bool:
        """Whether vLLM left every request the snapshot re-checks as it was built."""
        left_to_vllm = self._left_to_vllm
        if not all(map(left_to_vllm, snap.left)):
            return False  # grammar or remote KV ready: vLLM flipped its status in place
        for req, view in snap.watched:
            if left_to_vllm(req):
                return False
            if view.stamp is not None and view.stamp != (
                req.num_tokens,
                req.num_output_placeholders,
                threshold,
            ):
                return False  # an output landed late, or a streaming session's next input
        return True

    def note_arrival(self) -> None:
        """vLLM's ``add_request`` ran (a new request, or a streaming session's next input)."""
        self._arrivals += 1

    def _refused_admission(self, plan: StepPlan, limits: EngineLimits) -> str | None:
        """The first planned admission vLLM's admission check would refuse, if any.

        vLLM allocates the running requests' chunks first, then admits in queue order, each only
        if its whole current sequence fits (``scheduler_reserve_full_isl``, on by default) —
        stricter than the policy's per-chunk KV check.
        """
        admissions = [(v, t) for v, t in plan.scheduled if v.status is not RequestStatus.RUNNING]
        if not admissions:
            return None  # nothing for vLLM's admission check to refuse
        bs = limits.block_size
        free = limits.num_free_blocks + sum(v.num_kv_blocks for v in plan.preempted)
        for view, tokens in plan.scheduled:
            if view.status is RequestStatus.RUNNING:
                free -= max(0, cdiv(view.num_computed_tokens + tokens, bs) - view.num_kv_blocks)
        rule = self.vllm_admission
        for view, tokens in admissions:
            blocks = cdiv(view.num_computed_tokens + tokens, bs)
            # conservative: vLLM applies the watermark only while anything is running
            if rule.required_blocks(view, blocks, bs, anything_running=True) > free:
                return view.request_id
            free -= blocks
        return None

    def cap(self, request: Any, num_new_tokens: int) -> int:
        """vLLM's chunk for ``request`` capped at the plan's (unplanned requests pass through)."""
        if self._caps is None:
            return num_new_tokens
        planned = self._caps.get(request.request_id)
        return num_new_tokens if planned is None else min(num_new_tokens, planned)

    def restore_budget(self) -> None:
        if self._saved_budget is not None:
            self.scheduler.max_num_scheduled_tokens = self._saved_budget
            self._saved_budget = None

    def after_schedule(self, output: Any) -> None:
        s = self.scheduler
        s.waiting.settle()
        compat.report_preempted(output, self._preempted)
        self._preempted.clear()
        self._caps = None
        executed: dict[str, int] = dict(output.num_scheduled_tokens)
        plan = self._plan
        if plan is not None:
            planned = {v.request_id: tokens for v, tokens in plan.scheduled}
            if planned != executed:
                self._deviations += 1
                self._stalled = bool(planned) and not executed
                logger.debug("step deviated from the plan: planned %s, ran %s", planned, executed)
            for view, _ in plan.scheduled:  # admission order, as the simulator keeps it
                if view.request_id in executed and view.request_id not in self._admitted:
                    self._admitted[view.request_id] = next(self._counter)
        for request_id in executed:
            if request_id not in self._admitted:
                self._admitted[request_id] = next(self._counter)
        if not executed:
            return
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        for request_id, tokens in executed.items():
            l_kv = int(s.requests[request_id].num_computed_tokens) - tokens
            mirror = self._views.get(request_id)
            if tokens == 1 and (mirror is None or mirror.num_uncomputed_tokens == 1):
                decode.append(l_kv)
            else:
                prefill.append((tokens, l_kv))
        raw = self.policy.estimator.raw_batch_time(prefill, decode)
        shape = StepShape(tuple(prefill), tuple(decode))
        self.timer.scheduled(self._now if plan is not None else self.clock(), raw, (plan, shape))

    def after_update(self, scheduler_output: Any) -> None:
        if scheduler_output.total_num_scheduled_tokens > 0:
            measured = self.timer.completed(self.clock())
            if measured is not None and math.isfinite(measured.real_s):
                plan, shape = measured.payload
                self.learner.learn(shape, measured.raw_predicted_s, measured.real_s, measured.end_s)
                if plan is not None:
                    self.policy.on_step_end(plan, measured.end_s)
        self._sweep_countdown -= 1
        if self._sweep_countdown <= 0:
            self._sweep_countdown = _SWEEP_EVERY
            self._forget(self._views.keys() - self.scheduler.requests.keys())
        else:
            self._forget_finished()

    def _forget_finished(self) -> None:
        """Drop the views of the requests vLLM freed since its last ``schedule()`` (it lists
        them in ``finished_req_ids`` until then: called after every output and before every
        step, this sees each one)."""
        s = self.scheduler
        finished = getattr(s, "finished_req_ids", ())
        if finished:
            self._forget([rid for rid in finished if rid not in s.requests])

    def _forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._views.pop(request_id, None)
            self._admitted.pop(request_id, None)

    # ---- the policy's mirror of a vLLM request -------------------------------------------------

    def _running_view(
        self, req: Any, tokens_of: compat.StepTokens, blocks: dict[str, list[Any]]
    ) -> EngineRequest:
        """The policy's view of running ``req``, refreshed (every running request, every step:
        the adapter's hot path: :meth:`_tokens_view` written out)."""
        request_id = req.request_id
        view = self._views.get(request_id)
        if view is None:
            view = self._views[request_id] = self._new_view(req)
        view.num_computed_tokens = req.num_computed_tokens
        view.num_output_tokens = req.num_output_tokens + req.num_output_placeholders
        view.num_preemptions = req.num_preemptions
        view.cache_hit = 0
        view.stamp = None
        view.step_tokens = tokens_of.running(req)
        view.status = RequestStatus.RUNNING
        view.num_kv_blocks = len(blocks.get(request_id, ()))
        return view

    def _waiting_view(self, req: Any, tokens_of: compat.StepTokens, lookup: bool) -> EngineRequest:
        """The policy's view of waiting ``req``, refreshed (``lookup``: its expected prefix-cache
        hit is looked up)."""
        view = self._tokens_view(req)
        hit = compat.prefix_cache_hit(self.scheduler, req) if lookup else 0
        view.cache_hit = hit
        # what a KV connector supplies counts as computed (as vLLM counts it on admission)
        loaded = compat.connector_hit(self.scheduler, req, hit)
        view.num_computed_tokens += loaded
        view.step_tokens = tokens_of.waiting(req, hit + loaded)
        # a waiting request's view stays right while it waits: vLLM changes a queued request's
        # tokens only by running it (a running view clears the stamp) or by appending to it
        # (streaming input, outputs landing late under async scheduling: the stamp changes)
        view.stamp = (
            None if lookup else (req.num_tokens, req.num_output_placeholders, tokens_of.threshold)
        )
        view.status = RequestStatus.WAITING
        view.num_kv_blocks = 0
        return view

    def _tokens_view(self, req: Any) -> EngineRequest:
        """The view of ``req`` (made on first sight) with vLLM's token counts copied in."""
        view = self._views.get(req.request_id)
        if view is None:
            view = self._views[req.request_id] = self._new_view(req)
        view.num_computed_tokens = req.num_computed_tokens
        view.num_output_tokens = req.num_output_tokens + req.num_output_placeholders
        view.num_preemptions = req.num_preemptions
        return view

    def _new_view(self, req: Any) -> EngineRequest:
        view, meta = engine_view(req, self.settings)
        self._count_received(meta)
        return view

    def _count_received(self, meta: RequestMeta) -> None:
        """Count a new request by what its metadata said (tier, kind, own objective or best
        effort); at most ``_MAX_RECEIVED_KEYS`` distinct keys, the rest under tier ``other``."""
        objective = "slo" if meta.has_slo else "best-effort"
        key = received_key(meta.tier, meta.kind, objective)
        if key not in self.received and len(self.received) >= _MAX_RECEIVED_KEYS:
            key = received_key("other", meta.kind, objective)
        self.received[key] = self.received.get(key, 0) + 1

    def view_of(self, request_id: str) -> Request | None:
        """The policy's current view of a request (for tests and debugging)."""
        return self._views.get(request_id)


def engine_view(req: Any, settings: EngineSettings) -> tuple[EngineRequest, RequestMeta]:
    """The policy's view of vLLM request ``req`` as first seen, and the metadata it carried."""
    params = req.sampling_params
    prompt_tokens = max(1, int(req.num_prompt_tokens))
    meta = parse_meta(
        getattr(params, "extra_args", None) if params is not None else None,
        getattr(req, "priority", 0),
        defaults=settings.defaults,
        zero_load_ttft_s=settings.profile.zero_load_ttft_s(prompt_tokens),
    )
    arrival = meta.arrival_s if meta.arrival_s is not None else float(req.arrival_time)
    view = EngineRequest.from_meta(
        meta,
        req.request_id,
        arrival_s=arrival,
        prompt_tokens=prompt_tokens,
        max_output_tokens=max(1, int(req.max_tokens)),
    )
    return view, meta


class TiergateSchedulerMixin:
    """Put in front of vLLM's ``Scheduler``/``AsyncScheduler`` by :func:`build_scheduler`."""

    tiergate_default_profile: ClassVar[str] = "h100-llama3.1-8b"
    tiergate: PolicyDriver

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = EngineSettings.from_env(self.tiergate_default_profile)
        from engine_common.queue import PolicyOrderedQueue

        me: Any = self
        me.waiting = PolicyOrderedQueue(me.waiting, ordered=compat.priority_scheduling(me))
        me.policy = compat.fcfs_policy()  # vLLM's fallback victim: the tail of our order
        self.tiergate = PolicyDriver(self, settings)
        logger.info(
            "tiergate scheduler on %s: policy %s, profile %s",
            type(self).__mro__[2].__name__,
            settings.policy,
            settings.profile.name,
        )

    @property
    def need_mamba_block_aligned_split(self) -> bool:
        """Always on: it turns on the per-request hook :meth:`_mamba_block_aligned_split`."""
        return True

    @need_mamba_block_aligned_split.setter
    def need_mamba_block_aligned_split(self, value: bool) -> None:
        # vLLM's own setting (a hybrid model), whenever vLLM or its tests set it
        self.__dict__["_tiergate_real_split"] = bool(value)

    def _driver(self) -> PolicyDriver | None:
        """None on an object vLLM's tests build without ``__init__`` (``object.__new__``): it
        then behaves exactly as vLLM's own class."""
        driver: PolicyDriver | None = self.__dict__.get("tiergate")
        return driver

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        driver = self._driver()
        if driver is None:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        throttle = bool(kwargs.get("throttle_prefills", args[0] if args else False))
        driver.before_schedule(throttle)
        try:
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            driver.restore_budget()
        driver.after_schedule(output)
        return output

    def add_request(self, request: Any) -> None:
        super().add_request(request)  # type: ignore[misc]
        driver = self._driver()
        if driver is not None:
            driver.note_arrival()

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output
        )
        driver = self._driver()
        if driver is not None:
            driver.after_update(scheduler_output)
        return outputs

    def _mamba_block_aligned_split(
        self, request: Any, num_new_tokens: int, *args: Any, **kwargs: Any
    ) -> int:
        attrs = self.__dict__  # once per request in both of vLLM's loops: kept lean
        if attrs.get("_tiergate_real_split", False):
            num_new_tokens = super()._mamba_block_aligned_split(  # type: ignore[misc]
                request, num_new_tokens, *args, **kwargs
            )
        driver: PolicyDriver | None = attrs.get("tiergate")
        return num_new_tokens if driver is None else driver.cap(request, num_new_tokens)

    def make_stats(self, *args: Any, **kwargs: Any) -> Any:
        stats = super().make_stats(*args, **kwargs)  # type: ignore[misc]
        driver = self._driver()
        if stats is not None and driver is not None:
            encode(driver.current_state(), stats.running_lora_adapters)
        return stats


_CLASSES: dict[tuple[str, str, type], type] = {}


def scheduler_class(default_profile: str, name: str, base: type) -> type:
    """Our scheduler class over the vLLM scheduler class ``base`` (one class per base)."""
    key = (default_profile, name, base)
    cls = _CLASSES.get(key)
    if cls is None:
        cls = type(
            f"{name}[{base.__name__}]",
            (TiergateSchedulerMixin, base),
            {"tiergate_default_profile": default_profile, "__module__": __name__},
        )
        _CLASSES[key] = cls
    return cls


def build_scheduler(default_profile: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """Construct our scheduler on the vLLM base class that fits ``vllm_config``.

    The base is resolved now (AsyncScheduler under asynchronous scheduling, else Scheduler),
    from the module attribute, so a platform plugin that rebinds vLLM's ``Scheduler`` (as
    vllm-ascend does) is respected.
    """
    vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
    base = compat.resolve_base(vllm_config)
    return scheduler_class(default_profile, name, base)(*args, **kwargs)
