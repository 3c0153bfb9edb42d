"""Fixtures of the engine-integration tests (the vLLM ones skip where vLLM is not installed)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    harness = pytest.importorskip("vllm_harness")
    path: Path = harness.write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
    return path


@pytest.fixture
def tiergate_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every scheduler test from the documented defaults, whatever the shell exports."""
    import os

    for key in list(os.environ):
        if key.startswith("TIERGATE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("TIERGATE_POLICY", "slide")
    monkeypatch.setenv("TIERGATE_PROFILE", "h100-llama3.1-8b")
