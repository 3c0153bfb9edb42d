"""A request retried elsewhere asks its router to leave the backends that failed it out
(``Job.route``'s ``exclude``) — and no other request sees those backends as unhealthy
meanwhile: their ``InstanceView.healthy`` is never touched."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gateway.app.backends import ModelGroup
from gateway.app.metrics import GatewayMetrics
from gateway.app.proxy import Job
from gateway.errors import ApiError
from priority.request import SLO, Request
from priority.routing import RouteDecision, make_router
from tests.gateway.offline_backends import offline_backends

MODEL = "m"


class _Pool:
    def see_others(self, backends: Any) -> None:
        pass


def _job(names: list[str]) -> tuple[Job, list[tuple[frozenset[int], list[bool]]]]:
    backends = offline_backends(MODEL, *names)
    router = make_router("round-robin", [b.view for b in backends])
    seen: list[tuple[frozenset[int], list[bool]]] = []
    route = router.route

    def spy(
        request: Request, now: float, *, exclude: frozenset[int] = frozenset()
    ) -> RouteDecision:
        seen.append((exclude, [b.view.healthy for b in backends]))
        return route(request, now, exclude=exclude)

    router.route = spy  # type: ignore[method-assign]
    job = Job.__new__(Job)
    job.state = SimpleNamespace(pool=_Pool(), metrics=GatewayMetrics())  # type: ignore[assignment]
    job.group = ModelGroup(MODEL, backends, router)
    job.core = Request("r", 0.0, 100, SLO(ttft_s=1.0, tpot_s=0.05))
    job.model = MODEL
    return job, seen


def test_the_failed_backends_sit_out_without_their_health_flipped() -> None:
    job, seen = _job(["a", "b", "c"])
    for _ in range(6):
        decision = job.route(0.0, frozenset({"a", "c"}))
        assert decision.instance == 1
    assert all(exclude == frozenset({0, 2}) for exclude, _ in seen)
    assert all(healthy == [True, True, True] for _, healthy in seen)


def test_no_backend_left_is_503_and_every_one_stays_healthy() -> None:
    job, seen = _job(["a", "b"])
    with pytest.raises(ApiError) as info:
        job.route(0.0, frozenset({"a", "b"}))
    assert info.value.status == 503 and info.value.code == "no_healthy_backend"
    assert seen == [(frozenset({0, 1}), [True, True])]
    assert all(b.view.healthy for b in job.group.backends)  # type: ignore[union-attr]
