"""The admin CLI end to end on a temporary SQLite database (typer's CliRunner)."""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import typer
from sqlalchemy import select
from typer.testing import CliRunner, Result

import gateway.cli
from gateway.cli import register
from gateway.db import crud
from gateway.db.models import AuditLog, utcnow
from gateway.db.security import server_secret
from gateway.db.session import make_engine, make_session_factory
from gateway.db.usage import UsageEvent, UsageWriter
from gateway.settings import get_settings
from priority.profiles import available_profiles, load_profile

KEY_RE = re.compile(r"tg-[a-z0-9]{8}-[A-Za-z0-9_-]{20,}")

Invoke = Callable[..., Result]


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture
def raw_cli(app: typer.Typer, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    """Invoke the CLI against a fresh, NOT migrated SQLite database."""
    monkeypatch.setenv("TIERGATE_DATABASE_URL", sqlite_url)
    get_settings.cache_clear()
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(app, list(args))

    return invoke


@pytest.fixture
def cli(raw_cli: Invoke) -> Invoke:
    """The CLI on a migrated database."""
    result = raw_cli("db", "upgrade")
    assert result.exit_code == 0, result.output
    return raw_cli


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def _fails(result: Result, message: str, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    assert message in " ".join(result.output.split()), result.output


def test_db_migration_commands(raw_cli: Invoke) -> None:
    assert "base (not migrated)" in _ok(raw_cli("db", "current"))
    _fails(raw_cli("tiers", "list"), "tiergate db upgrade", code=1)
    _ok(raw_cli("db", "upgrade"))
    current = _ok(raw_cli("db", "current"))
    head = re.search(r"head:\s+(\S+)", current)
    assert head is not None and f"current: {head.group(1)}" in current
    _ok(raw_cli("db", "downgrade", "base"))
    assert "base (not migrated)" in _ok(raw_cli("db", "current"))
    _ok(raw_cli("db", "upgrade", head.group(1)))
    _ok(raw_cli("tiers", "list"))


def test_tier_tenant_key_lifecycle(cli: Invoke) -> None:
    _ok(
        cli(
            "tiers",
            "create",
            "gold",
            "--weight",
            "3",
            "--ttft-ms",
            "800",
            "--tpot-ms",
            "40",
            "--rpm",
            "60",
            "--max-concurrency",
            "8",
        )
    )
    assert "gold" in _ok(cli("tiers", "list"))
    _ok(cli("tenants", "create", "acme", "--tier", "gold", "--tpm", "9000"))
    assert "acme" in _ok(cli("tenants", "list", "--tier", "gold"))

    out = _ok(cli("keys", "create", "--tenant", "acme", "--name", "app", "--expires-in-days", "30"))
    keys = KEY_RE.findall(out)
    assert len(keys) == 1 and "shown once" in out
    key = keys[0]
    prefix = key.split("-")[1]

    listing = _ok(cli("keys", "list"))
    assert f"tg-{prefix}" in listing and key not in listing

    secret = server_secret(get_settings())
    engine = make_engine(get_settings().database_url)
    factory = make_session_factory(engine)
    try:
        with factory() as s:
            identity = crud.authenticate(s, secret, key, touch=False)
            assert identity is not None
            assert (identity.tenant_name, identity.tier_name) == ("acme", "gold")
            assert (identity.policy.rpm_limit, identity.policy.tpm_limit) == (60, 9000)
            expires = identity.expires_at
            assert expires is not None
            assert timedelta(days=29) < expires - utcnow() <= timedelta(days=30)
        # the expiry to the second (a rotation's grace of seconds must not read as "today")
        assert expires.strftime("%H:%M:%S") in _ok(cli("keys", "list"))

        _ok(cli("tenants", "suspend", "acme"))
        with factory() as s:
            assert crud.authenticate(s, secret, key) is None
        _ok(cli("tenants", "activate", "acme"))
        _ok(cli("keys", "revoke", f"tg-{prefix}"))
        with factory() as s:
            assert crud.authenticate(s, secret, key) is None
            assert "revoked" in _ok(cli("keys", "list", "--tenant", "acme"))
            rows = s.scalars(select(AuditLog).order_by(AuditLog.id)).all()
    finally:
        engine.dispose()
    assert {r.actor for r in rows} == {f"cli:{getpass.getuser()}"}
    assert [(r.entity_type, r.action) for r in rows] == [
        ("tier", "create"),
        ("tenant", "create"),
        ("api_key", "create"),
        ("tenant", "suspend"),
        ("tenant", "activate"),
        ("api_key", "revoke"),
    ]


def test_bad_input_exits_2_with_a_precise_message(cli: Invoke) -> None:
    gold = ("--weight", "3", "--ttft-ms", "800", "--tpot-ms", "40")
    _ok(cli("tiers", "create", "gold", *gold))
    _fails(cli("tiers", "create", "gold", *gold), "tier 'gold' already exists")
    _fails(  # the bounds of gateway.bounds, checked as the option is read
        cli("tiers", "create", "zero", "--weight", "0", "--ttft-ms", "1", "--tpot-ms", "1"),
        "Invalid value for '--weight': Input should be greater than or equal to",
    )
    _fails(cli("tenants", "create", "acme", "--tier", "platinum"), "tier 'platinum' does not exist")
    _ok(cli("tenants", "create", "acme", "--tier", "gold"))
    _fails(cli("tenants", "create", "acme", "--tier", "gold"), "tenant 'acme' already exists")
    _fails(cli("tiers", "delete", "gold"), "tier 'gold' still has 1 tenant(s)")
    _fails(cli("keys", "create", "--tenant", "nobody"), "tenant 'nobody' does not exist")
    _fails(cli("keys", "revoke", "tg-zzzzzzzz"), "API key 'tg-zzzzzzzz' does not exist")
    _fails(
        cli("backends", "add", "b", "--url", "http://h:1", "--model", "m", "--profile", "no-such"),
        "unknown profile 'no-such'; known profiles:",
    )
    _fails(
        cli(
            "backends",
            "add",
            "b",
            "--url",
            "http://h:1",
            "--model",
            "m",
            "--profile",
            available_profiles()[0],
            "--kind",
            "triton",
        ),
        "kind must be one of vllm, vllm-ascend, emulated",
    )
    _fails(cli("usage", "--by", "model"), "--by must be 'tenant' or 'tier'")


def test_backends_commands(cli: Invoke) -> None:
    profile = available_profiles()[0]
    _ok(
        cli(
            "backends",
            "add",
            "gpu-0",
            "--url",
            "http://10.0.0.5:8000",
            "--model",
            "qwen",
            "--profile",
            profile,
            "--kind",
            "emulated",
        )
    )
    _fails(
        cli(
            "backends",
            "add",
            "gpu-0",
            "--url",
            "http://10.0.0.6:8000",
            "--model",
            "qwen",
            "--profile",
            profile,
        ),
        "backend 'gpu-0' already exists",
    )
    _ok(cli("backends", "disable", "gpu-0"))
    listing = _ok(cli("backends", "list"))
    assert "gpu-0" in listing and "emulated" in listing and "no" in listing.split("gpu-0")[1]
    _ok(cli("backends", "enable", "gpu-0"))
    _fails(cli("backends", "disable", "gpu-9"), "backend 'gpu-9' does not exist")


def _profile_file(directory: Path, name: str, **engine: int) -> Path:
    """A calibrated profile JSON as an operator would have it: a shipped one, renamed."""
    document = load_profile("a100-qwen2-7b").to_dict()
    document["engine"] = {**document["engine"], **engine}
    path = directory / f"{name}.json"
    path.write_text(json.dumps({**document, "name": name, "hardware": "site A100"}))
    return path


def _add_backend(cli: Invoke, name: str, profile: str | Path) -> Result:
    url = "http://10.0.0.5:8000"
    return cli("backends", "add", name, "--url", url, "--model", "qwen", "--profile", str(profile))


def _profile_rows(cli: Invoke) -> dict[str, list[str]]:
    """``profiles list`` as {name: the row's other cells}."""
    rows = {}
    for line in _ok(cli("profiles", "list")).splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if len(cells) == 7 and cells[1] in ("shipped", "custom"):
            rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as wide as they need: profile names and hardware are longer than 80 columns
    allow, and rich would cut them short."""
    monkeypatch.setattr(gateway.cli.console, "_width", 200)


@pytest.mark.usefixtures("wide")
def test_profiles_import_list_delete(cli: Invoke, tmp_path: Path) -> None:
    path = _profile_file(tmp_path, "site-a100")
    assert "imported profile site-a100" in _ok(cli("profiles", "import", str(path)))
    _ok(cli("profiles", "import", str(path), "--name", "site-a100-copy"))
    _fails(cli("profiles", "import", str(path)), "profile 'site-a100' already exists")
    _fails(
        cli("profiles", "import", str(path), "--name", "a100-qwen2-7b"),
        "profile name 'a100-qwen2-7b' is a shipped profile's",
    )
    rows = _profile_rows(cli)
    assert set(rows) == {*available_profiles(), "site-a100", "site-a100-copy"}
    assert rows["site-a100"][:4] == ["custom", "site A100", "Qwen2-7B", "1"]
    assert rows["site-a100"][5] == f"cli:{getpass.getuser()}"
    assert rows["a100-qwen2-7b"][0] == "shipped" and rows["a100-qwen2-7b"][5] == "—"

    _ok(_add_backend(cli, "gpu-0", "site-a100"))
    _fails(
        cli("profiles", "delete", "site-a100"),
        "profile 'site-a100' is used by backend(s) gpu-0",
    )
    _fails(cli("profiles", "delete", "a100-qwen2-7b"), "is shipped with tiergate and cannot be")
    _fails(cli("profiles", "delete", "nope"), "profile 'nope' does not exist")
    assert "deleted profile site-a100-copy" in _ok(cli("profiles", "delete", "site-a100-copy"))
    assert set(_profile_rows(cli)) == {*available_profiles(), "site-a100"}


@pytest.mark.usefixtures("wide")
def test_profile_files_that_are_not_profiles_exit_2(cli: Invoke, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    _fails(cli("profiles", "import", str(broken)), f"{broken} is not valid JSON")
    _fails(cli("profiles", "import", str(tmp_path / "missing.json")), "cannot read")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"name": "x", "hardware": "h", "model": "m"}))
    _fails(cli("profiles", "import", str(wrong)), "the profile document lacks coefficients")
    _fails(_add_backend(cli, "gpu-9", wrong), "the profile document lacks coefficients")
    _fails(_add_backend(cli, "gpu-9", tmp_path / "nope.json"), "no such profile file exists")
    assert set(_profile_rows(cli)) == set(available_profiles())
    assert "gpu-9" not in _ok(cli("backends", "list"))


def test_backends_add_with_a_profile_file_imports_it_once(cli: Invoke, tmp_path: Path) -> None:
    path = _profile_file(tmp_path, "site-h100", max_num_seqs=64)
    assert "using stored profile site-h100" in _ok(_add_backend(cli, "gpu-0", path))
    _ok(_add_backend(cli, "gpu-1", path))  # the same document: stored once, reused
    listing = _ok(cli("backends", "list"))
    assert listing.count("site-h100") == 2 and str(tmp_path) not in listing
    recalibrated = tmp_path / "recalibrated"
    recalibrated.mkdir()
    _fails(
        _add_backend(cli, "gpu-2", _profile_file(recalibrated, "site-h100", max_num_seqs=8)),
        "a different profile named 'site-h100' is already stored",
    )
    assert "gpu-2" not in _ok(cli("backends", "list"))
    engine = make_engine(get_settings().database_url)
    try:
        with make_session_factory(engine)() as s:
            assert [p.name for p in crud.list_profiles(s)] == ["site-h100"]
            stored = crud.load_stored_profiles(s, ["site-h100"])["site-h100"]
            assert stored.engine.max_num_seqs == 64
            audit = s.scalars(select(AuditLog).where(AuditLog.entity_type == "profile")).all()
            assert [(a.action, a.actor) for a in audit] == [("create", f"cli:{getpass.getuser()}")]
    finally:
        engine.dispose()


def test_db_downgrade_refuses_to_strand_backends_on_stored_profiles(
    cli: Invoke, tmp_path: Path
) -> None:
    _ok(_add_backend(cli, "gpu-0", _profile_file(tmp_path, "site-a100")))
    _fails(cli("db", "downgrade", "0001"), "backend(s) gpu-0 (site-a100) use stored latency")
    assert "current: 0002" in _ok(cli("db", "current"))
    _ok(cli("backends", "disable", "gpu-0"))  # disabled backends still name the profile
    _fails(cli("db", "downgrade", "base"), "cannot downgrade below revision 0002")


def test_seed_quiet_key_and_usage(cli: Invoke) -> None:
    first = _ok(cli("db", "seed"))
    assert "premium, standard, batch" in first and len(KEY_RE.findall(first)) == 1
    again = _ok(cli("db", "seed"))
    assert "none (all present)" in again and not KEY_RE.findall(again)

    quiet = _ok(cli("keys", "create", "--tenant", "demo", "-q"))
    assert KEY_RE.fullmatch(quiet.strip())

    engine = make_engine(get_settings().database_url)
    try:
        with make_session_factory(engine)() as s:
            demo_id = crud.get_tenant(s, "demo").id
        with UsageWriter(make_session_factory(engine)) as writer:
            writer.submit(
                UsageEvent(
                    request_id="1",
                    tenant_id=demo_id,
                    tier="standard",
                    status="ok",
                    prompt_tokens=30,
                    completion_tokens=12,
                    slo_met=True,
                    gain=3.0,
                    ideal_gain=4.0,
                )
            )
            writer.submit(
                UsageEvent(
                    request_id="2",
                    tenant_id=demo_id,
                    tier="standard",
                    status="rejected",
                    ideal_gain=4.0,
                )
            )
    finally:
        engine.dispose()
    by_tenant = _ok(cli("usage"))
    row = next(line for line in by_tenant.splitlines() if "demo" in line)
    # requests, ok, rejected, cancelled, errors, tokens, SLO attainment, TDG ratio: the
    # rejection is counted but is no SLO miss, and its (old-style) ideal gain is left out
    assert re.findall(r"[\d.]+%?", row)[:8] == ["2", "1", "1", "0", "0", "42", "100.0%", "0.750"]
    assert "standard" in _ok(cli("usage", "--by", "tier", "--hours", "1"))


def test_tiers_create_takes_a_bounded_shed_slack(cli: Invoke) -> None:
    gold = ("--weight", "3", "--ttft-ms", "800", "--tpot-ms", "40")
    _ok(cli("tiers", "create", "gold", *gold, "--shed-slack", "0.25"))
    _ok(cli("tiers", "create", "plain", *gold))
    listed = _ok(cli("tiers", "list"))
    assert "slack" in listed and "0.25" in listed  # a column of its own
    _fails(
        cli("tiers", "create", "late", *gold, "--shed-slack", "101"),
        "Invalid value for '--shed-slack'",
    )
