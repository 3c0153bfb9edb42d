"""A deliberately livelocked policy, for the livelock guards' tests (simulator and vLLM)."""

from __future__ import annotations

from priority.policies.base import SchedulerInput, SchedulingPolicy, StepPlan


class StuckPolicy(SchedulingPolicy):
    """Computes one token of a waiting prompt and, the next step, preempts it to start the
    next one: no prompt ever completes, so no token is ever emitted (needs two requests)."""

    name = "stuck"

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        plan = StepPlan()
        if inp.running:
            plan.preempted.append(inp.running[0])
        if inp.waiting:
            plan.scheduled.append((inp.waiting[0], 1))
        return plan
