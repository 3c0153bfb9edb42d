"""On a real Ascend NPU: calibrate a profile, and run our scheduler on vllm-ascend's patched base.

Skipped (with the reason) unless ``torch_npu`` imports and sees an NPU. On a 910B host:

    pip install -e . && pip install torch-npu==2.10.* vllm-ascend==0.23.*
    pytest -m npu -rP tests/engines/test_npu.py

``-rP`` prints what the tests measured (the profile's held-out MAPE and coefficients).
``TIERGATE_TEST_NPU_DEVICE`` picks another NPU than ``npu:0``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest


def _npu_missing() -> str | None:
    """Why the NPU tests cannot run here, or None when they can."""
    try:
        import torch_npu
    except Exception as exc:  # ImportError, or a CANN toolkit that does not load
        return f"torch_npu is not importable ({type(exc).__name__}: {exc})"
    if not torch_npu.npu.is_available():  # torch_npu.npu is torch.npu once imported
        return "torch_npu is installed but sees no NPU (`npu-smi info`)"
    return None


_MISSING = _npu_missing()
pytestmark = [
    pytest.mark.npu,
    pytest.mark.skipif(_MISSING is not None, reason=f"needs an Ascend NPU: {_MISSING}"),
]

DEVICE = os.environ.get("TIERGATE_TEST_NPU_DEVICE", "npu:0")
MODEL, LAYERS = "qwen2-7b", 4
"""Qwen2-7B's real layer shapes, 4 of its 28 layers: GEMMs as large as served, quick to build."""


# ---- calibration: the operator's two commands ---------------------------------------------------


@pytest.mark.slow
def test_profile_and_fit_on_the_npu(tmp_path: Path, record_property: Any) -> None:
    from typer.testing import CliRunner

    from engine_ascend import profile_batches_npu as npb
    from engine_common.profiling import batch_grid
    from priority.cli import app
    from priority.profiles import load_profile
    from priority.profiles.table import read_rows

    table, fitted = tmp_path / "910b.csv", tmp_path / "910b.json"
    npb.main(
        [
            "--model",
            MODEL,
            "--layers",
            str(LAYERS),
            "--device",
            DEVICE,
            "--grid",
            "small",
            "-o",
            str(table),
        ]
    )
    rows = read_rows(table)
    assert [(r.prefill, r.decode_kv) for r in rows] == batch_grid("small")
    assert {(r.meta["dtype"], r.meta["source"]) for r in rows} == {("bfloat16", npb.SOURCE)}
    assert all(r.meta["torch_npu"] and r.meta["device"] != "cpu" for r in rows)

    result = CliRunner().invoke(
        app,
        [
            "profile",
            "fit",
            str(table),
            "-o",
            str(fitted),
            "--hardware",
            "ascend-910b",
            "--model",
            f"{MODEL} ({LAYERS} layers)",
        ],
    )
    assert result.exit_code == 0, result.output
    profile = load_profile(fitted)
    c = profile.coefficients
    report = {
        "device": rows[0].meta["device"],
        "torch_npu": rows[0].meta["torch_npu"],
        "heldout_mape": profile.fit["heldout_mape"],
        "all_rows_mape": profile.fit["all_rows_mape"],
        "coefficients": c.to_dict(),
    }
    print(json.dumps(report, indent=2))  # what the operator runs this for
    for key, value in report.items():
        record_property(key, value)
    assert all(v >= 0 for v in c.to_dict().values())
    # a step has a fixed cost, and a chunk's compute grows with its tokens (NNLS may put that
    # growth in the linear or the quadratic prefill term)
    assert c.t_c > 0 and c.c_p + c.a_p > 0
    est = profile.estimator()
    assert est.batch_time(prefill=[(512, 0)]) > est.batch_time(prefill=[(16, 0)])


# ---- the scheduler on vllm-ascend's Scheduler ----------------------------------------------------


def _ascend_config(model_dir: Path, *, async_scheduling: bool) -> Any:
    """vllm_harness.make_config, but on the current (Ascend) platform's device."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    model = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=4096
    )
    scheduler = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=4096,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=async_scheduling,
    )
    config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler,
        cache_config=CacheConfig(block_size=128, enable_prefix_caching=False),
        device_config=DeviceConfig(),  # "auto": the NPU platform vllm-ascend registers
    )
    config.cache_config.num_gpu_blocks = 64
    config.scheduler_config.async_scheduling = async_scheduling
    return config


@pytest.mark.usefixtures("tiergate_env")
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_scheduler_runs_on_the_vllm_ascend_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_scheduling: bool
) -> None:
    pytest.importorskip("vllm_ascend", reason="vllm-ascend is not installed")
    from vllm_ascend.utils import adapt_patch

    adapt_patch(is_global_patch=True)  # vllm-ascend's platform patches, as `vllm serve` applies
    import importlib

    harness = pytest.importorskip("vllm_harness")
    from engine_ascend.scheduler import TiergateScheduler
    from engine_common import compat
    from priority.profiles import load_profile

    monkeypatch.delenv("TIERGATE_PROFILE")  # the Ascend default profile
    config = _ascend_config(
        harness.write_tiny_model(tmp_path / "tiny"), async_scheduling=async_scheduling
    )
    scheduler = harness.make_scheduler(TiergateScheduler, config)
    patched = importlib.import_module(compat.SCHEDULER_MODULE).Scheduler
    # the class as vllm-ascend left it, resolved when vLLM constructs the scheduler
    assert issubclass(type(scheduler), patched)
    assert issubclass(type(scheduler), compat.resolve_base(config))
    assert scheduler.tiergate.settings.profile.name == "910b-qwen2-7b"
    if async_scheduling:
        return  # run_trace drives a synchronous scheduler

    clock = harness.FakeClock(1000.0)
    scheduler.tiergate.clock = clock
    arrivals = [
        harness.Arrival(
            1000.0 + 0.01 * i,
            f"r{i}",
            100 + 150 * i,
            6,
            {
                "tiergate_weight": 2.0 if i % 2 else 1.0,
                "tiergate_ttft_ms": 500,
                "tiergate_tpot_ms": 50,
            },
        )
        for i in range(6)
    ]
    profile = load_profile("910b-qwen2-7b")
    trace = harness.run_trace(scheduler, arrivals, profile.coefficients, clock)
    for a in arrivals:
        assert len(trace.token_times[a.request_id]) == a.max_tokens
    assert all(sum(batch.values()) <= 512 and len(batch) <= 8 for batch in trace.batches)
    assert scheduler.tiergate.state.steps > 0
    assert scheduler.tiergate.state.plan_deviations == 0
    assert scheduler.get_request_counts() == (0, 0)
