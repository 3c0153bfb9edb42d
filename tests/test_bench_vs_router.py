"""bench/vs_router.py: its summary, its skip without vLLM's router, and a short run when the
router's environment exists (the bench builds it; CI does in .ci/vllm_router.sh)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench/vs_router.py")


def test_the_summary_leads_with_the_cpu_ratio_of_the_same_run(bench: ModuleType) -> None:
    samples = []
    for i in range(100):
        for path, extra_ms in (("direct", 0.0), ("tiergate", 2.0), ("router", 0.5)):
            s = bench.alt.PathSample(path != "direct", float(i), path=path)
            s.start, s.first = float(i), float(i) + (10.0 + extra_ms + i * 0.01) / 1e3
            s.gaps = [0.005]
            samples.append(s)
    failed = bench.alt.PathSample(True, 100.0, path="tiergate")
    failed.error = "HTTP 503"
    samples.append(failed)
    cpu = {"tiergate": 0.202, "router": 0.1, "engine": 0.3}
    run = bench.alt.AlternatingRun(samples, cpu, 10.0)
    row = bench.summarize(run, 200.0, np.random.default_rng(0))
    assert tuple(row)[: len(bench.REQUIRED_KEYS)] == bench.REQUIRED_KEYS
    assert row["tiergate_cpu_ms_per_request"] == pytest.approx(2.0)  # the failed one counts
    assert row["router_cpu_ms_per_request"] == pytest.approx(1.0)
    assert row["cpu_ratio"] == pytest.approx(2.0)
    assert row["tiergate_added_ttft_p99_ms"] == pytest.approx(2.0, abs=1e-3)
    assert row["router_added_ttft_p99_ms"] == pytest.approx(0.5, abs=1e-3)
    assert row["added_ttft_p99_difference_ms"] == pytest.approx(1.5, abs=1e-3)
    assert (row["tiergate_errors"], row["router_errors"]) == (1, 0)
    assert row["path_requests"] == {"direct": 100, "tiergate": 101, "router": 100}


def test_without_the_router_the_bench_skips_with_a_reason(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "ROUTER_VENV", Path("/nonexistent/vllm-router-venv"))
    assert bench.main(["--no-setup", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "--no-setup" in out["skipped"]


@pytest.mark.slow
def test_a_short_run_serves_all_three_paths(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        bench.ensure_router(build=False)
    except bench.RouterUnavailable as exc:
        pytest.skip(str(exc))
    argv = ["--rates", "8", "--duration", "4", "--warmup", "1", "--block", "0.5"]
    assert bench.main([*argv, "--no-setup", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert tuple(row)[: len(bench.REQUIRED_KEYS)] == bench.REQUIRED_KEYS
    assert row["requests"] == sum(row["path_requests"].values())
    assert all(n > 0 for n in row["path_requests"].values()), row["path_requests"]
    assert row["tiergate_errors"] == row["router_errors"] == 0, row["error_kinds"]
    assert row["tiergate_cpu_ms_per_request"] > 0 and row["router_cpu_ms_per_request"] > 0
    assert row["cpu_ratio"] > 0
