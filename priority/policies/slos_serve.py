"""SLOs-Serve (Chen et al.): soft admission control over prefill deadlines, batches sized to the
tightest TPOT, and a best-effort tier for what cannot be served within its SLO.

Per step:

1. **Admission** (:mod:`priority.policies.slos_planner`): when new requests wait (or running
   ones finished, or ``replan_interval_s`` passed) the planner decides which of the waiting
   requests can still meet their SLOs alongside every request admitted before (those are
   *forced*: never declined again). Memory is budgeted at the predicted length bound
   (:meth:`~priority.request.Request.length_bound` at ``quantile``: the length distribution the
   gateway sends, else the prediction, else ``max_tokens``), never at the true length.
2. **Batch formation** (:mod:`priority.policies.slos_batch`, Alg. 2): the step lasts
   ``tpot_share`` of the tightest TPOT of the admitted streams (the estimator sizes it:
   ``time2bs``); the decodes whose next token would otherwise be late go first, earliest
   deadline first; the rest of the step is prefill budget, given to the admitted prompts by
   prefill deadline; then the admitted decodes that are not due yet.
3. **Best effort**: declined requests (and ``best-effort`` requests) get only what is left, and
   a running one is preempted (recompute on resume, the engine's preemption) whenever an
   admitted request needs its KV or its seat. They are reported in :attr:`StepPlan.hopeless`
   (reason ``slo_unattainable``) so an executor or the gateway may send them elsewhere. A
   declined request whose prefill deadline has not passed is reconsidered at the next plan.

**The prompt's last token can be held back** (``hold_first_token``) until the step after the
next could end past the prefill deadline (the rule due decodes follow), unless the step has
nothing else to do: the planner budgets a request's decode from its prefill deadline (the
paper's demand line), and the metric judges TPOT from the first token, so a first token emitted
early would start a decode the plan did not budget for — in SLOs-Serve's Fig. 3 that is what
makes the third new request late. It is off by default: real step times vary, and a token held
until the last safe step misses its TTFT whenever that step runs long
(``bench/slos_serve_capacity.py --noise 0.15 --requests 400``: capacity 10.28 / 3.66 / 4.13
req/s on chat / summary / tools with it, 11.21 / 3.82 / 4.31 without; without noise neither
setting was consistently ahead).

A decode is granted everything it has to compute this step: its token and, under speculative
decoding, the draft tokens the engine verifies with it. Not modelled: the paper's SLO-adaptive
speculation (the draft length is the engine's) and routing a declined request to another replica
(the gateway's job; the reason is in ``hopeless``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import ClassVar

import numpy as np

from priority.estimator import BatchLatencyEstimator
from priority.policies.base import BatchBuilder, SchedulerInput, SchedulingPolicy, StepPlan, cdiv
from priority.policies.ordering import all_decode_repeatable, is_decoding
from priority.policies.params import require_finite_non_negative
from priority.policies.slos_batch import decode_load, prefill_capacity
from priority.policies.slos_planner import (
    DEFAULT_DP_WINDOW,
    DEFAULT_TIME_BUDGET_S,
    Admission,
    PlanItems,
    PlannerInput,
    plan_admission,
)
from priority.request import Request

DECLINED_REASON = "slo_unattainable"
_PRUNE_EVERY = 512
_MAX_PROPOSALS = 8
"""Plans whose resulting state is kept until one runs (a step is planned at most twice)."""
_State = tuple[set[str], set[str], dict[str, float], set[str], float, set[str], int]


@dataclass(frozen=True, slots=True)
class SlosServeParams:
    quantile: float = 0.9
    """Level of the length bound memory and decode time are planned with."""
    refine_every: int = 16
    """Generated tokens between bound refreshes."""
    tpot_share: float = 0.95
    """A step lasts this share of the tightest admitted TPOT."""
    min_chunk_tokens: int = 32
    """Smallest prefill chunk that does not end a prompt."""
    dp_window: int = DEFAULT_DP_WINDOW
    """The DP's candidates before the greedy fallback."""
    planner_budget_s: float = DEFAULT_TIME_BUDGET_S
    """The DP's time before the greedy fallback."""
    replan_interval_s: float = 0.05
    """Re-plan at least this often while requests wait."""
    hold_first_token: bool = False
    """See the module docstring."""
    plan_margin_steps: float = 0.0
    """The planner wants each prefill done this many steps before its deadline (work runs in
    whole steps and a first token comes at a step's end)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile must be inside (0, 1), got {self.quantile}")
        if self.refine_every < 1 or self.min_chunk_tokens < 1 or self.dp_window < 0:
            raise ValueError("refine_every and min_chunk_tokens must be >= 1, dp_window >= 0")
        if not 0.0 < self.tpot_share <= 1.0:
            raise ValueError(f"tpot_share must be in (0, 1], got {self.tpot_share}")
        require_finite_non_negative(
            planner_budget_s=self.planner_budget_s,
            replan_interval_s=self.replan_interval_s,
            plan_margin_steps=self.plan_margin_steps,
        )


class SlosServePolicy(SchedulingPolicy):
    """SLOs-Serve's scheduler on the shared estimator and the predicted length bounds."""

    name: ClassVar[str] = "slos-serve"
    default_params: ClassVar[SlosServeParams] = SlosServeParams()
    params: SlosServeParams

    def __init__(
        self, estimator: BatchLatencyEstimator, params: SlosServeParams | None = None
    ) -> None:
        super().__init__(estimator, params)
        self.admitted: set[str] = set()
        """Requests with a guarantee (running or not yet): the planner's forced items."""
        self.declined: set[str] = set()
        """Requests in the best-effort tier (declined, or of the ``best-effort`` kind)."""
        self._anchor: dict[str, float] = {}
        self._bounds: dict[str, tuple[int, int]] = {}
        self._tau: dict[str, float] = {}
        self._known: set[str] = set()
        self._last_plan_s = -math.inf
        self._last_running: set[str] = set()
        self._steps = 0
        self.last_admission: Admission | None = None
        """The latest planner result (method and time), for benches and metrics."""
        self._proposals: dict[int, tuple[StepPlan, _State]] = {}
        """The state each recent plan would leave, committed by :meth:`on_step_end` for the plan
        that ran: planning a step twice (vLLM's adapter re-plans when vLLM refuses an
        admission) changes nothing until a plan runs."""

    # ---- per-request quantities -------------------------------------------------------------

    def bound(self, request: Request) -> int:
        """Predicted total output length (cached; refreshed every ``refine_every`` tokens)."""
        rid = request.request_id
        done = request.num_output_tokens
        cached = self._bounds.get(rid)
        if cached is not None and done - cached[1] < self.params.refine_every and done < cached[0]:
            return cached[0]
        value = request.length_bound(self.params.quantile)
        self._bounds[rid] = (value, done)
        return value

    @staticmethod
    def streams(request: Request) -> bool:
        """Judged by TTFT and TPOT (:func:`priority.gain.kind_slo`): a latency request with a
        streaming SLO, or one of an end-to-end kind that has no deadline."""
        slo = request.slo
        if request.kind == "best-effort" or not slo.is_streaming:
            return False
        return request.kind == "latency" or slo.deadline_s is None

    def tpot(self, request: Request) -> float | None:
        """The request's TPOT SLO if it streams (cached: this is asked of every request every
        step)."""
        tau = self._tau.get(request.request_id)
        if tau is None:
            tau = request.slo.tpot_s if self.streams(request) and request.slo.tpot_s else -1.0
            self._tau[request.request_id] = tau
        return tau if tau > 0 else None

    def prefill_deadline(self, request: Request, step_s: float) -> float:
        """When the request's first token is due: arrival + TTFT; for an end-to-end deadline,
        late enough that one token per step still ends by it; a resumed (preempted) request's
        next token is due at its decode pace."""
        if request.num_output_tokens > 0:
            return self.decode_due(request, step_s)
        slo = request.slo
        if self.tpot(request) is not None and slo.ttft_s is not None:
            return request.arrival_s + slo.ttft_s
        if slo.deadline_s is not None:
            remaining = self.bound(request)
            return request.arrival_s + slo.deadline_s - remaining * step_s
        return math.inf

    def decode_due(self, request: Request, step_s: float) -> float:
        """Due time of the next output token (see :mod:`priority.policies.slos_batch`)."""
        done = request.num_output_tokens
        tau = self.tpot(request)
        slo = request.slo
        if tau is not None:
            anchor = self._anchor.get(request.request_id)
            if anchor is None:
                anchor = request.token_times[0] if request.token_times else request.arrival_s
            return anchor + done * tau
        if slo.deadline_s is not None:
            left = max(self.bound(request) - done, 1)
            end = request.arrival_s + slo.deadline_s
            return end - (left - 1) * step_s
        return math.inf

    def is_best_effort(self, request: Request) -> bool:
        return request.kind == "best-effort" or request.request_id in self.declined

    # ---- bookkeeping ------------------------------------------------------------------------

    def _observe(self, inp: SchedulerInput) -> bool:
        """Record first-token anchors; True when the admission should be planned again."""
        now = inp.now
        anchor = self._anchor
        admitted, declined = self.admitted, self.declined
        for r in inp.running:
            rid = r.request_id
            if rid not in admitted and rid not in declined:
                # running without a decision of ours (the policy restarted, or the engine ran a
                # step on its own): kept, as every running request is (the paper's forced items)
                (declined if r.kind == "best-effort" else admitted).add(rid)
            if r.num_output_tokens > 0 and r.request_id not in anchor:
                tau = self.tpot(r) or 0.0
                first = r.token_times[0] if r.token_times else now - (r.num_output_tokens - 1) * tau
                anchor[r.request_id] = first
        running_ids = {r.request_id for r in inp.running}
        finished = bool(self._last_running - running_ids - {r.request_id for r in inp.waiting})
        self._last_running = running_ids
        new = False
        known = self._known
        for r in inp.waiting:
            if r.request_id not in known:
                known.add(r.request_id)
                new = True
                if r.kind == "best-effort":
                    self.declined.add(r.request_id)
        self._steps += 1
        if self._steps % _PRUNE_EVERY == 0:
            self._prune(running_ids | {r.request_id for r in inp.waiting})
        waiting_undecided = any(r.request_id not in self.admitted for r in inp.waiting)
        if not waiting_undecided:
            return False
        return new or finished or now - self._last_plan_s >= self.params.replan_interval_s

    def _prune(self, live: set[str]) -> None:
        self.admitted &= live
        self.declined &= live
        self._known &= live
        self._anchor = {k: v for k, v in self._anchor.items() if k in live}
        self._bounds = {k: v for k, v in self._bounds.items() if k in live}
        self._tau = {k: v for k, v in self._tau.items() if k in live}

    def step_seconds(self, inp: SchedulerInput) -> float | None:
        """The step length: ``tpot_share`` of the tightest TPOT among admitted requests (running
        or waiting); None when no admitted request streams."""
        tightest = math.inf
        admitted, tau_of = self.admitted, self._tau.get
        for r in chain(inp.running, inp.waiting):
            if r.request_id in admitted:
                tau = tau_of(r.request_id)
                if tau is None:
                    tau = self.tpot(r) or -1.0
                if 0 < tau < tightest:
                    tightest = tau
        return None if tightest == math.inf else self.params.tpot_share * tightest

    def planning_step_seconds(self, inp: SchedulerInput) -> float | None:
        """The step length the planner budgets with: as :meth:`step_seconds`, the waiting
        candidates' TPOTs included (admitting one shortens every later step)."""
        step = self.step_seconds(inp)
        for r in inp.waiting:
            tau = self.tpot(r)
            if tau is not None and (step is None or self.params.tpot_share * tau < step):
                step = self.params.tpot_share * tau
        return step

    # ---- admission --------------------------------------------------------------------------

    def planner_input(
        self, inp: SchedulerInput, step_s: float | None
    ) -> tuple[PlannerInput, list[Request]]:
        """The planner's view of the engine (see :mod:`priority.policies.slos_planner`) and the
        candidates, in the order of its candidate arrays."""
        est = self.estimator
        now = inp.now
        ref_step = step_s if step_s is not None else 0.1
        bs = inp.limits.block_size
        margin = self.params.plan_margin_steps * ref_step
        run_load: list[float] = []
        run_end: list[float] = []
        forced: list[tuple[float, float, float, int]] = []
        growth = 0
        reclaimable = 0
        seats = inp.limits.max_num_seqs
        for r in inp.running:
            if self.is_best_effort(r):
                reclaimable += r.num_kv_blocks
                seats += 1
                continue
            bound = self.bound(r)
            growth += max(0, cdiv(r.prompt_tokens + bound, bs) - r.num_kv_blocks)
            left = max(bound - r.num_output_tokens, 1)
            period = self.tpot(r) or ref_step
            load = decode_load(est, r.prompt_tokens + r.num_output_tokens + left / 2, period)
            if not is_decoding(r):  # still prefilling: a forced item
                work = est.prefill_time(r.num_uncomputed_tokens, r.num_computed_tokens)
                forced.append((self.prefill_deadline(r, ref_step) - margin, work, load, 0))
            else:
                run_load.append(load)
                run_end.append(now + left * period)
        seats -= len(inp.running)
        cands: list[Request] = []
        rows: list[tuple[int, int, int, int, float, float]] = []
        admitted = self.admitted
        for r in inp.waiting:
            if r.request_id in admitted:
                bound = self.bound(r)
                growth += cdiv(r.prompt_tokens + bound, bs)
                seats -= 1
                period = self.tpot(r) or ref_step
                load = decode_load(est, r.prompt_tokens + bound / 2, period)
                work = est.prefill_time(r.num_uncomputed_tokens, r.num_computed_tokens)
                forced.append((self.prefill_deadline(r, ref_step) - margin, work, load, 0))
            elif r.kind != "best-effort":
                deadline = self.prefill_deadline(r, ref_step)
                if deadline > now:
                    cands.append(r)
                    rows.append(
                        (
                            r.prompt_tokens,
                            r.num_computed_tokens,
                            r.num_output_tokens,
                            self.bound(r),
                            self.tpot(r) or ref_step,
                            deadline - margin,
                        )
                    )
                else:
                    self.declined.add(r.request_id)  # its first token can no longer be on time
        free_memory = (
            inp.limits.num_free_blocks
            + reclaimable
            - growth
            - inp.limits.admission.watermark_blocks
        )
        return PlannerInput(
            now=now,
            capacity=prefill_capacity(est, step_s),
            running_load=np.asarray(run_load, dtype=np.float64),
            running_end=np.asarray(run_end, dtype=np.float64),
            forced=PlanItems.of_rows(forced),
            candidates=self._candidate_items(rows, bs),
            free_memory=free_memory,
            free_seats=seats,
        ), cands

    def _candidate_items(
        self, rows: Sequence[tuple[int, int, int, int, float, float]], bs: int
    ) -> PlanItems:
        """Candidates' planner arrays from their (prompt, computed, outputs, bound, period,
        deadline) rows, vectorized over the estimator."""
        if not rows:
            return PlanItems.empty()
        est = self.estimator
        table = np.asarray(rows, dtype=np.float64)
        prompt, computed, outputs, bound = (table[:, k].astype(np.int64) for k in range(4))
        period, deadline = table[:, 4], table[:, 5]
        uncomputed = prompt + outputs - computed
        work = est.request_times(np.maximum(uncomputed, 2), computed)
        kv = (prompt + bound / 2).astype(np.float64)
        c = est.coefficients
        load = est.beta * (c.a_d * kv + c.b_d) / np.maximum(period, 1e-9)
        memory = -(-(prompt + bound) // bs)
        return PlanItems(deadline, work, load, memory.astype(np.int64))

    def admit(self, inp: SchedulerInput, step_s: float | None) -> Admission:
        """Run the planner and record its decisions."""
        planner_inp, cands = self.planner_input(inp, step_s)
        result = plan_admission(
            planner_inp, dp_window=self.params.dp_window, time_budget_s=self.params.planner_budget_s
        )
        for r, ok in zip(cands, result.accepted.tolist(), strict=True):
            if ok:
                self.admitted.add(r.request_id)
                self.declined.discard(r.request_id)
            else:
                self.declined.add(r.request_id)
        self._last_plan_s = inp.now
        self.last_admission = result
        return result

    # ---- the step ---------------------------------------------------------------------------

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        committed = self._state()
        plan = self._schedule(inp)
        if len(self._proposals) >= _MAX_PROPOSALS:
            self._proposals.pop(next(iter(self._proposals)))
        self._proposals[id(plan)] = (plan, self._state())
        self._restore(committed)
        return plan

    def on_step_end(self, plan: StepPlan, now: float) -> None:
        proposal = self._proposals.pop(id(plan), None)
        if proposal is not None and proposal[0] is plan:
            self._restore(proposal[1])

    def _state(self) -> _State:
        """Copies of what the decisions depend on (the memo caches of bounds and TPOTs, keyed
        by request and derived from it alone, are not part of it)."""
        return (
            set(self.admitted),
            set(self.declined),
            dict(self._anchor),
            set(self._known),
            self._last_plan_s,
            set(self._last_running),
            self._steps,
        )

    def _restore(self, state: _State) -> None:
        (
            self.admitted,
            self.declined,
            self._anchor,
            self._known,
            self._last_plan_s,
            self._last_running,
            self._steps,
        ) = (
            set(state[0]),
            set(state[1]),
            dict(state[2]),
            set(state[3]),
            state[4],
            set(state[5]),
            state[6],
        )

    def _schedule(self, inp: SchedulerInput) -> StepPlan:
        if not inp.running and not inp.waiting:
            return StepPlan()
        now = inp.now
        if self._observe(inp):
            self.admit(inp, self.planning_step_seconds(inp))
        step_s = self.step_seconds(inp)
        ref = step_s if step_s is not None else 0.1
        est = self.estimator

        guaranteed_run: list[Request] = []
        be_run: list[Request] = []
        for r in inp.running:
            if r.num_uncomputed_tokens < 1:
                continue  # nothing to compute this step (tokens in flight)
            (be_run if self.is_best_effort(r) else guaranteed_run).append(r)
        # best effort is evicted first (latest arrival first); an admitted request only when KV
        # runs out for the running ones (their length bound was too short): the latest admitted
        # first, and only by one admitted before it (``running`` is in admission order, a resumed
        # request last), as vLLM's own scheduler evicts from the tail of its running queue — the
        # least progress lost, and never the older stream for a newer one
        latest_first = sorted(inp.running, key=lambda r: -r.arrival_s)
        be_list = [r for r in latest_first if self.is_best_effort(r) and r.num_kv_blocks > 0]
        admitted_rank = {
            r.request_id: i
            for i, r in enumerate(inp.running)
            if not self.is_best_effort(r) and r.num_kv_blocks > 0
        }
        admitted_list = [r for r in reversed(inp.running) if r.request_id in admitted_rank]

        def victims() -> Iterator[Request]:  # fresh each time: the builder skips the taken ones
            return iter(be_list)

        def last_resort(request: Request | None) -> Iterator[Request]:
            """Victims for a running ``request``; None: any admitted one, from the tail."""
            if request is None:
                return chain(be_list, admitted_list)
            rank = admitted_rank.get(request.request_id, len(inp.running))
            later = (r for r in admitted_list if admitted_rank[r.request_id] > rank)
            return chain(be_list, later)

        # a decode (by its sequence: one token to compute, plus any speculative drafts)
        decodes = [r for r in guaranteed_run if is_decoding(r)]
        due = {id(r): self.decode_due(r, ref) for r in decodes}
        prefill_due: dict[int, float] = {}
        prefills = [r for r in guaranteed_run if not is_decoding(r)]
        for r in prefills:
            prefill_due[id(r)] = self.prefill_deadline(r, ref)
        held: list[Request] = []
        if self.params.hold_first_token:  # a prompt's last token, waiting for its deadline
            for r in decodes:
                if r.num_output_tokens == 0:
                    held.append(r)
            if held:
                decodes = [r for r in decodes if r.num_output_tokens > 0]
                for r in held:
                    prefill_due[id(r)] = self.prefill_deadline(r, ref)
        admitted_waiting = [r for r in inp.waiting if r.request_id in self.admitted]
        for r in admitted_waiting:
            prefill_due[id(r)] = self.prefill_deadline(r, ref)
        # due before the next step could end (steps last at most ``ref``): it goes in this one
        horizon = now + 2.0 * ref
        for r in held:
            due[id(r)] = prefill_due[id(r)]
        urgent = sorted(
            (r for r in chain(decodes, held) if due[id(r)] < horizon), key=lambda r: due[id(r)]
        )
        held = [r for r in held if due[id(r)] >= horizon]
        later = sorted((r for r in decodes if due[id(r)] >= horizon), key=lambda r: due[id(r)])

        budget_s = None
        if step_s is not None:
            kv = np.fromiter((r.num_computed_tokens for r in urgent), dtype=np.int64)
            tokens = np.fromiter((r.num_uncomputed_tokens for r in urgent), dtype=np.int64)
            urgent_s = float(est.request_times(tokens, kv).sum())
            budget_s = max(step_s, est.t_c + urgent_s * 1.001)
        builder = BatchBuilder(
            inp,
            estimator=est,
            time_budget_s=budget_s,
            min_prefill_chunk=self.params.min_chunk_tokens,
        )
        # a decode is granted all it has to compute: its token and the speculative drafts vLLM
        # verifies with it (one token alone would be a chunk that ends nothing)
        for r in urgent:
            self._grant(builder, r, r.num_uncomputed_tokens, last_resort(r))

        order = sorted(chain(prefills, admitted_waiting), key=lambda r: prefill_due[id(r)])
        for r in order:
            if builder.full:
                break
            want = r.num_uncomputed_tokens
            if (
                self.params.hold_first_token
                and r.num_output_tokens == 0
                and prefill_due[id(r)] >= horizon
            ):
                want -= 1  # hold the last prompt token (see the module docstring)
            if want > 0:
                self._grant(builder, r, want, last_resort(r) if r.num_kv_blocks else victims())
        for r in later:
            if builder.full:
                break
            self._grant(builder, r, r.num_uncomputed_tokens, iter(()))
        self._best_effort(builder, inp, be_run, victims)
        if not builder.plan.scheduled:  # nothing else to do: the held tokens, then anything
            builder.time_budget_s = None
            for r in chain(held, urgent, order, later, be_run, inp.waiting):
                if builder.is_scheduled(r) or r.num_uncomputed_tokens < 1:
                    continue
                # only a running request may evict an admitted one (KV its bound missed); the
                # step is empty otherwise, so, as in vLLM, any of them from the tail
                evict = last_resort(None) if r.num_kv_blocks else victims()
                if self._grant(builder, r, r.num_uncomputed_tokens, evict):
                    break
        plan = builder.plan
        plan.hopeless = [
            (r.request_id, DECLINED_REASON)
            for r in inp.waiting
            if r.request_id in self.declined and r.kind != "best-effort"
        ]
        plan.repeatable = all_decode_repeatable(inp, plan)
        return plan

    def _grant(
        self, builder: BatchBuilder, request: Request, want: int, victims: Iterator[Request]
    ) -> int:
        """Schedule up to ``want`` tokens of an admitted request, preempting best-effort
        requests (``victims``) when their KV or their seat is what keeps it out."""
        if builder.is_scheduled(request):
            return 0
        usable = builder.step_fit_tokens(request, want)
        if usable <= 0:
            return 0
        if request.num_kv_blocks == 0 and builder.num_seqs >= builder.max_num_seqs:
            victim = next(
                (v for v in victims if v.num_kv_blocks > 0 and not builder.is_scheduled(v)), None
            )
            if victim is None:
                return 0
            builder.preempt(victim)
        return builder.add_preempting(request, usable, victims)

    def _best_effort(
        self,
        builder: BatchBuilder,
        inp: SchedulerInput,
        be_run: Sequence[Request],
        victims: Callable[[], Iterator[Request]],
    ) -> None:
        """Leftover budget to the best-effort tier: running ones first, oldest first (they hold
        KV; one that cannot grow evicts the latest best-effort one), then the declined waiting
        ones by prefill deadline."""
        if builder.full:
            return
        for r in sorted(be_run, key=lambda r: r.arrival_s):
            if builder.full:
                return
            if builder.is_scheduled(r):
                continue
            usable = builder.step_fit_tokens(r)
            if usable > 0:
                builder.add_preempting(r, usable, victims())
        if builder.plan.preempted:
            return  # KV was short enough to evict best effort: admit none of it this step
        waiting = [
            r for r in inp.waiting if r.request_id not in self.admitted and r.num_uncomputed_tokens
        ]
        waiting.sort(key=lambda r: r.arrival_s + (r.slo.ttft_s or 0.0))
        misses = 0
        for r in waiting:
            if builder.full or misses >= 4 or builder.num_seqs >= builder.max_num_seqs:
                return
            if builder.add(r, r.num_uncomputed_tokens) <= 0:
                misses += 1
