"""Real `vllm serve` engines for the tests of this folder (marker ``real_engine``).

They need the environment ``.ci/real_engine.sh`` builds; without it they skip with the reason,
except under ``CI=true``, where they fail: CI must not silently lose the real-engine suite.
"""

from __future__ import annotations

import os

import pytest

from tests.real_engine.vllm_server import missing


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = missing()
    for item in items:
        if "real_engine" not in str(item.fspath):
            continue
        item.add_marker(pytest.mark.real_engine)
        item.add_marker(pytest.mark.slow)
        if reason is None:
            continue
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            item.add_marker(pytest.mark.usefixtures("_real_engine_required"))
        else:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def _real_engine_required() -> None:
    reason = missing()
    if reason is not None:
        pytest.fail(f"CI=true: the real-engine suite must run: {reason}")
