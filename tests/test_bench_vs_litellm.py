"""bench/vs_litellm.py: its LiteLLM config writer and pure helpers, and a short latency run
when LiteLLM's environment exists (bench/litellm/setup.sh; CI builds it in .ci/litellm.sh)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench/vs_litellm.py")


def _load_auth(directory: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_points_litellm_at_the_engine_and_its_keys_at_their_limits(
    bench: ModuleType, tmp_path: Path
) -> None:
    config = bench.LiteLLMConfig(
        "http://127.0.0.1:4321", {"sk-limited": 50, "sk-free": None}, redis_db=11
    )
    path = bench.write_litellm_config(tmp_path, config)
    document = json.loads(path.read_text())  # JSON is YAML: LiteLLM reads it as its config
    (deployment,) = document["model_list"]
    assert deployment["model_name"] == bench.go.MODEL
    assert deployment["litellm_params"]["api_base"] == "http://127.0.0.1:4321/v1"
    assert deployment["litellm_params"]["model"] == f"hosted_vllm/{bench.go.MODEL}"
    general = document["general_settings"]
    assert general["custom_auth"] == f"{bench.AUTH_MODULE}.user_api_key_auth"
    assert general["coordination_redis"] == {"host": "127.0.0.1", "port": 6379, "db": 11}
    assert general["master_key"].startswith("sk-")

    auth = _load_auth(tmp_path, bench.AUTH_MODULE)
    assert "sk-limited" not in (tmp_path / f"{bench.AUTH_MODULE}.py").read_text()  # hashed
    record = asyncio.run(auth.user_api_key_auth(None, "sk-limited"))
    token = hashlib.sha256(b"sk-limited").hexdigest()
    assert record["token"] == record["api_key"] == token == bench.key_token("sk-limited")
    assert record["rpm_limit"] == 50
    assert asyncio.run(auth.user_api_key_auth(None, "sk-free"))["rpm_limit"] is None
    with pytest.raises(ValueError):
        asyncio.run(auth.user_api_key_auth(None, "sk-unknown"))


def test_config_without_redis_keeps_limits_in_process(bench: ModuleType, tmp_path: Path) -> None:
    path = bench.write_litellm_config(tmp_path, bench.LiteLLMConfig("http://h:1", {"k": None}))
    assert "coordination_redis" not in json.loads(path.read_text())["general_settings"]


def test_burst_and_minute_edge_rows_tell_exact_from_over_the_limit(bench: ModuleType) -> None:
    from collections import Counter

    assert bench._burst_row(Counter({200: 50, 429: 150}), 50)["exact"]
    over = bench._burst_row(Counter({200: 61, 429: 138, 0: 1}), 50)
    assert (over["over_limit"], over["other"], over["exact"]) == (11, 1, False)
    # a sliding window: the first burst still counts when the second comes
    assert bench._edge_row([1, 49, 1], 50) == {
        "first": 1,
        "before_minute": 49,
        "after_minute": 1,
        "max_in_a_minute": 50,
        "exact": True,
    }
    # a window that starts afresh at the minute: twice the limit within seconds
    fixed = bench._edge_row([1, 49, 50], 50)
    assert (fixed["max_in_a_minute"], fixed["exact"]) == (99, False)


def test_latency_summary_subtracts_the_direct_path_of_the_same_run(bench: ModuleType) -> None:
    import numpy as np

    samples = []
    for i in range(100):
        for path, extra_ms in (("direct", 0.0), ("tiergate", 2.0), ("litellm", 15.0)):
            s = bench.PathSample(path != "direct", float(i), path=path)
            s.start, s.first = float(i), float(i) + (10.0 + extra_ms + i * 0.01) / 1e3
            s.gaps = [0.005]
            samples.append(s)
    failed = bench.PathSample(True, 100.0, path="litellm")
    failed.error = "HTTP 500"
    samples.append(failed)
    run = bench.LatencyRun(samples, {"tiergate": 0.3, "litellm": 2.02, "engine": 0.1}, 10.0)
    row = bench.summarize_latency(run, 30.0, np.random.default_rng(0))
    assert tuple(row)[: len(bench.REQUIRED_KEYS)] == bench.REQUIRED_KEYS
    assert row["tiergate_added_ttft_p50_ms"] == pytest.approx(2.0, abs=1e-3)
    assert row["litellm_added_ttft_p99_ms"] == pytest.approx(15.0, abs=1e-3)
    assert (row["tiergate_errors"], row["litellm_errors"], row["direct_errors"]) == (0, 1, 0)
    assert row["tiergate_cpu_ms_per_request"] == pytest.approx(3.0)
    assert row["litellm_cpu_ms_per_request"] == pytest.approx(20.0)  # the failed one counts
    assert row["path_requests"] == {"direct": 100, "tiergate": 100, "litellm": 101}


def test_without_litellm_the_bench_skips_with_a_reason(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "LITELLM_VENV", Path("/nonexistent/litellm-venv"))
    assert bench.main(["--no-setup", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "bench/litellm/setup.sh" in out["skipped"]


@pytest.mark.slow
def test_short_latency_run_serves_all_three_paths(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        bench.ensure_litellm(build=False)
    except bench.LiteLLMUnavailable as exc:
        pytest.skip(str(exc))
    argv = ["--scenario", "latency", "--rps", "6", "--duration", "4", "--warmup", "1"]
    assert bench.main([*argv, "--block", "0.5", "--no-setup", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert tuple(row)[: len(bench.REQUIRED_KEYS)] == bench.REQUIRED_KEYS
    assert row["rps"] == 6.0
    assert row["requests"] == sum(row["path_requests"].values())
    assert all(row["path_requests"][p] > 0 for p in bench.PATHS), row["path_requests"]
    assert row["tiergate_errors"] == row["litellm_errors"] == 0, row["error_kinds"]
    for key in ("tiergate_ttft_p50_ms", "litellm_ttft_p50_ms", "direct_ttft_p50_ms"):
        assert row[key] > 0
    assert row["tiergate_cpu_ms_per_request"] > 0 and row["litellm_cpu_ms_per_request"] > 0
