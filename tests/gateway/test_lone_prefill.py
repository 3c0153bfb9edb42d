"""A lone request's prefill time (:func:`gateway.app.shedding.lone_prefill_s`), the one estimate
the gateway's shedding and its non-streamed first-token mark use: the profile's zero-load TTFT
while the engine has corrected nothing, scaled by the correction once it has."""

from __future__ import annotations

import pytest

from gateway.app.backends import Backend, BackendSpec
from gateway.app.shedding import lone_prefill_s
from priority.profiles import load_profile
from priority.routing.base import InstanceView


def _backend() -> Backend:
    profile = load_profile("a100-qwen2-7b")
    view = InstanceView(0, "b0", profile, profile.estimator())
    return Backend(BackendSpec("b0", "http://b0:8000", "m", profile), profile, view)


@pytest.mark.parametrize("prompt", [1, 500, 8192, 8193, 40_000])
def test_it_is_the_profiles_zero_load_ttft(prompt: int) -> None:
    backend = _backend()
    assert lone_prefill_s(backend, prompt) == pytest.approx(
        backend.profile.zero_load_ttft_s(prompt), rel=1e-12
    )


def test_the_engines_correction_scales_it() -> None:
    backend = _backend()
    alone = lone_prefill_s(backend, 3000)
    estimator = backend.view.estimator
    estimator.adopt(estimator.coefficients, 1.5)
    assert lone_prefill_s(backend, 3000) == pytest.approx(1.5 * alone, rel=1e-12)
