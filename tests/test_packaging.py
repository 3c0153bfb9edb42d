"""Packaging and the set-up commands: ``pip install -e .`` without setuptools warnings, and a
``make run`` that installs only when ``pyproject.toml`` changed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
import warnings
from pathlib import Path

import pytest
from setuptools import find_namespace_packages
from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_applies_without_setuptools_warnings() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message).splitlines()[0] for w in caught] == []


def test_every_directory_of_python_files_is_a_listed_package() -> None:
    """What setuptools' build_py warns about: a directory of ``.py`` files inside a shipped
    package that the ``packages`` configuration leaves out."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = config["packages"]["find"]["include"]
    packages = set(find_namespace_packages(where=str(ROOT), include=include))
    roots = {p for p in packages if "." not in p}
    holding_code = {
        ".".join(d.relative_to(ROOT).parts)
        for root in roots
        for d in [ROOT / root, *(ROOT / root).rglob("*")]
        if d.is_dir() and "__pycache__" not in d.parts and any(d.glob("*.py"))
    }
    assert holding_code - packages == set()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_installs_only_when_pyproject_changed(tmp_path: Path) -> None:
    """``make install`` (what ``make run`` needs) runs pip once, then not again until
    ``pyproject.toml`` is newer than the last install (dry runs: nothing is installed)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    os.utime(tmp_path / "pyproject.toml", (1e9, 1e9))  # last edited long ago
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("")  # the venv exists: only the install is in question
    log = tmp_path / "pip.log"
    (venv / "pip").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')  # records, installs nothing
    (venv / "pip").chmod(0o755)

    def make(*args: str) -> str:
        done = subprocess.run(
            ["make", *args], cwd=tmp_path, capture_output=True, text=True, check=True
        )
        return done.stdout

    assert "pip install" in make("-n", "install")  # never installed
    make("install")
    assert log.read_text().count("install") == 1
    assert "pip install" not in make("-n", "install")  # installed since the last edit
    assert "pip install" not in make("-n", "run")
    make("install-dev")
    assert "pip install" not in make("-n", "install-dev")
    assert "pip install" not in make("-n", "install")  # the dev install has the runtime too
    os.utime(tmp_path / "pyproject.toml", (4e9, 4e9))  # edited since
    assert "pip install" in make("-n", "install")
    assert "pip install" in make("-n", "install-dev")
