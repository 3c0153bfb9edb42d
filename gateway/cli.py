"""Admin command line: ``tiergate db|tiers|tenants|keys|backends|profiles|usage``.

Every command works on ``TIERGATE_DATABASE_URL`` through the same CRUD functions as the admin
API, so the CLI and the API cannot disagree on rules, and every change is audited with actor
``cli:<os user>``. Bad input (unknown tier, duplicate name, bad profile, ...) exits with code 2
and one precise line on stderr.

``tiergate profiles`` (plural, like the other database-backed groups) manages the latency
profiles stored in the gateway's database; ``tiergate profile`` (singular, from
:mod:`priority.cli.profile`) fits profile files and lists the shipped ones, with no database.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gateway.bounds import (
    MAX_LIMIT,
    MAX_SHED_SLACK,
    MAX_SLO_MS,
    MAX_WEIGHT,
    MIN_LIMIT,
    MIN_SLO_MS,
    MIN_WEIGHT,
)
from gateway.db import crud, migrate
from gateway.db.errors import DatabaseFailure, DomainError, classify, describe
from gateway.db.models import BACKEND_KINDS, utcnow
from gateway.db.security import display_prefix, server_secret
from gateway.db.seed import DEMO_TENANT, seed_defaults
from gateway.db.session import SQLITE_BUSY_TIMEOUT_MS, make_engine, make_session_factory
from gateway.settings import get_settings

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

db_app = typer.Typer(help="Database schema: migrate, inspect, seed.", no_args_is_help=True)
tiers_app = typer.Typer(help="Service tiers: weights, SLOs, limits.", no_args_is_help=True)
tenants_app = typer.Typer(help="Tenants and their tiers.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys (shown once, stored hashed).", no_args_is_help=True)
backends_app = typer.Typer(help="Inference backends the gateway routes to.", no_args_is_help=True)
profiles_app = typer.Typer(
    help="Latency profiles stored in the gateway's database (import your calibrated ones here; "
    "`tiergate profile fit` makes them).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Mount the admin commands on the ``tiergate`` app."""
    app.add_typer(db_app, name="db")
    app.add_typer(tiers_app, name="tiers")
    app.add_typer(tenants_app, name="tenants")
    app.add_typer(keys_app, name="keys")
    app.add_typer(backends_app, name="backends")
    app.add_typer(profiles_app, name="profiles")
    app.command("usage")(usage)


def actor() -> str:
    """``cli:<os user>``: who ran the command, for the audit log."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (containers)
        return f"cli:uid{os.getuid()}"


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]Error:[/] {message}", soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def _transaction() -> Iterator[Session]:
    """One committed unit of work on the configured database; errors become exit codes.

    The unit of work takes the database's write lock first (:mod:`gateway.db.session`), so
    commands run at once from several processes queue for it instead of failing.
    """
    url = get_settings().database_url
    engine = make_engine(url)
    try:
        with make_session_factory(engine).begin() as session:
            yield session
    except DomainError as exc:
        raise _fail(exc.message) from None
    except SQLAlchemyError as exc:
        raise _database_failure(exc, url) from None
    finally:
        engine.dispose()


def _database_failure(exc: SQLAlchemyError, url: str) -> typer.Exit:
    """The exit for a database error, worded by what it means (never its text, which can carry
    values); the ``tiergate db upgrade`` hint only when the schema really is not at head."""
    failure = classify(exc)
    if failure is DatabaseFailure.CONFLICT:
        return _fail("the change conflicts with a concurrent one; check the current state, retry")
    if failure is DatabaseFailure.INVALID:
        return _fail(f"a value is outside what the database allows ({describe(exc)})")
    if failure is DatabaseFailure.BUSY:
        return _fail(
            f"the database stayed busy (other writers held its lock for over "
            f"{SQLITE_BUSY_TIMEOUT_MS / 1000:g} s, or its connections ran out); try again",
            code=1,
        )
    where = make_url(url).render_as_string(hide_password=True)
    if failure is DatabaseFailure.UNAVAILABLE:
        return _fail(
            f"cannot reach the database at {where} ({describe(exc)}): is it running, and is "
            "TIERGATE_DATABASE_URL right?",
            code=1,
        )
    mismatch = migrate.schema_mismatch(url)
    if mismatch is not None:
        return _fail(f"{mismatch}: run `tiergate db upgrade`", code=1)
    return _fail(f"database error at {where}: {describe(exc)}", code=1)


def _fmt(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _print_table(
    title: str, columns: Sequence[str | Column], rows: Iterable[Sequence[object]]
) -> None:
    """A listing: one rich table row per item, every value shown through :func:`_fmt`."""
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(_fmt(value) for value in row))
    console.print(table)


# -- db ---------------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="target revision")] = "head",
) -> None:
    """Migrate the schema up to REVISION (default: the newest)."""
    migrate.upgrade(get_settings().database_url, revision)
    console.print(f"database at {', '.join(migrate.current_revisions()) or 'base'}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="target revision ('base' = empty)")],
) -> None:
    """Migrate the schema down to REVISION."""
    try:
        migrate.downgrade(revision, get_settings().database_url)
    except DomainError as exc:  # a migration refusing to strand data (e.g. stored profiles)
        raise _fail(exc.message) from None
    console.print(f"database at {', '.join(migrate.current_revisions()) or 'base'}")


@db_app.command("current")
def db_current() -> None:
    """Show the schema revision of the database and the newest one available."""
    current = migrate.current_revisions(get_settings().database_url)
    heads = migrate.head_revisions()
    console.print(f"current: {', '.join(current) or 'base (not migrated)'}")
    console.print(f"head:    {', '.join(heads)}")


@db_app.command("seed")
def db_seed() -> None:
    """Create the default tiers and the demo tenant if missing; issue a demo key if it has none."""
    with _transaction() as session:
        result = seed_defaults(session, actor=actor())
        created_key = None
        if result.demo_key_needed:
            created_key = crud.create_key(
                session,
                actor=actor(),
                tenant=DEMO_TENANT,
                secret=server_secret(get_settings()),
                name="demo",
            )
    tiers = ", ".join(result.created_tiers) or "none (all present)"
    console.print(f"tiers created: {tiers}")
    console.print(f"demo tenant: {'created' if result.created_demo_tenant else 'present'}")
    if created_key is not None:
        _print_new_key(DEMO_TENANT, created_key.plaintext)


# -- tiers ------------------------------------------------------------------------------------


def _bounded(low: float, high: float, help_text: str) -> Any:
    """An option refused outside ``[low, high]`` (exit code 2, naming the option and the
    range): the bounds of :mod:`gateway.bounds`, which the admin API and the database apply."""
    return typer.Option(min=low, max=high, help=f"{help_text}; {low:g} to {high:g}")


def _slo_ms(help_text: str) -> Any:
    return _bounded(MIN_SLO_MS, MAX_SLO_MS, help_text)


def _limit(help_text: str) -> Any:
    return _bounded(MIN_LIMIT, MAX_LIMIT, help_text)


@tiers_app.command("create")
def tiers_create(
    name: Annotated[str, typer.Argument(help="tier name")],
    weight: Annotated[
        float, _bounded(MIN_WEIGHT, MAX_WEIGHT, "priority weight (larger = more important)")
    ],
    ttft_ms: Annotated[float, _slo_ms("default time-to-first-token SLO, ms")],
    tpot_ms: Annotated[float, _slo_ms("default time-per-output-token SLO, ms")],
    deadline_ms: Annotated[float | None, _slo_ms("end-to-end deadline, ms")] = None,
    min_ttft_ms: Annotated[float | None, _slo_ms("tightest TTFT allowed, ms")] = None,
    min_tpot_ms: Annotated[float | None, _slo_ms("tightest TPOT allowed, ms")] = None,
    rpm: Annotated[int | None, _limit("requests per minute (unset = unlimited)")] = None,
    tpm: Annotated[int | None, _limit("tokens per minute (unset = unlimited)")] = None,
    max_concurrency: Annotated[int | None, _limit("requests in flight")] = None,
    best_effort: Annotated[
        bool, typer.Option(help="serve best-effort instead of shedding when the SLO is infeasible")
    ] = False,
    shed_slack: Annotated[
        float,
        _bounded(
            0.0,
            MAX_SHED_SLACK,
            "how late (a fraction of the TTFT SLO) a predicted first token may be and the "
            "request still be admitted under overload",
        ),
    ] = 0.0,
    description: Annotated[str | None, typer.Option(help="free text")] = None,
) -> None:
    """Create a tier."""
    with _transaction() as session:
        tier = crud.create_tier(
            session,
            actor=actor(),
            name=name,
            weight=weight,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
            deadline_ms=deadline_ms,
            min_ttft_ms=min_ttft_ms,
            min_tpot_ms=min_tpot_ms,
            rpm_limit=rpm,
            tpm_limit=tpm,
            max_concurrency=max_concurrency,
            best_effort_allowed=best_effort,
            shed_slack=shed_slack,
            description=description,
        )
    console.print(f"created tier [bold]{tier.name}[/] (id {tier.id})")


@tiers_app.command("list")
def tiers_list() -> None:
    """List tiers, most important first."""
    with _transaction() as session:
        rows = [
            (
                t.name,
                t.weight,
                t.ttft_ms,
                t.tpot_ms,
                t.deadline_ms,
                t.rpm_limit,
                t.tpm_limit,
                t.max_concurrency,
                t.best_effort_allowed,
                t.shed_slack,
            )
            for t in crud.list_tiers(session)
        ]
    columns = (
        "name",
        "weight",
        "TTFT ms",
        "TPOT ms",
        "deadline ms",
        "RPM",
        "TPM",
        "concurrency",
        "best effort",
        "shed slack",
    )
    _print_table("tiers", columns, rows)


@tiers_app.command("delete")
def tiers_delete(name: Annotated[str, typer.Argument(help="tier name")]) -> None:
    """Delete a tier that no tenant is on."""
    with _transaction() as session:
        crud.delete_tier(session, name, actor=actor())
    console.print(f"deleted tier [bold]{name}[/]")


# -- tenants ----------------------------------------------------------------------------------


@tenants_app.command("create")
def tenants_create(
    name: Annotated[str, typer.Argument(help="tenant name")],
    tier: Annotated[str, typer.Option(help="tier name")],
    rpm: Annotated[int | None, typer.Option(help="override the tier's RPM limit")] = None,
    tpm: Annotated[int | None, typer.Option(help="override the tier's TPM limit")] = None,
    max_concurrency: Annotated[int | None, typer.Option(help="override the tier's")] = None,
    ttft_ms: Annotated[float | None, typer.Option(help="override the tier's TTFT SLO")] = None,
    tpot_ms: Annotated[float | None, typer.Option(help="override the tier's TPOT SLO")] = None,
) -> None:
    """Create a tenant on a tier."""
    with _transaction() as session:
        tenant = crud.create_tenant(
            session,
            actor=actor(),
            name=name,
            tier=tier,
            rpm_limit=rpm,
            tpm_limit=tpm,
            max_concurrency=max_concurrency,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
        )
    console.print(f"created tenant [bold]{tenant.name}[/] on tier {tier} (id {tenant.id})")


@tenants_app.command("list")
def tenants_list(
    tier: Annotated[str | None, typer.Option(help="only tenants on this tier")] = None,
) -> None:
    """List tenants."""
    with _transaction() as session:
        tenants = crud.list_tenants(session, tier=tier)
        rows = [
            (t.name, t.tier.name, t.status, t.rpm_limit, t.tpm_limit, t.max_concurrency)
            for t in tenants
        ]
    _print_table("tenants", ("name", "tier", "status", "RPM", "TPM", "concurrency"), rows)


@tenants_app.command("suspend")
def tenants_suspend(name: Annotated[str, typer.Argument(help="tenant name")]) -> None:
    """Suspend a tenant: its keys stop working until it is activated again."""
    with _transaction() as session:
        crud.suspend_tenant(session, name, actor=actor())
    console.print(f"suspended tenant [bold]{name}[/]")


@tenants_app.command("activate")
def tenants_activate(name: Annotated[str, typer.Argument(help="tenant name")]) -> None:
    """Re-activate a suspended tenant."""
    with _transaction() as session:
        crud.activate_tenant(session, name, actor=actor())
    console.print(f"activated tenant [bold]{name}[/]")


# -- keys -------------------------------------------------------------------------------------


def _print_new_key(tenant: str, plaintext: str) -> None:
    console.print(f"API key for tenant [bold]{tenant}[/] — shown once, store it now:")
    typer.echo(plaintext)  # raw, on its own line: no wrapping or markup around the key


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="tenant name")],
    name: Annotated[str | None, typer.Option(help="label, e.g. the application")] = None,
    expires_in_days: Annotated[
        int | None, typer.Option(min=1, help="expire after this many days (unset = never)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the key")] = False,
) -> None:
    """Issue an API key for a tenant and print it ONCE (only its hash is stored)."""
    now = utcnow()
    expires_at = now + timedelta(days=expires_in_days) if expires_in_days else None
    with _transaction() as session:
        created = crud.create_key(
            session,
            actor=actor(),
            tenant=tenant,
            secret=server_secret(get_settings()),
            name=name,
            expires_at=expires_at,
            now=now,
        )
    if quiet:
        typer.echo(created.plaintext)
    else:
        _print_new_key(tenant, created.plaintext)


@keys_app.command("revoke")
def keys_revoke(
    prefix: Annotated[str, typer.Argument(help="key prefix, e.g. tg-abcd1234")],
) -> None:
    """Revoke a key by its prefix."""
    with _transaction() as session:
        key = crud.revoke_key(session, prefix, actor=actor())
    console.print(f"revoked key {display_prefix(key.prefix)}")


@keys_app.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's keys")] = None,
    active: Annotated[bool, typer.Option("--active", help="only usable keys")] = False,
) -> None:
    """List keys (prefixes only; the keys themselves are not stored)."""
    now = utcnow()
    with _transaction() as session:
        keys = crud.list_keys(session, tenant=tenant, active_only=active, now=now)
        rows = []
        for k in keys:
            state = (
                "revoked"
                if k.revoked_at is not None
                else "expired"
                if k.expires_at is not None and k.expires_at <= now
                else "active"
            )
            rows.append(
                (
                    display_prefix(k.prefix),
                    k.tenant.name,
                    k.name,
                    state,
                    k.created_at.strftime("%Y-%m-%d %H:%M"),
                    k.expires_at.strftime("%Y-%m-%d") if k.expires_at else None,
                )
            )
    columns = ("prefix", "tenant", "name", "state", "created (UTC)", "expires")
    _print_table("keys", columns, rows)


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration_s(text: str) -> float:
    """``90s``, ``30m``, ``24h``, ``7d`` or a bare number of seconds."""
    value, unit = text.strip().lower(), "s"
    if value and value[-1] in _DURATION_UNITS:
        value, unit = value[:-1], value[-1]
    try:
        seconds = float(value) * _DURATION_UNITS[unit]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: use e.g. 90s, 30m, 24h, 7d or 0") from None
    if not 0 <= seconds < float("inf"):
        raise typer.BadParameter(f"{text!r}: a duration is 0 or more")
    return seconds


@keys_app.command("rotate")
def keys_rotate(
    prefix: Annotated[str, typer.Argument(help="the key to replace, e.g. tg-abcd1234")],
    grace: Annotated[
        str, typer.Option(help="how long the old key keeps working: 90s, 30m, 24h, 7d, 0")
    ] = "24h",
    expires_in_days: Annotated[
        int | None, typer.Option(min=1, help="the new key expires after this many days")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the new key")] = False,
) -> None:
    """Issue a key's successor (printed ONCE) and expire the old key after a grace period."""
    grace_s, now = _duration_s(grace), utcnow()
    expires_at = now + timedelta(days=expires_in_days) if expires_in_days else None
    with _transaction() as session:
        created = crud.rotate_key(
            session,
            prefix,
            actor=actor(),
            secret=server_secret(get_settings()),
            grace_s=grace_s,
            expires_at=expires_at,
            now=now,
        )
        tenant, old = created.api_key.tenant.name, crud.get_key(session, prefix)
        until = old.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC") if old.expires_at else "—"
    if quiet:
        typer.echo(created.plaintext)
        return
    console.print(f"{display_prefix(old.prefix)} keeps working until {until}")
    _print_new_key(tenant, created.plaintext)


@keys_app.command("secret-status")
def keys_secret_status(
    check: Annotated[
        bool, typer.Option("--check", help="exit 1 while a key may still need a previous secret")
    ] = False,
) -> None:
    """Usable keys by the server secret their hash is under (secret rotation: drop
    TIERGATE_SECRET_PREVIOUS once no key is left under it)."""
    with _transaction() as session:
        status = crud.secret_status(session, server_secret(get_settings()))
    rows: list[tuple[str, int]] = [("current", status.current)]
    rows += [(f"previous #{i + 1}", n) for i, n in enumerate(status.previous)]
    rows += [("unrecorded (before 0006)", status.unrecorded), ("none: refused", status.other)]
    _print_table("usable keys by the secret they are hashed under", ("secret", "keys"), rows)
    if status.waiting:
        console.print(
            f"{status.waiting} key(s) may still need a previous secret: each is re-hashed "
            "under the current one the first time it is used."
        )
    else:
        console.print("no usable key needs a previous secret: TIERGATE_SECRET_PREVIOUS can go")
    if check and status.waiting:
        raise typer.Exit(1)


# -- backends ---------------------------------------------------------------------------------


@backends_app.command("add")
def backends_add(
    name: Annotated[str, typer.Argument(help="backend name")],
    url: Annotated[str, typer.Option(help="base URL, e.g. http://10.0.0.5:8000")],
    model: Annotated[str, typer.Option(help="model name the backend serves")],
    profile: Annotated[
        str,
        typer.Option(
            help="latency profile: a shipped or stored name (`tiergate profiles list`), or a "
            "profile JSON file, stored first under its own name"
        ),
    ],
    kind: Annotated[str, typer.Option(help=f"one of {', '.join(BACKEND_KINDS)}")] = "vllm",
) -> None:
    """Register a backend."""
    with _transaction() as session:
        backend = crud.create_backend(
            session,
            actor=actor(),
            name=name,
            base_url=url,
            model=model,
            profile=_backend_profile(session, profile),
            kind=kind,
        )
    console.print(f"added backend [bold]{backend.name}[/] → {backend.base_url}")


@backends_app.command("list")
def backends_list() -> None:
    """List backends."""
    with _transaction() as session:
        rows = [
            (b.name, b.base_url, b.model, b.profile, b.kind, b.enabled)
            for b in crud.list_backends(session)
        ]
    _print_table("backends", ("name", "url", "model", "profile", "kind", "enabled"), rows)


@backends_app.command("disable")
def backends_disable(name: Annotated[str, typer.Argument(help="backend name")]) -> None:
    """Stop routing to a backend (kept for later)."""
    with _transaction() as session:
        crud.set_backend_enabled(session, name, False, actor=actor())
    console.print(f"disabled backend [bold]{name}[/]")


@backends_app.command("enable")
def backends_enable(name: Annotated[str, typer.Argument(help="backend name")]) -> None:
    """Route to a disabled backend again."""
    with _transaction() as session:
        crud.set_backend_enabled(session, name, True, actor=actor())
    console.print(f"enabled backend [bold]{name}[/]")


def _backend_profile(session: Session, value: str) -> str:
    """The profile name a new backend references: a known name as given, or the name of the
    profile JSON file ``value`` names, imported in the same transaction (once per document)."""
    if crud.is_known_profile(session, value):
        return value
    path = Path(value)
    if not path.is_file():
        if path.suffix == ".json" or os.sep in value:
            raise _fail(f"no profile is named {value!r} and no such profile file exists")
        return value  # the backend's validation reports the unknown name, listing known ones
    stored = crud.ensure_profile(session, _read_document(path), actor=actor())
    console.print(f"using stored profile [bold]{stored.name}[/] from {value}")
    return stored.name


# -- profiles ---------------------------------------------------------------------------------


def _read_document(path: Path) -> Any:
    """A profile file's JSON; unreadable or malformed files exit 2 naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise _fail(f"{path} is not valid JSON: {exc}") from None


@profiles_app.command("import")
def profiles_import(
    file: Annotated[Path, typer.Argument(help="profile JSON (`tiergate profile fit` output)")],
    name: Annotated[
        str | None, typer.Option(help="store under this name (default: the file's own name)")
    ] = None,
) -> None:
    """Store a latency profile in the database, so backends on any gateway can name it."""
    document = _read_document(file)
    with _transaction() as session:
        row = crud.import_profile(session, document, actor=actor(), name=name)
    console.print(f"imported profile [bold]{row.name}[/] from {file} (id {row.id})")


@profiles_app.command("list")
def profiles_list() -> None:
    """List the profiles backends can name: shipped ones and stored (custom) ones."""
    with _transaction() as session:
        rows = [
            (
                e.name,
                e.source,
                e.profile.hardware,
                e.profile.model,
                e.profile.tensor_parallel,
                e.row.created_at.strftime("%Y-%m-%d %H:%M") if e.row is not None else None,
                e.row.created_by if e.row is not None else None,
            )
            for e in crud.profile_catalog(session)
        ]
    # the name is what backends are given: never cut it short, wrap the rest instead
    name = Column("name", no_wrap=True)
    columns = (name, "source", "hardware", "model", "TP", "created (UTC)", "created by")
    _print_table("latency profiles", columns, rows)


@profiles_app.command("delete")
def profiles_delete(name: Annotated[str, typer.Argument(help="stored profile name")]) -> None:
    """Delete a stored profile that no backend uses."""
    with _transaction() as session:
        crud.delete_profile(session, name, actor=actor())
    console.print(f"deleted profile [bold]{name}[/]")


# -- usage ------------------------------------------------------------------------------------


def usage(
    by: Annotated[str, typer.Option(help="group by 'tenant' or 'tier'")] = "tenant",
    hours: Annotated[float, typer.Option(min=0.0, help="window: the last HOURS hours")] = 24.0,
) -> None:
    """Usage summary per tenant or tier: requests by outcome, then tokens and SLO attainment of
    finished requests and the TDG ratio of accepted work (rejected ones are never misses)."""
    if by not in ("tenant", "tier"):
        raise _fail(f"--by must be 'tenant' or 'tier', got {by!r}")
    since = utcnow() - timedelta(hours=hours)
    with _transaction() as session:
        summarize = crud.usage_by_tenant if by == "tenant" else crud.usage_by_tier
        summaries = summarize(session, since=since)
    rows = [
        (
            s.group,
            s.requests,
            s.ok,
            s.rejected,
            s.cancelled,
            s.errors,
            s.total_tokens,
            None if s.slo_attainment is None else f"{s.slo_attainment:.1%}",
            None if s.tdg_ratio is None else f"{s.tdg_ratio:.3f}",
        )
        for s in summaries
    ]
    # tokens and SLO attainment are those of finished (ok) requests: docs/usage.md
    columns = (
        Column(by, no_wrap=True),  # a name is never cut short; the numbers' headers wrap
        "requests",
        "ok",
        "rejected",
        "cancelled",
        "errors",
        "tokens",
        "SLO attainment",
        "TDG ratio",
    )
    _print_table(f"usage, last {hours:g} h", columns, rows)
