"""``tiergate prices`` and ``tiergate budgets`` end to end on a migrated SQLite database."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import typer
from sqlalchemy import select
from typer.testing import CliRunner, Result

from gateway.cli import register
from gateway.db.models import AuditLog
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import get_settings

Invoke = Callable[..., Result]


@pytest.fixture
def cli(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    monkeypatch.setenv("TIERGATE_DATABASE_URL", sqlite_url)
    get_settings.cache_clear()
    app = typer.Typer()
    register(app)
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(app, list(args))

    assert invoke("db", "upgrade").exit_code == 0
    return invoke


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_prices_and_budgets_from_the_command_line(cli: Invoke, sqlite_url: str) -> None:
    _ok(cli("tiers", "create", "gold", "--weight", "2", "--ttft-ms", "500", "--tpot-ms", "50"))
    _ok(cli("tenants", "create", "acme", "--tier", "gold"))
    assert "0.150000 prompt" in _ok(
        cli("prices", "set", "m", "--prompt", "0.15", "--completion", "0.6")
    )
    _ok(cli("prices", "set", "m", "--prompt", "0.2", "--completion", "0.6"))
    assert "0.200000" in _ok(cli("prices", "list"))
    bad = cli("prices", "set", "n", "--prompt", "-1", "--completion", "1")
    assert bad.exit_code == 2 and "prompt_per_mtok" in bad.output
    _ok(cli("budgets", "add", "10", "--period", "month", "--tenant", "acme", "--soft", "0.8"))
    listed = _ok(cli("budgets", "list"))
    assert "acme" in listed and "10.000000" in listed and "ok" in listed
    twice = cli("budgets", "add", "10", "--period", "month", "--tenant", "acme")
    assert twice.exit_code == 2 and "already" in twice.output
    assert cli("budgets", "add", "10", "--period", "week", "--tenant", "acme").exit_code == 2
    _ok(cli("budgets", "delete", "1"))
    _ok(cli("prices", "delete", "m"))
    engine = make_engine(sqlite_url)
    try:
        with make_session_factory(engine)() as s:
            audited = s.scalars(
                select(AuditLog.entity_type).where(AuditLog.entity_type.in_(("price", "budget")))
            ).all()
    finally:
        engine.dispose()
    assert sorted(audited) == ["budget", "budget", "price", "price", "price"]
