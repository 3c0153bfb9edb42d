"""Dispatch's failover, through :func:`gateway.dataplane.dispatch.dispatch` with a fake pool:
a backend that failed the request is left out by the router's ``exclude`` (its health, which
every other request reads, is never flipped), each failure is counted once against its own
backend, and the router hears the end of every attempt it heard start."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.app.backends import Backend, ModelGroup
from gateway.app.metrics import GatewayMetrics
from gateway.app.proxy import Job
from gateway.app.upstream import UpstreamError
from gateway.dataplane.dispatch import dispatch
from gateway.errors import ApiError
from gateway.settings import Settings
from priority.request import SLO, Request, RequestMeta
from priority.routing import RouteDecision, make_router
from tests.gateway.offline_backends import offline_backends

MODEL = "m"
ANSWER = {"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 1}}


class _Response:
    status = 200

    async def read(self) -> bytes:
        return json.dumps(ANSWER).encode()

    def close(self) -> None:
        pass


class _Upstream:
    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.asked: list[str] = []

    async def post_json(self, url: str, payload: bytes) -> _Response:
        host = url.split("//", 1)[1].split(":", 1)[0]
        self.asked.append(host)
        if host in self.failing:
            raise UpstreamError("connection refused")
        return _Response()


class _Pool:
    def __init__(self, failing: set[str]) -> None:
        self.upstream = _Upstream(failing)
        self.failures: list[str] = []
        self.successes: list[str] = []

    def see_others(self, backends: Any) -> None:
        pass

    def queue_changed(self, backend: Backend) -> None:
        pass

    def record_failure(self, backend: Backend, *, counts: bool = True) -> None:
        self.failures.append(backend.name)

    def record_success(self, backend: Backend) -> None:
        self.successes.append(backend.name)


def _job(names: list[str], failing: set[str]) -> tuple[Job, _Pool, list[Any]]:
    backends = offline_backends(MODEL, *names)
    router = make_router("round-robin", [b.view for b in backends])
    seen: list[Any] = []
    route, on_dispatch, on_finish = router.route, router.on_dispatch, router.on_finish

    def spy_route(request: Request, now: float, *, exclude: frozenset[int] = frozenset()) -> Any:
        seen.append(("route", exclude, [b.view.healthy for b in backends]))
        return route(request, now, exclude=exclude)

    def spy_dispatch(request: Request, decision: RouteDecision, now: float) -> None:
        seen.append(("dispatch", decision.instance))
        on_dispatch(request, decision, now)

    def spy_finish(request: Request, decision: Any, now: float, **kw: Any) -> None:
        seen.append(("finish", decision.instance))
        on_finish(request, decision, now, **kw)

    router.route = spy_route  # type: ignore[method-assign]
    router.on_dispatch = spy_dispatch  # type: ignore[method-assign]
    router.on_finish = spy_finish  # type: ignore[method-assign]
    pool = _Pool(failing)
    state = SimpleNamespace(pool=pool, metrics=GatewayMetrics(), settings=Settings())
    identity = SimpleNamespace(
        tier_name="t", policy=SimpleNamespace(best_effort_allowed=False, weight=1.0)
    )
    job = Job(state, identity, "chat", 0.0)  # type: ignore[arg-type]
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    job.meta = RequestMeta(slo=slo, weight=1.0, tier="t", tenant="x")
    job.core = Request("r", 0.0, 100, slo)
    job.body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    job.model = MODEL
    job.group = ModelGroup(MODEL, backends, router)
    job.decision = RouteDecision(0)  # admission's pick: the first backend
    return job, pool, seen


def test_a_failed_backend_sits_out_the_retry_with_every_health_flag_untouched() -> None:
    job, pool, seen = _job(["a", "b", "c"], failing={"a"})
    response = asyncio.run(dispatch(job))
    assert response.status_code == 200
    assert pool.failures == ["a"] and pool.successes == [job.backend.name]  # type: ignore[union-attr]
    assert job.backend is not None and job.backend.name != "a" and job.attempts == 2
    routes = [entry for entry in seen if entry[0] == "route"]
    assert routes == [("route", frozenset({0}), [True, True, True])]
    assert seen[0] == ("dispatch", 0) and seen[1] == ("finish", 0)  # the failed attempt ended
    assert job.completion_tokens == 1


def test_every_backend_failing_is_503_each_counted_once_and_none_made_unhealthy() -> None:
    job, pool, seen = _job(["a", "b", "c"], failing={"a", "b", "c"})
    with pytest.raises(ApiError) as info:
        asyncio.run(dispatch(job))
    assert info.value.status == 503 and info.value.code == "upstream_unavailable"
    assert sorted(pool.failures) == ["a", "b", "c"] and pool.upstream.asked == pool.failures
    excludes = [entry[1] for entry in seen if entry[0] == "route"]
    assert excludes[0] == frozenset({0}) and len(excludes[1]) == 2 and 0 in excludes[1]
    dispatched = [entry[1] for entry in seen if entry[0] == "dispatch"]
    finished = [entry[1] for entry in seen if entry[0] == "finish"]
    assert dispatched == finished and len(dispatched) == 3
    assert all(b.view.healthy for b in job.group.backends)  # type: ignore[union-attr]
    assert job.backend is None and not job.accepted
