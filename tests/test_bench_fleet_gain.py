"""Smoke test of bench/fleet_gain.py on the bundled trace, and its target verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from priority.routing import ROUTER_NAMES
from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def fleet() -> ModuleType:
    return load_script("bench/fleet_gain.py")


def test_verdicts_follow_the_users_best_bands(fleet: ModuleType) -> None:
    assert fleet.verdict(1.40, 0.70) == ">= 1.35: met"
    assert fleet.verdict(1.20, 0.70) == ">= 1.35: missed by 0.15"
    assert fleet.verdict(1.20, 0.85) == ">= 1.15: met"
    assert fleet.verdict(0.98, 0.95) == ">= 0.99: missed by 0.01"
    cell = fleet.Cell(
        3.0,
        1.0,
        {
            **{f"slide · {r}": 0.7 for r in ROUTER_NAMES},
            "slide · goroute": 0.75,
            "slide · min-load": 0.72,
        },
    )
    # Min-Load below 0.8: GoRouting must be 1.1x it (0.75 / 0.72 = 1.04)
    (miss,) = fleet.goroute_verdicts(cell)
    assert miss.startswith("vs min-load 1.04 < 1.10")


def test_a_tiny_run_fills_every_pair_and_both_modes(fleet: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    md = tmp_path / "fleet.md"
    code = fleet.main(
        [
            "--trace",
            "azure_conv_20min",
            "--duration",
            "30",
            "--loads",
            "2",
            "--cluster",
            "a100-qwen2-7b,910b-qwen2-7b",
            "--rel-tol",
            "0.5",
            "--profile-error",
            "910b-qwen2-7b=1.3,a100-qwen2-7b=0.8",
            "--json",
            str(out),
            "--markdown",
            str(md),
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert [s["mode"] for s in data["scenarios"]] == ["co-located", "pd"]
    for scenario in data["scenarios"]:
        (cell,) = scenario["cells"]
        labels = set(cell["tdg"])
        for policy in ("vllm-v1", "vllm-v1-priority"):
            for router in ("round-robin", "min-load", "power-of-two", "least-predicted-ttft"):
                assert f"{policy} · {router}" in labels
        assert {f"slide · {r}" for r in ROUTER_NAMES} | {"slide · goroute[random]"} <= labels
        assert all(0.0 <= v <= 1.0 for v in cell["tdg"].values())
        rows = scenario["profile_error"]["rows"]
        assert set(rows[0]) == {"load", "exact", "scraped", "never"}
    text = md.read_text()
    assert text.count("users' best (pair)") == 2
    assert "profile error" in text
