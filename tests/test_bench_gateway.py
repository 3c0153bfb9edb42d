"""Smoke test of bench/gateway_overhead.py: a tiny rate for ~2 s, and its pure helpers."""

from __future__ import annotations

import json
import math
from types import ModuleType

import pytest

from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench/gateway_overhead.py")


@pytest.mark.slow
def test_tiny_run_reports_the_schema_and_serves_both_paths(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bench.main(["--rps", "4", "--duration", "2", "--warmup", "0.5", "--json"])
    assert code == 0
    row = json.loads(capsys.readouterr().out)
    assert isinstance(row, dict)
    assert tuple(row)[: len(bench.REQUIRED_KEYS)] == bench.REQUIRED_KEYS
    assert row["rps"] == 4.0
    assert row["errors"] == 0, row["error_kinds"]
    assert row["requests"] == row["direct_requests"] + row["gateway_requests"]
    assert row["direct_requests"] > 0 and row["gateway_requests"] > 0
    for key in ("direct_ttft_p50_ms", "gateway_ttft_p50_ms", "gateway_itl_p50_ms"):
        assert row[key] > 0
    assert row["direct_ttft_p50_ms"] <= row["direct_ttft_p99_ms"]
    # read from the gateway's operator listener: the API port serves no /metrics
    assert row["gateway_overhead_p99_ms"] is not None and row["gateway_overhead_p99_ms"] > 0
    assert row["added_ttft_p50_ms"] == pytest.approx(
        row["gateway_ttft_p50_ms"] - row["direct_ttft_p50_ms"], abs=2e-3
    )


def test_content_events_are_told_from_role_and_control_events(bench: ModuleType) -> None:
    def chunk(delta: dict[str, str]) -> bytes:
        return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode()

    assert bench._has_content(chunk({"role": "assistant", "content": "Hi"}))
    assert not bench._has_content(chunk({"role": "assistant"}))
    assert not bench._has_content(chunk({"content": ""}))
    assert not bench._has_content(b"data: [DONE]")
    assert not bench._has_content(b'data: {"choices": [], "usage": {"prompt_tokens": 3}}')


def test_histogram_p99_uses_only_the_window_between_scrapes(bench: ModuleType) -> None:
    before = {"0.001": 100.0, "0.005": 100.0, "0.01": 100.0, "+Inf": 100.0}
    # in the window: 98 under 1 ms, 2 between 5 and 10 ms; p99 falls in the (5, 10] ms bucket
    after = {"0.001": 198.0, "0.005": 198.0, "0.01": 200.0, "+Inf": 200.0}
    assert bench._histogram_p99_ms(before, after) == pytest.approx(10.0)
    # every observation before the window: nothing to say
    assert bench._histogram_p99_ms(before, before) is None
    assert bench._histogram_p99_ms({}, {}) is None


def test_bootstrap_interval_brackets_a_known_shift(bench: ModuleType) -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    direct = rng.uniform(10.0, 30.0, 4000)
    gateway = direct + 5.0
    lo, hi = bench._bootstrap_added_p99(direct, gateway, rng)
    assert lo < 5.5 and hi > 4.5 and hi - lo < 2.0
    assert all(math.isnan(v) for v in bench._bootstrap_added_p99(direct[:1], gateway, rng))
