"""One simulated engine instance: KV pool, running/waiting queues, a policy, and step timing.

The same core runs inside the discrete-event cluster simulator and, on the wall clock, behind the
gateway as an emulated engine. It owns two latency models on purpose:

* the *true* step time — the profile's coefficients (Eq. 7 with beta = 1) times a mean-1
  lognormal noise factor ``exp(sigma*Z - sigma^2/2)``;
* the *policy's* estimator (``policy.estimator``), which only sees the raw prediction and the
  real duration of each executed step (``observe``) and learns its momentum correction from them
  — and, with ``refit_every``, refits its coefficients from the steps' shapes and durations as
  the vLLM plugin does (:mod:`priority.estimator_refit`), so an engine whose true speed has
  another *shape* than its profile learns it too.

**Fast-forward.** When a plan is ``repeatable`` (an all-decode batch the policy promises to plan
again), :meth:`EngineCore.start_step` may run ``k`` decode steps at once without calling the
policy. ``k`` stops at the first step that finishes a request, before KV blocks run out, at the
caller's ``until`` time (the step that ends at or after ``until`` is the last one) and at
``max_fast_forward_steps``. Decode ``l_kv`` grows by one per step, so the noiseless durations are
an arithmetic progression; ``k`` noise factors are drawn at once. The estimator is fed each of
the ``k`` steps' observations in order and ``policy.on_step_end`` is called once per step, so a
fast-forwarded run is indistinguishable from stepping one at a time: with zero noise the token
times are bit-identical (the step time is evaluated in the same aggregated form either way).
An arrival in the middle of a fast-forward is handled by :meth:`EngineCore.interrupt`, which cuts
the run after the step in progress at that time — exactly where a step-by-step engine would next
consult the policy.
"""

from __future__ import annotations

import math
from bisect import insort
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from priority.estimator import LatencyCoefficients
from priority.estimator_refit import COEFFICIENT_NAMES, CoefficientRefit, step_features
from priority.policies.base import EngineLimits, SchedulerInput, SchedulingPolicy, StepPlan
from priority.profiles import Profile
from priority.request import Request, RequestStatus
from priority.routing.base import InstanceRole
from priority.sim.kv import KvBlockPool
from priority.sim.rules import DEFAULT_ENGINE_RULES, EngineRules
from priority.sim.stall import DEFAULT_MAX_STALLED_STEPS, StallGuard

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_MAX_FAST_FORWARD_STEPS = 4096
"""Upper bound on steps run without the policy (bounds the per-run arrays, not correctness)."""


class PolicyViolation(RuntimeError):
    """A policy returned a plan that breaks the engine contract (always a policy bug)."""


def _arrival_key(request: Request) -> float:
    return request.arrival_s


@dataclass(slots=True, eq=False)
class StepInFlight:
    """An executing step — or ``num_steps`` identical fast-forwarded decode steps."""

    plan: StepPlan
    start_s: float
    end_times: FloatArray
    """Absolute end time of each step (one entry unless fast-forwarded)."""
    raw_predicted_s: FloatArray
    """The policy estimator's raw (uncorrected) prediction of each step."""
    free_blocks_before: int
    """Free KV blocks when the step started, before its allocations."""
    free_blocks_started: int
    """Free KV blocks once the first step's allocations were made."""
    decode_kv: IntArray | None = None
    """Fast-forward only: each request's ``num_computed_tokens`` at the start."""
    decode_blocks: IntArray | None = None
    """Fast-forward only: each request's KV blocks once the first step was allocated."""
    features: FloatArray | None = None
    """With a refit: each step's :func:`~priority.estimator_refit.step_features` (one row per
    step)."""

    @property
    def num_steps(self) -> int:
        return int(self.end_times.size)

    @property
    def end_s(self) -> float:
        return float(self.end_times[-1])

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(slots=True)
class StepOutcome:
    """What a finished step produced, for the caller's router and accounting."""

    num_steps: int
    emitted: list[tuple[Request, int]] = field(default_factory=list)
    """Requests that produced output tokens, with how many (their ``token_times`` hold them)."""
    first_tokens: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    handoffs: list[Request] = field(default_factory=list)
    """Prefill-role engines only: requests that produced their first token and now leave for a
    decode instance (their KV here is already freed)."""


@dataclass(slots=True)
class EngineStats:
    steps: int = 0
    policy_calls: int = 0
    busy_s: float = 0.0
    preemptions: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    rejected: int = 0
    transfers_in: int = 0


class EngineCore:
    """A simulated engine instance driven by its caller's clock (simulated or wall)."""

    def __init__(
        self,
        profile: Profile,
        policy: SchedulingPolicy,
        *,
        noise_sigma: float = 0.0,
        rng: np.random.Generator | None = None,
        name: str = "engine",
        role: InstanceRole = InstanceRole.COLOCATED,
        fast_forward: bool = True,
        max_fast_forward_steps: int = DEFAULT_MAX_FAST_FORWARD_STEPS,
        rules: EngineRules = DEFAULT_ENGINE_RULES,
        max_stalled_steps: int | None = DEFAULT_MAX_STALLED_STEPS,
        refit_every: int = 0,
    ) -> None:
        """``max_stalled_steps``: consecutive executed steps without a token or a finish after
        which :meth:`finish_step` raises :class:`~priority.sim.stall.LivelockError` (a
        scheduler livelock; None: never). ``refit_every``: steps between refits of the policy
        estimator's coefficients (0: beta only, the simulator's default)."""
        if noise_sigma < 0 or not math.isfinite(noise_sigma):
            raise ValueError(f"noise_sigma must be finite and >= 0, got {noise_sigma}")
        if max_fast_forward_steps < 1:
            raise ValueError("max_fast_forward_steps must be >= 1")
        self.profile = profile
        self.policy = policy
        self.noise_sigma = noise_sigma
        self.rng = rng if rng is not None else np.random.default_rng()
        self.name = name
        self.role = role
        self.fast_forward = fast_forward
        self.max_fast_forward_steps = max_fast_forward_steps
        self.rules = rules
        self.refit = (
            CoefficientRefit(policy.estimator.coefficients, every=refit_every)
            if refit_every
            else None
        )
        cfg = profile.engine
        self.pool = KvBlockPool(cfg.num_kv_blocks, cfg.block_size)
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        """Requests holding no KV, in the engine's queue order: new ones in arrival order
        (a decode-role engine's transferred ones in landing order); preempted ones at the front
        when ``rules.preempted_to_front`` (vLLM), else in arrival order too."""
        self.rejected: list[Request] = []
        self.in_flight: StepInFlight | None = None
        self.stats = EngineStats()
        self._aborted: set[str] = set()
        self._stall = StallGuard(policy.name, max_stalled_steps)

    # ---- state ----------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def busy(self) -> bool:
        return self.in_flight is not None

    @property
    def num_free_blocks(self) -> int:
        return self.pool.free

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    def fits(self, request: Request) -> bool:
        """Whether ``request`` could ever run here, alone on an empty engine."""
        if self.role is InstanceRole.PREFILL:
            peak_tokens = request.prompt_tokens
        else:
            # The last sampled token never needs KV: peak computed = prompt + output - 1.
            peak_tokens = request.prompt_tokens + request.target_output_tokens - 1
        return self.pool.blocks_for(peak_tokens) <= self.pool.num_blocks

    # ---- requests in and out --------------------------------------------------------------

    def add_request(self, request: Request, now: float) -> bool:
        """Queue a new request; False (and recorded in ``rejected``) if it can never fit."""
        if not self.fits(request):
            self.rejected.append(request)
            self.stats.rejected += 1
            return False
        request.status = RequestStatus.WAITING
        insort(self.waiting, request, key=_arrival_key)
        return True

    def add_transferred(self, request: Request, now: float) -> bool:
        """Accept a request whose prompt KV arrives from a prefill instance (PD mode).

        It joins the back of the waiting queue with its computed tokens (the prompt; its first
        token is out) and no blocks: vLLM's decode side, where a KV connector's tokens count as
        computed when the scheduler admits the request, so the policy admits it like any waiting
        request, one token to compute, under the engine's admission rule (the whole sequence's
        blocks). Preempted, it recomputes here.
        """
        if not self.fits(request):
            self.rejected.append(request)
            self.stats.rejected += 1
            return False
        request.status = RequestStatus.WAITING
        self.waiting.append(request)
        self.stats.transfers_in += 1
        return True

    def abort(self, request_id: str, now: float) -> bool:
        """Drop a request wherever it is (client gone); True if it was here."""
        for queue in (self.running, self.waiting):
            for i, request in enumerate(queue):
                if request.request_id == request_id:
                    del queue[i]
                    self._retire(request, now)
                    return True
        return False

    def _retire(self, request: Request, now: float) -> None:
        self.pool.release(request)
        request.status = RequestStatus.FINISHED
        request.finished_s = now
        if self.in_flight is not None:
            self._aborted.add(request.request_id)

    # ---- stepping -------------------------------------------------------------------------

    def start_step(self, now: float, until: float = math.inf) -> StepInFlight | None:
        """Plan and launch the next step at ``now``; None if the policy schedules nothing."""
        if self.in_flight is not None:
            raise RuntimeError(f"{self.name}: a step is already in flight")
        free_before = self.pool.free
        if not (self.running or self.waiting):
            return None
        cfg = self.profile.engine
        inp = SchedulerInput(
            now=now,
            running=list(self.running),
            waiting=list(self.waiting),
            limits=EngineLimits(
                token_budget=cfg.max_num_batched_tokens,
                max_num_seqs=cfg.max_num_seqs,
                block_size=cfg.block_size,
                num_free_blocks=self.pool.free,
                admission=self.rules.admission,
            ),
        )
        plan = self.policy.schedule(inp)
        self.stats.policy_calls += 1
        if not plan.scheduled:
            if plan.preempted:
                raise PolicyViolation(f"{self.name}: plan preempts but schedules nothing")
            return None
        self._validate(plan, inp)
        self._apply_preemptions(plan)

        true_c = self.profile.coefficients
        pred_c = self.policy.estimator.coefficients
        prefill_true = prefill_pred = 0.0
        n_decode = decode_kv = 0
        all_continuing_decodes = True
        admitted: list[Request] = []
        chunks: list[tuple[int, int]] | None = [] if self.refit is not None else None
        for request, tokens in plan.scheduled:
            l_kv = request.num_computed_tokens
            if tokens == 1 and request.num_tokens - l_kv == 1:
                n_decode += 1
                decode_kv += l_kv
                if request.num_output_tokens == 0:
                    all_continuing_decodes = False  # a 1-token prompt: first token, not decode
            else:
                all_continuing_decodes = False
                prefill_true += _prefill_time(true_c, tokens, l_kv)
                prefill_pred += _prefill_time(pred_c, tokens, l_kv)
                if chunks is not None:
                    chunks.append((tokens, l_kv))
            if request.num_kv_blocks == 0:
                admitted.append(request)
            self.pool.grow(request, l_kv + tokens)
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now
        if admitted:
            self._admit(admitted)
        self.stats.decode_tokens += n_decode
        self.stats.prefill_tokens += plan.num_tokens - n_decode

        if plan.repeatable and n_decode != len(plan.scheduled):
            raise PolicyViolation(f"{self.name}: a repeatable plan must be all-decode")
        k = 1
        run_kv = run_blocks = None
        if (
            plan.repeatable
            and self.fast_forward
            and all_continuing_decodes
            and not plan.preempted
            and self.max_fast_forward_steps > 1
        ):
            k, run_kv, run_blocks = self._fast_forward_bound(plan)
        # Step j (0-based) of a decode run sees sum l_kv = decode_kv + j * n_decode.
        sum_kv = decode_kv + n_decode * np.arange(k, dtype=np.int64)
        raw_true = (true_c.t_c + prefill_true) + (true_c.a_d * sum_kv + n_decode * true_c.b_d)
        raw_pred = np.asarray(
            (pred_c.t_c + prefill_pred) + (pred_c.a_d * sum_kv + n_decode * pred_c.b_d),
            dtype=np.float64,
        )
        durations = raw_true * self._noise(k)
        ends = np.cumsum(np.concatenate(([now], durations)))[1:]
        if k > 1 and until < math.inf:
            k = min(k, int(np.searchsorted(ends, until, side="left")) + 1)
            ends, raw_pred = ends[:k], raw_pred[:k]
        step = StepInFlight(plan, now, ends, raw_pred, free_before, self.pool.free)
        if k > 1:
            step.decode_kv, step.decode_blocks = run_kv, run_blocks
        if chunks is not None:  # the decode terms of step j: sum_kv[j] and n_decode
            base = step_features(chunks, ())
            step.features = np.repeat(base[None, :], ends.size, axis=0)
            step.features[:, COEFFICIENT_NAMES.index("a_d")] = sum_kv[: ends.size]
            step.features[:, COEFFICIENT_NAMES.index("b_d")] = n_decode
        self.in_flight = step
        return step

    def _learn(self, step: StepInFlight, durations: list[float]) -> None:
        """Feed the coefficient refit (if any) the executed steps; adopt a refit when due."""
        if self.refit is None or step.features is None:
            return
        for features, real in zip(step.features, durations, strict=False):
            refitted = self.refit.observe_features(features, real)
            if refitted is not None:
                self.policy.estimator.adopt(refitted)

    def interrupt(self, now: float) -> float | None:
        """Something arrived at ``now``: cut a fast-forward after the step in progress.

        Returns the (possibly earlier) end time of the in-flight step, or None when idle.
        """
        step = self.in_flight
        if step is None:
            return None
        if step.num_steps > 1:
            k = int(np.searchsorted(step.end_times, now, side="left")) + 1
            if k < step.num_steps:
                step.end_times = step.end_times[:k]
                step.raw_predicted_s = step.raw_predicted_s[:k]
                if step.features is not None:
                    step.features = step.features[:k]
        return step.end_s

    def free_blocks_at(self, now: float) -> int:
        """Free blocks a step-by-step engine would have reported at its last step end < ``now``.

        Lets a caller keep a router's KV view exact while this engine is fast-forwarding.
        """
        step = self.in_flight
        if step is None:
            return self.pool.free
        if step.decode_kv is None or step.decode_blocks is None:
            return step.free_blocks_before
        done = int(np.searchsorted(step.end_times, now, side="left"))
        if done == 0:
            return step.free_blocks_before
        # After ``done`` decode steps each request holds ceil((computed + done) / block_size).
        held = -(-(step.decode_kv + done) // self.pool.block_size)
        return step.free_blocks_started - int((held - step.decode_blocks).sum())

    def finish_step(self, step: StepInFlight, end_time: float | None = None) -> StepOutcome:
        """Apply a completed step. ``end_time`` (default: the planned end) shifts every token
        time of the step by the same offset (a wall-clock caller passes the real end)."""
        if step is not self.in_flight:
            raise RuntimeError(f"{self.name}: finishing a step that is not in flight")
        self.in_flight = None
        ends = step.end_times
        if end_time is not None and end_time != step.end_s:
            ends = ends + (end_time - step.end_s)
        k = int(ends.size)
        end = float(ends[-1])
        plan = step.plan
        outcome = StepOutcome(num_steps=k)
        aborted = self._aborted
        done: list[Request] = []
        if k == 1:
            for request, tokens in plan.scheduled:
                if aborted and request.request_id in aborted:
                    continue
                request.num_computed_tokens += tokens
                if request.num_computed_tokens == request.num_tokens:
                    self._emit(request, end, outcome, done)
        else:
            times = ends.tolist()
            pool = self.pool
            self.stats.decode_tokens += (k - 1) * len(plan.scheduled)
            for request, _ in plan.scheduled:
                if aborted and request.request_id in aborted:
                    continue
                request.num_computed_tokens += k
                request.num_output_tokens += k
                request.tokens_since_resume += k
                request.token_times.extend(times)
                pool.grow(request, request.num_computed_tokens)
                outcome.emitted.append((request, k))
                if request.num_output_tokens >= request.target_output_tokens:
                    self._finish(request, end, outcome, done)
        aborted.clear()
        if done:
            gone = {id(r) for r in done}
            self.running = [r for r in self.running if id(r) not in gone]

        self.stats.steps += k
        self.stats.busy_s += end - step.start_s
        self._stall.step(bool(outcome.emitted or outcome.finished), self._stuck, k)
        observe = self.policy.estimator.observe
        if k == 1:
            observe(float(step.raw_predicted_s[0]), end - step.start_s)
            self._learn(step, [end - step.start_s])
            self.policy.on_step_end(plan, end)
            return outcome
        durations = np.diff(ends, prepend=step.start_s).tolist()
        for raw, real in zip(step.raw_predicted_s.tolist(), durations, strict=True):
            observe(raw, real)
        self._learn(step, durations)
        on_step_end = self.policy.on_step_end
        for t in ends.tolist():
            on_step_end(plan, t)
        return outcome

    # ---- internals ------------------------------------------------------------------------

    def _stuck(self) -> list[str]:
        """The queued requests, most preempted first (the livelock guard's report)."""
        queued = sorted(self.running + self.waiting, key=lambda r: -r.num_preemptions)
        return [
            f"{r.request_id} ({r.num_computed_tokens}/{r.num_tokens} tokens computed, "
            f"{r.num_preemptions} preemptions)"
            for r in queued
        ]

    def _emit(self, request: Request, t: float, outcome: StepOutcome, done: list[Request]) -> None:
        request.token_times.append(t)
        request.num_output_tokens += 1
        request.tokens_since_resume += 1
        outcome.emitted.append((request, 1))
        if request.num_output_tokens == 1:
            outcome.first_tokens.append(request)
        if request.num_output_tokens >= request.target_output_tokens:
            self._finish(request, t, outcome, done)
        elif self.role is InstanceRole.PREFILL:
            self.pool.release(request)
            request.status = RequestStatus.WAITING  # in transit: KV leaves with it
            outcome.handoffs.append(request)
            done.append(request)

    def _finish(
        self, request: Request, t: float, outcome: StepOutcome, done: list[Request]
    ) -> None:
        request.status = RequestStatus.FINISHED
        request.finished_s = t
        self.pool.release(request)
        outcome.finished.append(request)
        done.append(request)

    def _noise(self, k: int) -> FloatArray:
        if self.noise_sigma == 0.0:
            return np.ones(k)
        s = self.noise_sigma
        return np.exp(s * self.rng.standard_normal(k) - 0.5 * s * s)

    def _fast_forward_bound(self, plan: StepPlan) -> tuple[int, IntArray, IntArray]:
        """Steps the all-decode ``plan`` can repeat: until a finish, KV exhaustion, or the cap.

        Called after step 1's blocks are allocated; ``free`` then covers steps 2..k. Also
        returns the batch's computed tokens and held blocks (for :meth:`free_blocks_at`).
        """
        k_cap = self.max_fast_forward_steps
        computed = []
        blocks = []
        for request, _ in plan.scheduled:
            k_cap = min(k_cap, request.target_output_tokens - request.num_output_tokens)
            computed.append(request.num_computed_tokens)
            blocks.append(request.num_kv_blocks)
        c = np.asarray(computed, dtype=np.int64)
        b = np.asarray(blocks, dtype=np.int64)
        if k_cap <= 1:
            return 1, c, b
        bs = self.pool.block_size
        free = self.pool.free

        def fits(k: int) -> bool:  # step k computes token c + k - 1, needing ceil((c + k) / bs)
            return int((-(-(c + k) // bs) - b).clip(min=0).sum()) <= free

        if fits(k_cap):
            return k_cap, c, b
        lo, hi = 1, k_cap  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo, c, b

    def _admit(self, admitted: list[Request]) -> None:
        ids = {id(r) for r in admitted}
        self.waiting = [r for r in self.waiting if id(r) not in ids]
        for request in admitted:
            request.status = RequestStatus.RUNNING
            self.running.append(request)

    def _apply_preemptions(self, plan: StepPlan) -> None:
        if not plan.preempted:
            return
        ids = {id(r) for r in plan.preempted}
        self.running = [r for r in self.running if id(r) not in ids]
        for request in plan.preempted:
            self.pool.release(request)
            request.num_computed_tokens = 0
            request.status = RequestStatus.WAITING
            request.num_preemptions += 1
            request.tokens_since_resume = 0
            if self.rules.preempted_to_front:
                self.waiting.insert(0, request)  # vLLM's prepend_request, one victim at a time
            else:
                insort(self.waiting, request, key=_arrival_key)
        self.stats.preemptions += len(plan.preempted)

    def _validate(self, plan: StepPlan, inp: SchedulerInput) -> None:
        """Reject any plan that breaks the contract; a policy bug must be loud."""
        running = {id(r) for r in inp.running}
        waiting = {id(r) for r in inp.waiting}
        preempted: set[int] = set()
        freed = 0
        for request in plan.preempted:
            key = id(request)
            if key not in running or key in preempted:
                raise PolicyViolation(
                    f"{self.name}: preempted {request.request_id} is not running or repeated"
                )
            preempted.add(key)
            freed += request.num_kv_blocks
        seen: set[int] = set()
        total = needed = admitted = 0
        bs = self.pool.block_size
        for request, tokens in plan.scheduled:
            key = id(request)
            if key in seen or key in preempted:
                raise PolicyViolation(
                    f"{self.name}: {request.request_id} scheduled twice or also preempted"
                )
            seen.add(key)
            if key in waiting:
                admitted += 1
            elif key not in running:
                raise PolicyViolation(f"{self.name}: {request.request_id} is not on this engine")
            uncomputed = request.num_uncomputed_tokens
            if not isinstance(tokens, int | np.integer) or not 1 <= tokens <= uncomputed:
                raise PolicyViolation(
                    f"{self.name}: {request.request_id} scheduled {tokens!r} tokens, needs "
                    f"1..{request.num_uncomputed_tokens}"
                )
            total += tokens
            blocks = -(-(request.num_computed_tokens + tokens) // bs)
            needed += max(0, blocks - request.num_kv_blocks)
        limits = inp.limits
        if total > limits.token_budget:
            raise PolicyViolation(
                f"{self.name}: {total} tokens exceed the budget of {limits.token_budget}"
            )
        if len(inp.running) - len(preempted) + admitted > limits.max_num_seqs:
            raise PolicyViolation(f"{self.name}: more than {limits.max_num_seqs} running requests")
        if needed > self.pool.free + freed:
            raise PolicyViolation(
                f"{self.name}: plan needs {needed} KV blocks, {self.pool.free + freed} available"
            )
        if admitted:
            self._validate_admissions(plan, waiting, self.pool.free + freed)

    def _validate_admissions(self, plan: StepPlan, waiting: set[int], free: int) -> None:
        """The engine's own admission check, in its order: preemptions, then every running
        allocation, then each admission in plan order against what is left."""
        bs = self.pool.block_size
        rule = self.rules.admission
        admissions = []
        for request, tokens in plan.scheduled:
            blocks = -(-(request.num_computed_tokens + tokens) // bs)
            if id(request) in waiting:
                admissions.append((request, blocks))
            else:
                free -= max(0, blocks - request.num_kv_blocks)
        seats = len(self.running) - len(plan.preempted)
        for request, blocks in admissions:
            required = rule.required_blocks(request, blocks, bs, anything_running=seats > 0)
            if required > free:
                raise PolicyViolation(
                    f"{self.name}: the engine would refuse to admit {request.request_id} "
                    f"({required} blocks required, {free} free at its admission check)"
                )
            free -= blocks
            seats += 1


def _prefill_time(c: LatencyCoefficients, l_q: int, l_kv: int) -> float:
    """T~_p of one chunk at beta = 1 (PROSERVE Eq. 5, plus xLLM's optional ``d_p`` term)."""
    return l_q * (c.a_p * l_q + c.b_p * l_kv + c.c_p) + c.d_p * l_kv
