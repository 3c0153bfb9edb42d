"""Versioned latency profiles: one per (hardware, model, tensor-parallel degree).

A profile is a JSON file in ``priority/profiles/data/`` holding the fitted estimator
coefficients, the engine limits of that deployment (KV capacity, token budget, max sequences)
and its provenance (measured where and how, or derived from which specification numbers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from priority.estimator import (
    DEFAULT_THETA,
    DEFAULT_WINDOW,
    BatchLatencyEstimator,
    LatencyCoefficients,
)

DATA_PACKAGE = "priority.profiles.data"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine limits of the deployment a profile describes (vLLM's names)."""

    block_size: int = 16
    num_kv_blocks: int = 8192
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_blocks", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    hardware: str
    model: str
    tensor_parallel: int
    coefficients: LatencyCoefficients
    engine: EngineConfig = EngineConfig()
    provenance: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)

    def estimator(
        self, *, theta: float = DEFAULT_THETA, window: int = DEFAULT_WINDOW
    ) -> BatchLatencyEstimator:
        return BatchLatencyEstimator(self.coefficients, theta=theta, window=window)

    def zero_load_ttft_s(self, prompt_tokens: int) -> float:
        """Time to prefill a prompt alone, chunked at the engine's token budget, plus overheads."""
        est = self.estimator()
        budget = self.engine.max_num_batched_tokens
        total, done = 0.0, 0
        while done < prompt_tokens:
            chunk = min(budget, prompt_tokens - done)
            total += est.batch_time(prefill=[(chunk, done)])
            done += chunk
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hardware": self.hardware,
            "model": self.model,
            "tensor_parallel": self.tensor_parallel,
            "coefficients": self.coefficients.to_dict(),
            "engine": {
                "block_size": self.engine.block_size,
                "num_kv_blocks": self.engine.num_kv_blocks,
                "max_num_batched_tokens": self.engine.max_num_batched_tokens,
                "max_num_seqs": self.engine.max_num_seqs,
            },
            "provenance": self.provenance,
            "fit": self.fit,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        try:
            return cls(
                name=str(data["name"]),
                hardware=str(data["hardware"]),
                model=str(data["model"]),
                tensor_parallel=int(data.get("tensor_parallel", 1)),
                coefficients=LatencyCoefficients.from_dict(data["coefficients"]),
                engine=EngineConfig(**data.get("engine", {})),
                provenance=dict(data.get("provenance", {})),
                fit=dict(data.get("fit", {})),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed profile: {exc}") from exc

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")


def available_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    files = resources.files(DATA_PACKAGE).iterdir()
    return sorted(f.name.removesuffix(".json") for f in files if f.name.endswith(".json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (e.g. ``a100-qwen2-7b``) or a profile JSON file by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        return Profile.from_dict(json.loads(path.read_text()))
    name = str(name_or_path)
    resource = resources.files(DATA_PACKAGE).joinpath(f"{name}.json")
    if not resource.is_file():
        known = ", ".join(available_profiles()) or "none"
        raise KeyError(f"unknown profile {name!r}; known profiles: {known}")
    return Profile.from_dict(json.loads(resource.read_text()))
