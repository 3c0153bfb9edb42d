"""The admin CLI run from several processes at once on one SQLite file, and its database errors.

Concurrent ``tiergate keys create`` runs all succeed (each writer waits for SQLite's write lock
instead of failing), and an error blames migrations only when the schema really is not at head.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import typer
from sqlalchemy import func, select
from typer.testing import CliRunner, Result

import gateway.db.session
from gateway.cli import register
from gateway.db import migrate
from gateway.db.models import ApiKey
from gateway.db.session import make_engine
from gateway.settings import get_settings

PROCESSES = 8
SECRET = "cli-concurrency-secret"
READY_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 120.0

Invoke = Callable[..., Result]

# Each process imports the real console script, says it is ready, waits for the go, then runs
# one command: the imports (seconds) are out of the way and the writes really overlap.
RUNNER = """
import sys, time
from pathlib import Path
from tiergate_cli import app
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.005)
app(sys.argv[3:], prog_name="tiergate")
"""


@pytest.fixture
def database(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A migrated SQLite database with tier ``gold`` and tenant ``acme``, set for the CLI."""
    monkeypatch.setenv("TIERGATE_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("TIERGATE_SECRET", SECRET)
    get_settings.cache_clear()
    migrate.upgrade(sqlite_url)
    cli = _cli()
    _ok(cli("tiers", "create", "gold", "--weight", "2", "--ttft-ms", "800", "--tpot-ms", "40"))
    _ok(cli("tenants", "create", "acme", "--tier", "gold"))
    return sqlite_url


def _cli() -> Invoke:
    """The admin commands in this process (CliRunner), on the configured database."""
    app = typer.Typer()
    register(app)
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(app, list(args))

    return invoke


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def _keys(url: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.scalar(select(func.count()).select_from(ApiKey)) or 0)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_concurrent_keys_create_processes_all_succeed(database: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    env = {**os.environ, "TIERGATE_DATABASE_URL": database, "TIERGATE_SECRET": SECRET}
    command = ["keys", "create", "--tenant", "acme", "--quiet"]
    ready = [tmp_path / f"ready-{i}" for i in range(PROCESSES)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(flag), str(go), *command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flag in ready
    ]
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(flag.exists() for flag in ready):
            assert time.monotonic() < deadline, "the CLI processes did not start in time"
            assert all(p.poll() is None for p in processes), "a CLI process died while starting"
            time.sleep(0.05)
        go.touch()
        outcomes = [p.communicate(timeout=RUN_TIMEOUT_S) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    failures = [
        (p.returncode, err) for p, (_, err) in zip(processes, outcomes, strict=True) if p.returncode
    ]
    assert not failures, failures
    keys = {out.strip() for out, _ in outcomes}
    assert len(keys) == PROCESSES and all(k.startswith("tg-") for k in keys)
    assert _keys(database) == PROCESSES


@pytest.fixture
def write_lock_held(database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Another process's writer holds the database's write lock; ours waits 0.2 s at most."""
    monkeypatch.setattr(gateway.db.session, "SQLITE_BUSY_TIMEOUT_MS", 200, raising=False)
    holder = sqlite3.connect(database.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.rollback()
        holder.close()


def test_a_busy_database_is_reported_as_busy_not_as_missing_migrations(
    database: str, write_lock_held: None
) -> None:
    result = _cli()("keys", "create", "--tenant", "acme")
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())
    assert "busy" in output and "try again" in output, output
    assert "db upgrade" not in output and "migrat" not in output, output
    assert "tg-" not in output  # no key was issued, none is shown


def test_the_migration_hint_only_when_the_schema_is_behind(database: str) -> None:
    cli = _cli()
    heads = migrate.head_revisions()
    _ok(cli("db", "downgrade", "base"))
    result = cli("keys", "create", "--tenant", "acme")
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())
    assert "not migrated" in output and "tiergate db upgrade" in output, output
    assert all(head in output for head in heads), output
    _ok(cli("db", "upgrade"))
    result = cli("keys", "create", "--tenant", "acme")  # at head: the tenant is gone, nothing else
    assert result.exit_code == 2 and "db upgrade" not in result.output, result.output
