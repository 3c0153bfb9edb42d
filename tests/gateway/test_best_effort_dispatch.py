"""When a demoted (best-effort) request may be dispatched to a backend
(:func:`gateway.app.shedding._idle`): only to a backend with no prefill pending, none for a
while, and light decoding — so a promised request rarely lands behind a best-effort prefill."""

from __future__ import annotations

import pytest

from gateway.app.backends import Backend, BackendSpec
from gateway.app.shedding import (
    BEST_EFFORT_LOAD,
    BEST_EFFORT_REST,
    _idle,
    pending_prefill_s,
)
from priority.profiles import load_profile
from priority.request import SLO, Request
from priority.routing.base import ExternalPrefills, InstanceView

LAST_PREFILL_END_S = 100.0


def _backend(*, pending: int = 0, decoding: int = 0) -> Backend:
    profile = load_profile("a100-qwen2-7b")
    view = InstanceView(0, "b0", profile, profile.estimator())
    for i in range(pending):
        view.prefill_queue[f"r{i}"] = Request(f"r{i}", 0.0, 500, SLO(ttft_s=1.0, tpot_s=0.05))
    view.queue_updated_s = LAST_PREFILL_END_S
    view.num_decoding = decoding
    return Backend(BackendSpec("b0", "http://b0:8000", "m", profile), profile, view)


def _rest_s(backend: Backend) -> float:
    return BEST_EFFORT_REST * backend.view.estimator.t_c


def test_best_effort_waits_for_the_backend_to_rest_after_a_prefill() -> None:
    backend = _backend()
    rest = _rest_s(backend)
    assert rest > 0.0
    assert not _idle(backend, LAST_PREFILL_END_S)  # a prefill just ended: promised work flows
    assert not _idle(backend, LAST_PREFILL_END_S + 0.9 * rest)
    assert _idle(backend, LAST_PREFILL_END_S + 1.01 * rest)


def test_a_pending_prefill_keeps_best_effort_out_however_long_ago_it_came() -> None:
    backend = _backend(pending=1)
    assert not _idle(backend, LAST_PREFILL_END_S + 100 * _rest_s(backend))


def test_heavy_decoding_keeps_best_effort_out_after_the_rest() -> None:
    light = _backend(decoding=1)
    estimator = light.view.estimator
    too_many = int(BEST_EFFORT_LOAD * estimator.t_c / estimator.decode_time(0)) + 1
    heavy = _backend(decoding=too_many)
    later = LAST_PREFILL_END_S + 2 * _rest_s(light)
    assert _idle(light, later)
    assert not _idle(heavy, later)


def _others(count: int, updated_s: float) -> ExternalPrefills:
    """Another worker's queued prefills on the backend: ``count`` prompts of ~1 s of work."""
    return ExternalPrefills(count, 500 * count, 1.0 * count, count, updated_s=updated_s)


def test_another_workers_pending_prefill_keeps_best_effort_out() -> None:
    backend = _backend()
    later = LAST_PREFILL_END_S + 2 * _rest_s(backend)
    assert _idle(backend, later)
    backend.view.external_prefills = _others(1, LAST_PREFILL_END_S)
    assert not _idle(backend, later)
    # the other worker's prefill just went through: the backend rests from *its* change too
    backend.view.external_prefills = _others(0, later)
    assert not _idle(backend, later + 0.5 * _rest_s(backend))
    assert _idle(backend, later + 1.01 * _rest_s(backend))


def test_pending_prefill_work_counts_the_other_workers_queue() -> None:
    backend = _backend()
    assert pending_prefill_s(backend, LAST_PREFILL_END_S) == 0.0
    backend.view.external_prefills = _others(2, LAST_PREFILL_END_S)
    estimator = backend.view.estimator
    work = estimator.beta * 2.0 + estimator.t_c * 2
    assert pending_prefill_s(backend, LAST_PREFILL_END_S) == pytest.approx(work)
    # progress since the other worker's queue last changed is taken off, as for our own
    assert pending_prefill_s(backend, LAST_PREFILL_END_S + 0.5) == pytest.approx(work - 0.5)
    mine = _backend(pending=1)
    alone = pending_prefill_s(mine, LAST_PREFILL_END_S)
    mine.view.external_prefills = _others(2, LAST_PREFILL_END_S)
    assert pending_prefill_s(mine, LAST_PREFILL_END_S) == pytest.approx(alone + work)
