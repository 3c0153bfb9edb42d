"""The CLI's update and delete commands: ``tiers update``, ``tenants update``,
``tenants delete`` — end to end through typer's CliRunner, on SQLite and PostgreSQL.

They must do what the admin API's PATCH and DELETE do (the same crud functions, the same
rules and messages), audited with the CLI's actor, and refuse bad input with exit code 2 and
one precise line, changing nothing.
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import typer
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from typer.main import get_command
from typer.testing import CliRunner, Result

from gateway.app.admin.schemas import TenantUpdate, TierUpdate
from gateway.cli import register
from gateway.db import crud
from gateway.db.models import AuditLog, UsageRecord
from gateway.db.security import server_secret
from gateway.db.session import make_engine, make_session_factory
from gateway.db.usage import UsageEvent, UsageWriter
from gateway.settings import get_settings

KEY_RE = re.compile(r"tg-[a-z0-9]{8}-[A-Za-z0-9_-]{20,}")
ACTOR = f"cli:{getpass.getuser()}"
GOLD = ("--weight", "3", "--ttft-ms", "800", "--tpot-ms", "40")

Invoke = Callable[..., Result]


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture
def cli(app: typer.Typer, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    """The CLI on a migrated database, SQLite and PostgreSQL; ``input=`` feeds prompts."""
    monkeypatch.setenv("TIERGATE_DATABASE_URL", db_url)
    get_settings.cache_clear()
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(app, list(args), input=input)

    _ok(invoke("db", "upgrade"))
    return invoke


@pytest.fixture
def db(cli: Invoke) -> Iterator[Callable[[], Session]]:
    """Sessions on the CLI's database, to check what the commands wrote."""
    engine = make_engine(get_settings().database_url)
    try:
        yield make_session_factory(engine)
    finally:
        engine.dispose()


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def _fails(result: Result, message: str, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    assert message in " ".join(result.output.split()), result.output


def _audit(db: Callable[[], Session]) -> list[tuple[str, str, str]]:
    with db() as s:
        rows = s.scalars(select(AuditLog).order_by(AuditLog.id)).all()
        return [(r.entity_type, r.action, r.actor) for r in rows]


def _options(app: typer.Typer, *path: str) -> set[str]:
    """The long option names of a command (``--foo``), its ``--no-foo`` twins included.

    Read off typer's command tree by duck typing: typer bundles its own click.
    """
    command: Any = get_command(app)
    for name in path:
        command = command.commands[name]
    return {
        option
        for param in command.params
        if param.param_type_name == "option"
        for option in (*param.opts, *param.secondary_opts)
        if option.startswith("--")
    }


# The CLI's option for each field of the admin API's PATCH bodies.
TIER_OPTION = {
    "name": "--name",
    "description": "--description",
    "weight": "--weight",
    "ttft_ms": "--ttft-ms",
    "tpot_ms": "--tpot-ms",
    "deadline_ms": "--deadline-ms",
    "min_ttft_ms": "--min-ttft-ms",
    "min_tpot_ms": "--min-tpot-ms",
    "min_deadline_ms": "--min-deadline-ms",
    "rpm_limit": "--rpm-limit",
    "tpm_limit": "--tpm-limit",
    "max_concurrency": "--max-concurrency",
    "best_effort_allowed": "--best-effort",
    "shed_slack": "--shed-slack",
    "default_kind": "--default-kind",
}
TENANT_OPTION = {
    "name": "--name",
    "tier": "--tier",
    "ttft_ms": "--ttft-ms",
    "tpot_ms": "--tpot-ms",
    "deadline_ms": "--deadline-ms",
    "rpm_limit": "--rpm-limit",
    "tpm_limit": "--tpm-limit",
    "max_concurrency": "--max-concurrency",
}


def test_update_commands_take_every_field_the_admin_patch_takes(app: typer.Typer) -> None:
    """A field added to the API's PATCH body and not to the CLI fails here."""
    assert set(TierUpdate.model_fields) == set(TIER_OPTION)
    assert set(TenantUpdate.model_fields) == set(TENANT_OPTION)
    tier_options = _options(app, "tiers", "update")
    assert {*TIER_OPTION.values(), "--no-best-effort", "--clear"} <= tier_options
    assert {*TENANT_OPTION.values(), "--clear"} <= _options(app, "tenants", "update")
    # create takes every field a tier has too (min_deadline_ms was missing once)
    assert set(TIER_OPTION.values()) - {"--name"} <= _options(app, "tiers", "create")


def test_limit_options_are_named_as_the_api_fields_and_the_old_names_still_work(
    app: typer.Typer, cli: Invoke, db: Callable[[], Session]
) -> None:
    """``--rpm-limit`` is the API's ``rpm_limit``, in every command that takes it; ``--rpm``
    (the name before) is an alias, and so is ``--clear rpm``."""
    for path in (("tiers", "create"), ("tiers", "update"), ("tenants", "create")):
        assert {"--rpm-limit", "--tpm-limit", "--rpm", "--tpm"} <= _options(app, *path), path
    _ok(cli("tiers", "create", "gold", *GOLD, "--rpm-limit", "60", "--tpm", "9000"))
    assert (_tier(db, "gold")["rpm_limit"], _tier(db, "gold")["tpm_limit"]) == (60, 9000)
    _ok(cli("tenants", "create", "acme", "--tier", "gold", "--tpm-limit", "500"))
    _ok(cli("tenants", "update", "acme", "--rpm", "7", "--clear", "tpm-limit"))
    with db() as s:
        acme = crud.get_tenant(s, "acme")
        assert (acme.rpm_limit, acme.tpm_limit) == (7, None)
    _ok(cli("tiers", "update", "gold", "--clear", "rpm"))
    assert _tier(db, "gold")["rpm_limit"] is None


def _tier(db: Callable[[], Session], name: str) -> dict[str, Any]:
    with db() as s:
        tier = crud.get_tier(s, name)
        return {field: getattr(tier, field) for field in TIER_OPTION}


def test_tiers_update_changes_only_what_is_given_and_audits_it(
    cli: Invoke, db: Callable[[], Session]
) -> None:
    _ok(cli("tiers", "create", "gold", *GOLD, "--rpm", "60", "--deadline-ms", "30000"))
    out = _ok(
        cli(
            "tiers",
            "update",
            "gold",
            "--name",
            "platinum",
            "--description",
            "paying customers",
            "--weight",
            "4.5",
            "--ttft-ms",
            "600",
            "--tpot-ms",
            "35",
            "--min-ttft-ms",
            "300",
            "--min-tpot-ms",
            "20",
            "--min-deadline-ms",
            "10000",
            "--tpm",
            "90000",
            "--max-concurrency",
            "12",
            "--best-effort",
            "--shed-slack",
            "0.25",
            "--clear",
            "rpm",
        )
    )
    assert "updated tier platinum" in out and "weight 3 → 4.5" in out
    assert "rpm_limit 60 → —" in " ".join(out.split())
    assert _tier(db, "platinum") == {
        "name": "platinum",
        "description": "paying customers",
        "weight": 4.5,
        "ttft_ms": 600.0,
        "tpot_ms": 35.0,
        "deadline_ms": 30000.0,  # not given: kept
        "min_ttft_ms": 300.0,
        "min_tpot_ms": 20.0,
        "min_deadline_ms": 10000.0,
        "rpm_limit": None,
        "tpm_limit": 90000,
        "max_concurrency": 12,
        "best_effort_allowed": True,
        "shed_slack": 0.25,
        "default_kind": "latency",  # not given: kept
    }
    _ok(cli("tiers", "update", "platinum", "--no-best-effort", "--clear", "deadline-ms"))
    changed = _tier(db, "platinum")
    assert changed["best_effort_allowed"] is False and changed["deadline_ms"] is None
    # the same values again: nothing written, no audit row
    assert "nothing changed" in _ok(cli("tiers", "update", "platinum", "--weight", "4.5"))
    assert _audit(db) == [
        ("tier", "create", ACTOR),
        ("tier", "update", ACTOR),
        ("tier", "update", ACTOR),
    ]
    with db() as s:
        entry = s.scalars(select(AuditLog).where(AuditLog.action == "update")).first()
        assert entry is not None and entry.before is not None and entry.after is not None
        assert (entry.before["name"], entry.after["name"]) == ("gold", "platinum")
        assert (entry.before["rpm_limit"], entry.after["rpm_limit"]) == (60, None)


def test_tiers_update_refuses_bad_input_with_exit_2_and_changes_nothing(
    cli: Invoke, db: Callable[[], Session]
) -> None:
    _ok(cli("tiers", "create", "gold", *GOLD, "--rpm", "60"))
    _ok(cli("tiers", "create", "silver", "--weight", "2", "--ttft-ms", "900", "--tpot-ms", "50"))
    before = _tier(db, "gold")
    _fails(cli("tiers", "update", "gold"), "nothing to update: give at least one option")
    _fails(
        cli("tiers", "update", "gold", "--rpm", "5", "--clear", "rpm"),
        "--rpm-limit and --clear rpm-limit contradict each other",
    )
    _fails(
        cli("tiers", "update", "gold", "--weight", "0"),
        "Invalid value for '--weight': Input should be greater than or equal to",
    )
    _fails(cli("tiers", "update", "gold", "--rpm", "0"), "Invalid value for '--rpm-limit'")
    _fails(
        cli("tiers", "update", "gold", "--shed-slack", "101"), "Invalid value for '--shed-slack'"
    )
    _fails(cli("tiers", "update", "gold", "--clear", "weight"), "Invalid value for '--clear'")
    _fails(cli("tiers", "update", "gold", "--weight", "many"), "Invalid value for '--weight'")
    # the data layer's rules, worded as the admin API words them
    _fails(cli("tiers", "update", "bronze", "--weight", "1"), "tier 'bronze' does not exist")
    _fails(cli("tiers", "update", "gold", "--name", "silver"), "tier 'silver' already exists")
    _fails(cli("tiers", "update", "gold", "--name", "no spaces"), "invalid tier name 'no spaces'")
    _fails(
        cli("tiers", "update", "gold", "--min-ttft-ms", "900"),
        "min_ttft_ms (900) exceeds the tier's default ttft_ms (800)",
    )
    _fails(
        cli("tiers", "update", "gold", "--description", "x" * 1001),
        "description must be text of at most 1000 characters",
    )
    assert _tier(db, "gold") == before
    assert [action for _, action, _ in _audit(db)] == ["create", "create"]


def test_tenants_update_renames_moves_and_overrides_what_the_key_carries(
    cli: Invoke, db: Callable[[], Session]
) -> None:
    _ok(cli("tiers", "create", "gold", *GOLD, "--rpm", "60", "--min-ttft-ms", "200"))
    _ok(cli("tiers", "create", "silver", "--weight", "2", "--ttft-ms", "900", "--tpot-ms", "50"))
    _ok(cli("tenants", "create", "acme", "--tier", "silver", "--tpm", "9000"))
    key = KEY_RE.findall(_ok(cli("keys", "create", "--tenant", "acme")))[0]

    out = _ok(
        cli(
            "tenants",
            "update",
            "acme",
            "--name",
            "acme-corp",
            "--tier",
            "gold",
            "--ttft-ms",
            "500",
            "--tpot-ms",
            "30",
            "--deadline-ms",
            "20000",
            "--rpm",
            "120",
            "--max-concurrency",
            "4",
            "--clear",
            "tpm",
        )
    )
    flat = " ".join(out.split())
    assert "updated tenant acme-corp" in flat and "tier silver → gold" in flat
    with db() as s:
        identity = crud.authenticate(s, server_secret(get_settings()), key, touch=False)
    assert identity is not None
    assert (identity.tenant_name, identity.tier_name) == ("acme-corp", "gold")
    policy = identity.policy
    assert (policy.ttft_ms, policy.tpot_ms, policy.deadline_ms) == (500.0, 30.0, 20000.0)
    assert (policy.rpm_limit, policy.tpm_limit, policy.max_concurrency) == (120, None, 4)

    _ok(cli("tenants", "update", "acme-corp", "--clear", "rpm", "--clear", "ttft-ms"))
    with db() as s:
        identity = crud.authenticate(s, server_secret(get_settings()), key, touch=False)
    assert identity is not None
    assert (identity.policy.rpm_limit, identity.policy.ttft_ms) == (60, 800.0)  # the tier's
    assert "nothing changed" in _ok(cli("tenants", "update", "acme-corp", "--tier", "gold"))
    assert [(e, a) for e, a, _ in _audit(db)][-2:] == [("tenant", "update"), ("tenant", "update")]
    assert {actor for _, _, actor in _audit(db)} == {ACTOR}


def test_tenants_update_refuses_bad_input_with_exit_2_and_changes_nothing(
    cli: Invoke, db: Callable[[], Session]
) -> None:
    _ok(cli("tiers", "create", "gold", *GOLD, "--min-ttft-ms", "200"))
    _ok(cli("tenants", "create", "acme", "--tier", "gold", "--rpm", "10"))
    _ok(cli("tenants", "create", "globex", "--tier", "gold"))
    audit = _audit(db)
    _fails(cli("tenants", "update", "acme"), "nothing to update")
    _fails(
        cli("tenants", "update", "acme", "--rpm", "5", "--clear", "rpm"),
        "--rpm-limit and --clear rpm-limit contradict each other",
    )
    _fails(cli("tenants", "update", "acme", "--tier", "platinum"), "tier 'platinum' does not exist")
    _fails(cli("tenants", "update", "nobody", "--rpm", "5"), "tenant 'nobody' does not exist")
    _fails(cli("tenants", "update", "acme", "--name", "globex"), "tenant 'globex' already exists")
    _fails(
        cli("tenants", "update", "acme", "--ttft-ms", "100"),
        "ttft_ms override 100 is tighter than tier 'gold' allows (min_ttft_ms = 200)",
    )
    _fails(cli("tenants", "update", "acme", "--tpm", "-1"), "Invalid value for '--tpm-limit'")
    _fails(cli("tenants", "update", "acme", "--clear", "status"), "Invalid value for '--clear'")
    with db() as s:
        acme = crud.get_tenant(s, "acme")
        assert (acme.name, acme.rpm_limit, acme.ttft_ms) == ("acme", 10, None)
    assert _audit(db) == audit


def test_tenants_delete_asks_first_then_deletes_keys_and_keeps_usage(
    cli: Invoke, db: Callable[[], Session]
) -> None:
    _ok(cli("tiers", "create", "gold", *GOLD))
    _ok(cli("tenants", "create", "acme", "--tier", "gold"))
    key = KEY_RE.findall(_ok(cli("keys", "create", "--tenant", "acme")))[0]
    _ok(cli("keys", "create", "--tenant", "acme"))
    with db() as s:
        acme_id = crud.get_tenant(s, "acme").id
    engine = make_engine(get_settings().database_url)
    try:
        with UsageWriter(make_session_factory(engine)) as writer:
            writer.submit(UsageEvent(request_id="r1", tenant_id=acme_id, tier="gold", status="ok"))
    finally:
        engine.dispose()

    refused = cli("tenants", "delete", "acme", input="n\n")
    _fails(refused, "tenant 'acme' not deleted", code=1)
    assert "2 API key(s), 2 of them usable" in " ".join(refused.output.split())
    _fails(cli("tenants", "delete", "acme"), "Aborted", code=1)  # no answer at all (EOF)
    with db() as s:
        assert crud.get_tenant(s, "acme").id == acme_id

    assert "deleted tenant acme and its 2 API key(s)" in _ok(
        cli("tenants", "delete", "acme", input="y\n")
    )
    with db() as s:
        assert crud.authenticate(s, server_secret(get_settings()), key, touch=False) is None
        assert crud.list_keys(s) == []
        usage = s.scalars(select(UsageRecord)).all()
        assert [(u.request_id, u.tenant_id) for u in usage] == [("r1", None)]
        deleted = s.scalars(select(AuditLog).where(AuditLog.action == "delete")).one()
        assert deleted.before is not None
        assert (deleted.entity_type, deleted.actor, deleted.before["name"]) == (
            "tenant",
            ACTOR,
            "acme",
        )
    _fails(cli("tenants", "delete", "acme", "--yes"), "tenant 'acme' does not exist")

    _ok(cli("tenants", "create", "globex", "--tier", "gold"))
    assert "deleted tenant globex" in _ok(cli("tenants", "delete", "globex", "-y"))
    with db() as s:
        assert (
            s.scalar(select(func.count()).select_from(AuditLog).where(AuditLog.action == "delete"))
            == 2
        )
    # the tier no tenant is on any more can go now
    _ok(cli("tiers", "delete", "gold"))


def test_tiers_default_kind_through_the_cli(cli: Invoke, db: Callable[[], Session]) -> None:
    """Request kinds: ``--default-kind`` on create and update, checked by the data layer's rule."""
    _fails(
        cli("tiers", "create", "batch", *GOLD, "--default-kind", "deadline"),
        "default_kind 'deadline' needs the tier's default deadline: set deadline_ms",
    )
    _ok(
        cli(
            "tiers",
            "create",
            "batch",
            *GOLD,
            "--deadline-ms",
            "60000",
            "--default-kind",
            "deadline",
        )
    )
    assert _tier(db, "batch")["default_kind"] == "deadline"
    _ok(cli("tiers", "update", "batch", "--default-kind", "best-effort"))
    assert _tier(db, "batch")["default_kind"] == "best-effort"
    _fails(cli("tiers", "update", "batch", "--default-kind", "compound"), "Invalid value")
