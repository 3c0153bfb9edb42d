"""SLOs-Serve's admission planner: which new requests can still meet their SLOs (pure numbers).

The engine's time is a budget that grows at ``capacity`` engine-seconds per second (what a batch
sized to the tightest TPOT leaves after its fixed cost). Every admitted request draws on it
twice: its prefill (``work`` engine-seconds, due by its prefill deadline) and, from that
deadline on, its decode (``load`` engine-seconds per second: one decode step per TPOT). The
running decodes draw their load until their predicted end. A set of requests is *feasible* when,
at every prefill deadline, the budget accrued so far covers every prefill due by then plus the
decodes so far (SLOs-Serve §3.2's "demand line below the budget line"), and the decodes admitted
stay sustainable after the last deadline; and when their KV blocks at the predicted length bound
fit the free memory and their number the free seats.

**The DP** (SLOs-Serve Eq. 5 / Appendix C, the request-count objective): items in prefill-deadline
order; for every count ``n`` of admitted candidates the state keeps the best partial plan (the
most budget left at the horizon, SLOs-Serve's ``pb``) with its memory, its decode load and its
committed work. A candidate is admitted from state ``n - 1`` if the budget at its deadline covers
its prefill; *forced* items (requests already admitted: running, or admitted earlier and not yet
prefilled) are added to every state, and a state whose new admissions would make a forced item
late that is on time without them is dropped. The answer is the largest feasible ``n``.
Keeping one plan per count (the paper's state also indexes memory and budget) is what fits the
time budget; the memory and decode load then ride along with the kept plan, so with memory
binding or unequal decode loads the DP is a heuristic, not the exact optimum.

**Time budget and fallback.** The DP looks at the ``dp_window`` candidates with the earliest
deadlines; past that, or once ``time_budget_s`` is spent (checked every few candidates), the best
state so far is kept and the remaining candidates are admitted *greedily in deadline order*
(admit if the budget still covers it now and at every later forced deadline). Greedy EDF is the
classic fallback: linear in the queue, exact when no admission ever has to be undone. The result
says which method decided (``"dp"``, ``"dp+greedy"``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

EPS = 1e-9
"""Tolerance on budget comparisons (engine-seconds): exact fits must not fail on rounding."""
NO_DEADLINE_S = 1e6
"""Where an item without a deadline is placed (after every real one)."""
DEFAULT_DP_WINDOW = 24
DEFAULT_TIME_BUDGET_S = 1e-3
_CHECK_EVERY = 8
"""Candidates between two reads of the clock in the DP."""


@dataclass(frozen=True, slots=True)
class PlanItems:
    """Requests as the planner sees them (parallel arrays)."""

    deadline: FloatArray
    """Absolute prefill deadline (seconds)."""
    work: FloatArray
    """Prefill still to compute (engine-seconds, shared estimator)."""
    load: FloatArray
    """Decode load once prefilled: engine-seconds per second (decode step / TPOT)."""
    memory: IntArray
    """KV blocks still to allocate up to the predicted length bound."""

    def __post_init__(self) -> None:
        n = self.deadline.size
        if not (self.work.size == self.load.size == self.memory.size == n):
            raise ValueError("plan item arrays must have the same length")

    @classmethod
    def empty(cls) -> PlanItems:
        return cls(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64))

    @classmethod
    def of_rows(cls, rows: Sequence[tuple[float, float, float, int]]) -> PlanItems:
        """Items from ``(deadline, work, load, memory)`` rows, one per request: how the engine's
        policy and the gateway's admission both list what they have already admitted."""
        if not rows:
            return cls.empty()
        deadline, work, load, memory = zip(*rows, strict=True)
        return cls(
            np.asarray(deadline, dtype=np.float64),
            np.asarray(work, dtype=np.float64),
            np.asarray(load, dtype=np.float64),
            np.asarray(memory, dtype=np.int64),
        )

    def __len__(self) -> int:
        return int(self.deadline.size)


@dataclass(frozen=True, slots=True)
class PlannerInput:
    now: float
    capacity: float
    """Engine-seconds of work the engine does per second (1 minus the batches' fixed cost)."""
    running_load: FloatArray
    """Decode load of every running (admitted) decode."""
    running_end: FloatArray
    """Absolute time each running decode is predicted to finish."""
    forced: PlanItems
    """Admitted requests whose prefill is not done: always kept."""
    candidates: PlanItems
    """New requests to admit or decline."""
    free_memory: int
    """KV blocks the candidates may take (free blocks less the admitted requests' growth)."""
    free_seats: int


@dataclass(frozen=True, slots=True)
class Admission:
    accepted: BoolArray
    """Per candidate: admitted."""
    method: str
    """``"dp"`` or ``"dp+greedy"`` (window or time budget reached)."""
    elapsed_s: float


def _running_work(now: float, load: FloatArray, end: FloatArray, at: FloatArray) -> FloatArray:
    """Engine-seconds the running decodes take between ``now`` and each time in ``at``."""
    if load.size == 0:
        return np.zeros(at.size)
    order = np.argsort(end, kind="stable")
    ends = np.maximum(end[order] - now, 0.0)
    loads = load[order]
    done = np.concatenate(([0.0], np.cumsum(loads * ends)))  # of the decodes ended by then
    live = np.concatenate((np.cumsum(loads[::-1])[::-1], [0.0]))  # of the ones still going
    span = np.maximum(at - now, 0.0)
    k = np.searchsorted(ends, span, side="right")
    work: FloatArray = done[k] + live[k] * span
    return work


def _running_rate(now: float, load: FloatArray, end: FloatArray, at: float) -> float:
    """Decode load still running at time ``at``."""
    return float(load[end > at].sum()) if load.size else 0.0


def plan_admission(
    inp: PlannerInput,
    *,
    dp_window: int = DEFAULT_DP_WINDOW,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
) -> Admission:
    """Admit the most candidates whose SLOs stay attainable together with the forced items."""
    started = time.perf_counter()
    cand, forced = inp.candidates, inp.forced
    nc, nf = len(cand), len(forced)
    accepted = np.zeros(nc, dtype=bool)
    if nc == 0 or inp.free_seats <= 0:
        return Admission(accepted, "dp", time.perf_counter() - started)

    # all items in deadline order (forced first on ties: they are ahead in the queue)
    deadline = np.concatenate((forced.deadline, cand.deadline))
    is_forced = np.concatenate((np.ones(nf, dtype=bool), np.zeros(nc, dtype=bool)))
    order = np.lexsort((~is_forced, deadline))
    deadline = np.maximum(deadline[order], inp.now)
    deadline = np.where(np.isfinite(deadline), deadline, inp.now + NO_DEADLINE_S)
    work = np.concatenate((forced.work, cand.work))[order]
    load = np.concatenate((forced.load, cand.load))[order]
    memory = np.concatenate((forced.memory, cand.memory))[order]
    forced_mask = is_forced[order]
    index = np.concatenate((np.full(nf, -1), np.arange(nc)))[order]

    # the budget line: capacity accrued minus the running decodes, at each deadline
    budget = inp.capacity * (deadline - inp.now) - _running_work(
        inp.now, inp.running_load, inp.running_end, deadline
    )
    # a candidate that does not fit even with no other admission is declined here, in one pass
    forced_load = np.where(forced_mask, load, 0.0)
    base = (
        budget
        - np.cumsum(np.where(forced_mask, work - forced_load * deadline, 0.0))
        - np.cumsum(forced_load) * deadline
    )
    keep = forced_mask | ((base - work >= -EPS) & (memory <= inp.free_memory))
    if not keep.all():
        deadline, budget, work, load = deadline[keep], budget[keep], work[keep], load[keep]
        memory, forced_mask, index = memory[keep], forced_mask[keep], index[keep]
    if forced_mask.all():
        return Admission(accepted, "dp", time.perf_counter() - started)
    horizon = float(deadline[-1])
    budget_h = float(budget[-1])
    spare_rate = inp.capacity - _running_rate(inp.now, inp.running_load, inp.running_end, horizon)

    size = min(nc, inp.free_seats, max(dp_window, 0)) + 1
    # state n: committed (work minus load x deadline), decode rate, memory, valid
    committed = np.zeros(size)
    rate = np.zeros(size)
    mem = np.zeros(size, dtype=np.int64)
    valid = np.zeros(size, dtype=bool)
    valid[0] = True
    took: list[tuple[int, BoolArray]] = []  # (candidate, states that admitted it)
    seen = 0
    method = "dp"
    pos = 0
    n_items = deadline.size
    while pos < n_items:
        d, b = float(deadline[pos]), float(budget[pos])
        if forced_mask[pos]:
            committed += work[pos] - load[pos] * d
            rate += load[pos]
            slack = b - committed - rate * d
            floor = min(0.0, float(slack[0]))
            valid &= slack >= floor - EPS
            valid[0] = True
            pos += 1
            continue
        if seen >= size - 1 or (
            seen % _CHECK_EVERY == 0 and time.perf_counter() - started > time_budget_s
        ):
            method = "dp+greedy"
            break
        seen += 1
        slack = b - committed - rate * d
        valid &= slack >= min(0.0, float(slack[0])) - EPS
        valid[0] = True
        w, ell, m = float(work[pos]), float(load[pos]), int(memory[pos])
        new_slack = slack[:-1] - w
        new_committed = committed[:-1] + (w - ell * d)
        new_rate = rate[:-1] + ell
        new_mem = mem[:-1] + m
        ok = valid[:-1] & (new_slack >= -EPS) & (new_mem <= inp.free_memory)
        ok &= new_rate <= spare_rate + EPS
        key_new = budget_h - new_committed - new_rate * horizon
        key_old = budget_h - committed[1:] - rate[1:] * horizon
        better = ok & (~valid[1:] | (key_new > key_old))
        if better.any():
            committed[1:] = np.where(better, new_committed, committed[1:])
            rate[1:] = np.where(better, new_rate, rate[1:])
            mem[1:] = np.where(better, new_mem, mem[1:])
            valid[1:] |= better
            took.append((int(index[pos]), np.concatenate(([False], better))))
        pos += 1

    if pos < n_items:  # the DP stopped early: its states must keep the later forced ones on time
        c_later, r_later = committed.copy(), rate.copy()
        for k in np.flatnonzero(forced_mask[pos:]).tolist():
            at = pos + k
            d = float(deadline[at])
            c_later += work[at] - load[at] * d
            r_later += load[at]
            slack = budget[at] - c_later - r_later * d
            valid &= slack >= min(0.0, float(slack[0])) - EPS
            valid[0] = True
    # the best state: the most admissions (each count keeps its best plan)
    best = int(np.flatnonzero(valid)[-1])
    n = best
    for cand_index, better in reversed(took):
        if n > 0 and better[n]:
            accepted[cand_index] = True
            n -= 1

    if pos < n_items:  # greedy EDF over the rest, from the best state
        _greedy(
            inp,
            accepted,
            deadline[pos:],
            budget[pos:],
            work[pos:],
            load[pos:],
            memory[pos:],
            forced_mask[pos:],
            index[pos:],
            committed=float(committed[best]),
            rate=float(rate[best]),
            base=(float(committed[0]), float(rate[0])),
            mem=int(mem[best]),
            admitted=best,
            spare_rate=spare_rate,
        )
    return Admission(accepted, method, time.perf_counter() - started)


def _greedy(
    inp: PlannerInput,
    accepted: BoolArray,
    deadline: FloatArray,
    budget: FloatArray,
    work: FloatArray,
    load: FloatArray,
    memory: IntArray,
    forced_mask: BoolArray,
    index: IntArray,
    *,
    committed: float,
    rate: float,
    mem: int,
    admitted: int,
    spare_rate: float,
    base: tuple[float, float],
) -> None:
    """Admit the remaining candidates in deadline order while everything stays on time
    (``base``: committed work and rate of the plan without new admissions, whose lateness at a
    forced item — if any — is the most an admission may leave there)."""
    forced_at = np.flatnonzero(forced_mask)
    # slack of every later forced item under the plan so far (admissions lower it)
    forced_slack: list[float] = []
    forced_d: list[float] = []
    floors: list[float] = []
    c, r = committed, rate
    c0, r0 = base
    for k in forced_at.tolist():
        d = float(deadline[k])
        c += float(work[k]) - float(load[k]) * d
        r += float(load[k])
        c0 += float(work[k]) - float(load[k]) * d
        r0 += float(load[k])
        forced_slack.append(float(budget[k]) - c - r * d)
        forced_d.append(d)
        floors.append(min(0.0, float(budget[k]) - c0 - r0 * d))
    nxt = 0  # first forced item not passed yet
    seats = inp.free_seats
    free_memory = inp.free_memory
    dl, bl, wl, ll = deadline.tolist(), budget.tolist(), work.tolist(), load.tolist()
    ml, il = memory.tolist(), index.tolist()
    for k, is_forced in enumerate(forced_mask.tolist()):
        d = dl[k]
        if is_forced:
            committed += wl[k] - ll[k] * d
            rate += ll[k]
            nxt += 1
            continue
        if admitted >= seats:
            break
        w, ell, m = wl[k], ll[k], ml[k]
        if mem + m > free_memory or rate + ell > spare_rate + EPS:
            continue
        if bl[k] - committed - rate * d - w < -EPS:
            continue
        if any(
            forced_slack[j] - w - ell * (forced_d[j] - d) < floors[j] - EPS
            for j in range(nxt, len(forced_slack))
        ):
            continue
        for j in range(nxt, len(forced_slack)):
            forced_slack[j] -= w + ell * (forced_d[j] - d)
        committed += w - ell * d
        rate += ell
        mem += m
        admitted += 1
        accepted[il[k]] = True
