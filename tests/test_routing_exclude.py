"""Every registered router takes an ``exclude`` set: excluded instances sit the decision out, as
if unhealthy, for the prefill and the decode instance alike."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from priority.request import Request
from priority.routing import (
    ROUTER_NAMES,
    InstanceRole,
    InstanceView,
    NoHealthyInstanceError,
    RouteDecision,
    Router,
    make_router,
    router_plugin,
)
from tests.scripts_loader import load_script

NOW = 10.0
FLEETS = {
    "co-located, 6": {"instances": 6, "queued": 20},
    "co-located, 20 (GoRouting's arrays)": {"instances": 20, "queued": 20},
    "pd, 8": {"instances": 8, "queued": 20, "pd": True},
    "pd, 40 (GoRouting's arrays)": {"instances": 40, "queued": 10, "pd": True},
}
STREAMS = {"SLO reachable": 1e5, "SLO out of reach": 1e-3, "mixed SLOs": None}


def _bench() -> ModuleType:
    return load_script("bench/routing_scale.py")


def _fleet(name: str) -> list[InstanceView]:
    spec = FLEETS[name]
    views: list[InstanceView] = _bench().build_views(
        spec["instances"], spec["queued"], np.random.default_rng(5), pd=spec.get("pd", False)
    )
    return views


def _router(name: str, views: list[InstanceView], **params: Any) -> Router:
    if router_plugin(name).accepts("seed"):
        params.setdefault("seed", 1)
    return make_router(name, views, **params)


def _requests(ttft: float | None, n: int = 6) -> list[Request]:
    rng = np.random.default_rng(9)
    return [_bench().new_request(f"x{k}", rng, now=NOW, ttft=ttft) for k in range(n)]


@contextmanager
def _unhealthy(views: list[InstanceView], indices: frozenset[int]) -> Iterator[None]:
    for i in indices:
        views[i].healthy = False
    try:
        yield
    finally:
        for i in indices:
            views[i].healthy = True


def _as_unhealthy(
    name: str, views: list[InstanceView], request: Request, gone: frozenset[int]
) -> RouteDecision:
    """The decision a fresh router makes with ``gone`` marked unhealthy (the reference)."""
    with _unhealthy(views, gone):
        return _router(name, views).route(request, NOW)


@pytest.mark.parametrize("stream", list(STREAMS))
@pytest.mark.parametrize("fleet", list(FLEETS))
@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_excluding_the_choice_chooses_another_as_if_it_were_unhealthy(
    name: str, fleet: str, stream: str
) -> None:
    views = _fleet(fleet)
    for request in _requests(STREAMS[stream]):
        plain = _router(name, views).route(request, NOW)
        gone = frozenset({plain.instance})
        kept = _router(name, views)
        excluded = kept.route(request, NOW, exclude=gone)
        assert excluded.instance != plain.instance
        assert views[excluded.instance].role is not InstanceRole.DECODE
        twin = _router(name, views)
        with _unhealthy(views, gone):
            assert excluded == twin.route(request, NOW)
        # asked again without the set, it decides as the twin does (the same random draws)
        assert kept.route(request, NOW) == twin.route(request, NOW)


@pytest.mark.parametrize("fleet", [f for f in FLEETS if FLEETS[f].get("pd")])
@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_excluding_the_decode_instance_picks_another(name: str, fleet: str) -> None:
    views = _fleet(fleet)
    for request in _requests(None):
        plain = _router(name, views).route(request, NOW)
        assert plain.decode_instance is not None
        gone = frozenset({plain.decode_instance})
        excluded = _router(name, views).route(request, NOW, exclude=gone)
        assert excluded.decode_instance is not None
        assert excluded.decode_instance != plain.decode_instance
        assert views[excluded.decode_instance].role is InstanceRole.DECODE
        assert excluded == _as_unhealthy(name, views, request, gone)


@pytest.mark.parametrize("fleet", list(FLEETS))
@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_all_but_one_excluded_leaves_that_one(name: str, fleet: str) -> None:
    views = _fleet(fleet)
    prefill = [v.index for v in views if v.role is not InstanceRole.DECODE]
    decode = [v.index for v in views if v.role is InstanceRole.DECODE]
    left = prefill[len(prefill) // 2]
    left_decode = decode[-1] if decode else None
    gone = frozenset(prefill + decode) - {left, left_decode}
    router = _router(name, views)
    for request in _requests(None, 3):
        decision = router.route(request, NOW, exclude=gone)
        assert decision.instance == left
        assert decision.decode_instance == left_decode


@pytest.mark.parametrize("fleet", list(FLEETS))
@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_excluding_every_instance_raises(name: str, fleet: str) -> None:
    views = _fleet(fleet)
    router = _router(name, views)
    request = _requests(None, 1)[0]
    prefill = frozenset(v.index for v in views if v.role is not InstanceRole.DECODE)
    with pytest.raises(NoHealthyInstanceError):
        router.route(request, NOW, exclude=frozenset(range(len(views))))
    with pytest.raises(NoHealthyInstanceError):
        router.route(request, NOW, exclude=prefill)
    decode = frozenset(range(len(views))) - prefill
    if decode:  # PD: no decode instance left
        with pytest.raises(NoHealthyInstanceError):
            router.route(request, NOW, exclude=decode)
    # excluded and unhealthy together leave nothing either
    half = frozenset(sorted(prefill)[::2])
    with _unhealthy(views, prefill - half), pytest.raises(NoHealthyInstanceError):
        router.route(request, NOW, exclude=half)
    assert router.route(request, NOW).instance in prefill  # nothing stayed excluded


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_indices_outside_the_fleet_change_nothing(name: str) -> None:
    views = _fleet("co-located, 20 (GoRouting's arrays)")
    for request in _requests(None, 3):
        plain = _router(name, views).route(request, NOW)
        assert _router(name, views).route(request, NOW, exclude=frozenset({99, -1})) == plain
