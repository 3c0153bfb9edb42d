"""What the deployment files are checked against: the code's own settings, routes and names.

Shared by ``test_compose.py``, ``test_manifests.py`` and ``test_dockerfile.py``, so that a
setting renamed in ``gateway/settings.py``, a health route moved in ``gateway/app/app.py`` or a
profile dropped from ``priority/profiles/`` fails the deployment tests instead of a deployment.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose"
K8S = DEPLOY / "k8s"
OVERLAYS = ("emulated", "nvidia", "ascend")

GATEWAY_IMAGE = "tiergate/tiergate"
ENGINE_IMAGES = {
    "tiergate/vllm-tiergate": "deploy/docker/Dockerfile.vllm",
    "tiergate/vllm-ascend-tiergate": "deploy/docker/Dockerfile.vllm-ascend",
}
SCHEDULER_CLS = {
    "vllm": "engine_cuda.scheduler.TiergateScheduler",
    "vllm-ascend": "engine_ascend.scheduler.TiergateScheduler",
}
"""``--scheduler-cls`` per backend kind (docs/engines.md)."""


def project_version() -> str:
    """``pyproject.toml``'s version: every tiergate image is tagged with it."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def gateway_settings() -> set[str]:
    """Every ``TIERGATE_*`` variable the gateway reads: its settings' fields, by name."""
    from gateway.settings import Settings

    prefix = str(Settings.model_config.get("env_prefix", ""))
    return {f"{prefix}{name}".upper() for name in Settings.model_fields}


def engine_settings() -> set[str]:
    """Every ``TIERGATE_*`` variable the engine plugins read, parsed out of
    ``engine_common/settings.py`` (``f"{PREFIX}NAME"`` and ``_number(env, "NAME", ...)``)."""
    source = (ROOT / "engine_common" / "settings.py").read_text()
    tree = ast.parse(source)
    prefix = next(
        node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "PREFIX" for t in node.targets)
        and isinstance(node.value, ast.Constant)
    )
    names = set(re.findall(r"\{PREFIX\}([A-Z_]+)", source))
    names |= set(re.findall(r"_number\(env, \"([A-Z_]+)\"", source))
    return {f"{prefix}{name}" for name in names}


def route_paths(path: Path, decorator: str = "app") -> set[str]:
    """The paths of ``@<decorator>.get/post(...)`` routes in a module's source."""
    pattern = rf"@{decorator}\.(?:get|post)\(\s*\"([^\"]+)\""
    return set(re.findall(pattern, path.read_text()))


def gateway_routes() -> set[str]:
    return route_paths(ROOT / "gateway" / "app" / "app.py")


def engine_sim_routes() -> set[str]:
    return route_paths(ROOT / "engine_emulated" / "app.py")


LIVENESS = "/health/liveliness"
READINESS = "/health/readiness"
ENGINE_HEALTH = "/health"
"""The probe paths the files use; tests check each is a route of the code."""


def known_profiles() -> set[str]:
    from priority.profiles import available_profiles

    return set(available_profiles())


def backend_kinds() -> tuple[str, ...]:
    from gateway.db.models import BACKEND_KINDS

    return tuple(BACKEND_KINDS)


def metrics_port() -> int:
    """``tiergate serve``'s default operator-listener port."""
    from gateway.serve import DEFAULT_METRICS_PORT

    return DEFAULT_METRICS_PORT


@dataclass(frozen=True)
class BackendLine:
    """One line of a backends file read by ``bootstrap.sh``."""

    name: str
    url: str
    model: str
    profile: str
    kind: str

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def read_backends(path: Path) -> list[BackendLine]:
    lines = []
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        fields = raw.split()
        assert len(fields) == 5, f"{path}: {raw!r} is not `name url model profile kind`"
        lines.append(BackendLine(*fields))
    return lines


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` in an argument list."""
    for i, arg in enumerate(args[:-1]):
        if arg == name:
            return args[i + 1]
    return None


def env_assignments(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of an env file (comments and blanks skipped)."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def yamllint(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    """yamllint with ``deploy/.yamllint``, parsable output."""
    import sys

    return subprocess.run(
        [sys.executable, "-m", "yamllint", "-f", "parsable", "-c", str(DEPLOY / ".yamllint")]
        + [str(p) for p in paths],
        capture_output=True,
        text=True,
        check=False,
    )


def which(tool: str) -> str | None:
    """A tool on PATH or beside this interpreter (a virtual environment's bin/)."""
    import sys

    beside = Path(sys.executable).parent / tool
    return str(beside) if beside.is_file() else shutil.which(tool)


def in_ci() -> bool:
    import os

    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tool(tool: str, install: str) -> str:
    """The tool's path; else skip the test, or fail it under ``CI=true`` (CI must not lose a
    check silently: it installs the tool, ``install`` says how)."""
    import pytest

    found = which(tool)
    if found is None:
        reason = f"{tool} not installed ({install})"
        if in_ci():
            pytest.fail(f"{reason}; CI=true: this check must run")
        pytest.skip(reason)
    return found
