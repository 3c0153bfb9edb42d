"""GoRouting's decisions on a recorded sequence stay exactly what they were.

The router's decision cost was cut (incremental queue summaries, the per-instance estimates
vectorized); that must not change a single decision. ``test_routing_decisions.json`` holds the
decisions (instance, decode instance, expected gain, predicted TTFT, bit for bit) that GoRouting
made at commit 9a73516, before that work, on the sequences below: routing_scale's heterogeneous
fleet (queues filled, a dispatch, a first token and a KV report per decision), co-located and
PD, in both branches and both fallbacks, some instances with other routers' prefills. Re-record
(only for a deliberate change of decisions) with ``python -m tests.test_routing_decisions``, or
with GoRouting as it was at a commit: ``python -m tests.test_routing_decisions 9a73516``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from priority.gain import GainWeights
from priority.request import Request
from priority.routing import ExternalPrefills, InstanceRole, make_router
from tests.scripts_loader import load_script

RECORD = Path(__file__).with_suffix(".json")
INSTANCES, QUEUED, DECISIONS = 12, 200, 250
SCENARIOS: dict[str, dict[str, Any]] = {
    "co-located, SLO reachable": {"ttft": 1e5},
    "co-located, fallback expected-gain": {"ttft": 1e-3},
    "co-located, fallback random": {"ttft": 1e-3, "params": {"fallback": "random"}},
    "co-located, mixed SLOs": {"ttft": None},
    "co-located, mixed SLOs, no harm avoidance": {
        "ttft": None,
        "params": {"avoid_harm_on_fallback": False, "fallback": "random"},
    },
    "co-located, short queues, mixed SLOs": {"ttft": None, "queued": 6},
    "pd, mixed SLOs": {"ttft": None, "pd": True},
    "pd, short queues, mixed SLOs": {"ttft": None, "pd": True, "queued": 6},
    # 24 and 40 instances: recorded with GoRouter at 9a73516 too
    "co-located, 24 instances, mixed SLOs": {"ttft": None, "instances": 24, "queued": 80},
    "co-located, 24 instances, short queues": {"ttft": None, "instances": 24, "queued": 6},
    "co-located, 24 instances, fallback random": {
        "ttft": 1e-3,
        "instances": 24,
        "queued": 80,
        "params": {"fallback": "random"},
    },
    "pd, 24 instances, short queues": {"ttft": None, "pd": True, "instances": 24, "queued": 6},
    "pd, 40 instances, mixed SLOs": {"ttft": None, "pd": True, "instances": 40, "queued": 30},
    "pd, mixed SLOs, free-kv decode": {
        "ttft": None,
        "pd": True,
        "params": {"decode_choice": "free-kv"},
    },
}


def _bench() -> ModuleType:
    return load_script("bench/routing_scale.py")


def decisions(name: str, router_class: Any = None) -> list[list[Any]]:
    """The scenario's decisions as [instance, decode instance, expected gain, predicted TTFT]
    (``router_class``: another GoRouter, e.g. one loaded from an older commit)."""
    spec = SCENARIOS[name]
    bench = _bench()
    rng = np.random.default_rng(7)
    queued = spec.get("queued", QUEUED)
    instances = spec.get("instances", INSTANCES)
    views = bench.build_views(instances, queued, rng, pd=spec.get("pd", False))
    for view in views[::5]:
        if view.role is not InstanceRole.DECODE:  # other gateway workers' prefills
            view.external_prefills = ExternalPrefills(40, 60_000, 3.5, 60, 0.05, 11.0, 9.5)
    params = {"seed": 3, "weights": GainWeights.from_lengths(1000.0, 250.0)}
    params |= spec.get("params", {})
    router = (
        router_class(views, **params) if router_class else make_router("goroute", views, **params)
    )
    ttft = spec["ttft"]

    def make(k: int) -> Request:
        return bench.new_request(f"n{k}", rng, now=10.0, ttft=ttft)

    _, made = bench.drive(router, make, DECISIONS, rng)
    return [[d.instance, d.decode_instance, d.expected_gain, d.predicted_ttft_s] for d in made]


@pytest.fixture(scope="module")
def recorded() -> dict[str, list[list[Any]]]:
    data: dict[str, list[list[Any]]] = json.loads(RECORD.read_text())
    return data


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_decisions_identical_to_the_record(name: str, recorded: dict[str, Any]) -> None:
    want = recorded[name]
    got = decisions(name)
    assert len(got) == len(want) == DECISIONS
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a == b, f"decision {k}: now {a}, recorded {b}"
    instances = {d[0] for d in want}
    assert len(instances) > 1  # the sequence exercises the choice, not one instance


def test_the_record_covers_both_branches(recorded: dict[str, Any]) -> None:
    """Reachable SLOs give positive expected gains; the fallback streams give none."""
    assert all(d[2] > 0 for d in recorded["co-located, SLO reachable"])
    assert all(d[2] <= 0 for d in recorded["co-located, fallback expected-gain"])
    assert all(d[1] is not None for d in recorded["pd, mixed SLOs"])


if __name__ == "__main__":  # [COMMIT]: record with GoRouter as it was at COMMIT
    at = _bench().load_goroute_at(sys.argv[1]) if len(sys.argv) > 1 else None
    RECORD.write_text(json.dumps({name: decisions(name, at) for name in SCENARIOS}) + "\n")
    print(f"wrote {RECORD}", file=sys.stderr)


def test_kept_columns_follow_every_change_of_the_views() -> None:
    """The array path keeps per-instance inputs between decisions; whatever changes on the views
    (queues mutated without a callback, other routers' prefills, an estimator replaced or its
    beta corrected in place, decoding counts) a router that kept them estimates exactly as a
    fresh one does."""
    import dataclasses

    from priority.routing import GoRouter, RouteDecision

    bench = _bench()
    rng = np.random.default_rng(11)
    views = bench.build_views(20, 40, rng)
    kept = GoRouter(views, seed=1)

    def check(k: int) -> None:
        request = bench.new_request(f"c{k}", rng, now=10.0)
        now = 10.0 + 0.01 * k
        fresh = GoRouter(views, seed=1)
        assert kept.estimates(views, request, now) == fresh.estimates(views, request, now)
        assert kept.route(request, now) == fresh.route(request, now)

    check(0)
    first = next(iter(views[3].prefill_queue))
    del views[3].prefill_queue[first]  # no callback, length changes
    check(1)
    views[4].external_prefills = ExternalPrefills(5, 9_000, 0.8, 9, 0.05, 10.5, 10.0)
    check(2)
    views[5].estimator = views[5].profile.estimator()  # a scrape replaces it
    check(3)
    views[6].estimator.beta = 1.4  # corrected in place
    check(4)
    views[7].num_decoding += 50
    check(5)
    request = bench.new_request("d", rng, now=10.0)
    kept.on_dispatch(request, RouteDecision(8), 10.2)
    check(6)
    views[9].prefill_queue = dataclasses.replace(views[9]).prefill_queue  # another object
    views[9].queue_updated_s = 10.3
    check(7)
    queue = views[10].prefill_queue  # one request for another, no callback, no update time
    del queue[next(iter(queue))]
    extra = bench.new_request("e", rng, now=10.0)
    queue[extra.request_id] = extra
    check(8)


@pytest.mark.parametrize(
    ("pd", "queued", "ttft"),
    [(False, 6, None), (False, 60, None), (False, 60, 1e-3), (True, 30, None)],
)
def test_kept_state_estimates_as_a_fresh_router_does(
    pd: bool, queued: int, ttft: float | None
) -> None:
    """Decision after decision (queues and decode counts changing, the kept searches reused or
    searched again, only the changed queues read again), a router that kept its state between
    decisions estimates, and weighs the expected-gain fallback, exactly as a fresh one does."""
    from priority.routing import GoRouter
    from priority.routing.simple import prefill_candidates

    bench = _bench()
    rng = np.random.default_rng(5)
    views = bench.build_views(40 if pd else 20, queued, rng, pd=pd)
    weights = GainWeights.from_lengths(1000.0, 250.0)
    router = GoRouter(views, seed=2, weights=weights)

    def make(k: int) -> Request:
        return bench.new_request(f"a{k}", rng, now=10.0, ttft=ttft)

    driver = bench.Driver(router, make, rng)
    for k in range(120):
        request = make(10_000 + k)
        now = driver.now + 0.0005
        candidates = prefill_candidates(views)
        decode = router.route(request, now).decode_instance
        fresh = GoRouter(views, seed=2, weights=weights)
        kept = router.estimates(candidates, request, now)
        assert kept == fresh.estimates(candidates, request, now), f"decision {k}"
        gains = router.fallback_gains(candidates, request, now, decode)
        assert gains == fresh.fallback_gains(candidates, request, now, decode), f"decision {k}"
        driver.step()
