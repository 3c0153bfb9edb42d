"""Admission: one ordered tuple of stages, run by :func:`admit` for every generation request.

In order (authentication, 401, runs before, in ``serve``):

1. ``body`` — parse and check the body (400: nesting bounded before parsing, OpenAI's types);
2. ``slo`` — the SLO from the headers within the tier's (400);
3. ``kind`` — kind, workflow stage and sub-deadline (400/409, :mod:`gateway.app.kinds`);
4. ``conversation`` — a tool continuation's conversation stage (:mod:`gateway.app.stages`);
5. ``model`` — the model's backend group (404 ``model_not_found``);
6. ``context`` — the backends' context length (400 ``context_length_exceeded``);
7. ``length`` — the output-length prediction starts, beside admission;
8. ``core`` — the core request, judged end to end (a workflow call by its deadline);
9. ``budgets`` — the tenant's budget held (a spent budget refuses before any limit is charged);
10. ``limits`` — tenant rate limits reserved: prompt tokens plus expected output (429);
11. ``shed`` — route, predict the first token (queue wait plus the router's estimate; for a
    deadline, compound or best-effort request the last token, by its deadline) and shed a
    request it makes later than its tier allows, or queue it demoted where the tier allows
    (503 ``slo_infeasible`` / ``slo_unattainable``, :mod:`gateway.app.shedding`);
12. ``queue`` — a dispatch slot in the gain-ordered admission queue (429 ``queue_full``; 503
    ``slo_unattainable`` / ``queue_ttl``), demoted on its grant where the queue says so;
13. ``planners`` — where engines run SLOs-Serve's admission planner, each asked in turn (503
    ``slo_declined`` when all decline, or demoted: :mod:`gateway.app.slo_admission`).

Refusals come before charges, and charges before waiting: everything a stage takes (budget
hold, reservation, slot) is on the job, which ``Job.finish`` settles in ``serve``'s one
``finally`` with the request's outcome — the reservation reconciled or released, the budget
charged what the usage record costs. Stages write to the job (the request's one mutable record)
rather than return a copied context: admission runs per request on the gateway's hot path, and
what a refused stage had already taken must be visible to the ``finally`` that releases it.

The tuple is built once, at import; a stage's ``name`` labels it (the order test pins the order).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple

from gateway.dataplane.stages import body, charges, meta, model, planners, queue, shed

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.app.proxy import Job

Run = Callable[["Job", "Request"], Awaitable[None] | None]
"""A stage: reads what earlier stages left on the job, writes its own result there, refuses by
raising; returns an awaitable only when it has something to wait for."""


class Stage(NamedTuple):
    """One step of admission: its label and what it runs."""

    name: str
    run: Run


ADMISSION: tuple[Stage, ...] = (
    Stage("body", body.parse),
    Stage("slo", meta.slo),
    Stage("kind", meta.kind),
    Stage("conversation", meta.conversation),
    Stage("model", model.group),
    Stage("context", model.context),
    Stage("length", model.length),
    Stage("core", meta.core),
    Stage("budgets", charges.budgets),
    Stage("limits", charges.limits),
    Stage("shed", shed.route_and_shed),
    Stage("queue", queue.wait),
    Stage("planners", planners.ask),
)
"""Admission's stages, in the order they run."""

_RUNS: tuple[Run, ...] = tuple(stage.run for stage in ADMISSION)


async def admit(job: Job, http: Request) -> None:
    """Run admission's stages in order; the first refusal (an exception) ends it."""
    for run in _RUNS:
        pending = run(job, http)
        if pending is not None:
            await pending
