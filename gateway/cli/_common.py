"""What every admin command shares: the consoles, the audit actor, the unit of work and its
exit codes, the option bounds of :mod:`gateway.bounds`, table printing.

Bad input exits with code 2 and one precise line on stderr (a :class:`DomainError`'s message,
or typer's own refusal of an option); a database that is busy, unreachable or not migrated
exits 1, worded by what it means, never with the database's own text.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TypeVar

import typer
from rich.console import Console
from rich.table import Column, Table
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gateway.bounds import MAX_LIMIT, MAX_SLO_MS, MIN_LIMIT, MIN_SLO_MS
from gateway.db import migrate
from gateway.db.errors import DatabaseFailure, DomainError, classify, describe
from gateway.db.session import SQLITE_BUSY_TIMEOUT_MS, make_engine, make_session_factory
from gateway.settings import get_settings

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def actor() -> str:
    """``cli:<os user>``: who ran the command, for the audit log."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (containers)
        return f"cli:uid{os.getuid()}"


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as the command's one error line; raise the returned exit."""
    err_console.print(f"[bold red]Error:[/] {message}", soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def transaction() -> Iterator[Session]:
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
        raise fail(exc.message) from None
    except SQLAlchemyError as exc:
        raise database_failure(exc, url) from None
    finally:
        engine.dispose()


def database_failure(exc: SQLAlchemyError, url: str) -> typer.Exit:
    """The exit for a database error, worded by what it means (never its text, which can carry
    values); the ``tiergate db upgrade`` hint only when the schema really is not at head."""
    failure = classify(exc)
    if failure is DatabaseFailure.CONFLICT:
        return fail("the change conflicts with a concurrent one; check the current state, retry")
    if failure is DatabaseFailure.INVALID:
        return fail(f"a value is outside what the database allows ({describe(exc)})")
    if failure is DatabaseFailure.BUSY:
        return fail(
            f"the database stayed busy (other writers held its lock for over "
            f"{SQLITE_BUSY_TIMEOUT_MS / 1000:g} s, or its connections ran out); try again",
            code=1,
        )
    where = make_url(url).render_as_string(hide_password=True)
    if failure is DatabaseFailure.UNAVAILABLE:
        return fail(
            f"cannot reach the database at {where} ({describe(exc)}): is it running, and is "
            "TIERGATE_DATABASE_URL right?",
            code=1,
        )
    mismatch = migrate.schema_mismatch(url)
    if mismatch is not None:
        return fail(f"{mismatch}: run `tiergate db upgrade`", code=1)
    return fail(f"database error at {where}: {describe(exc)}", code=1)


def fmt(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def print_table(
    title: str, columns: Sequence[str | Column], rows: Iterable[Sequence[object]]
) -> None:
    """A listing: one rich table row per item, every value shown through :func:`fmt`."""
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(fmt(value) for value in row))
    console.print(table)


def print_changes(what: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """``updated <what>: field old → new, ...``, or that nothing changed (no audit row then)."""
    changed = [key for key in after if before.get(key) != after[key]]
    if not changed:
        console.print(f"{what}: nothing changed (already as given)")
        return
    diff = ", ".join(f"{k} {fmt(before.get(k))} → {fmt(after[k])}" for k in changed)
    console.print(f"updated {what}: {diff}", soft_wrap=True)


# -- options ----------------------------------------------------------------------------------


def bounded(low: float, high: float, help_text: str, *names: str) -> Any:
    """An option refused outside ``[low, high]`` (exit code 2, naming the option and the
    range): the bounds of :mod:`gateway.bounds`, which the admin API and the database apply.
    ``names``: the option's names, the first the one shown (default: the parameter's)."""
    return typer.Option(*names, min=low, max=high, help=f"{help_text}; {low:g} to {high:g}")


def slo_ms_option(help_text: str) -> Any:
    """An SLO in milliseconds (a tier's default, a tenant's override)."""
    return bounded(MIN_SLO_MS, MAX_SLO_MS, help_text)


def limit_option(help_text: str, *names: str) -> Any:
    """A rate or concurrency limit (a tier's, a tenant's override)."""
    return bounded(MIN_LIMIT, MAX_LIMIT, help_text, *names)


RPM_NAMES = ("--rpm-limit", "--rpm")
"""``--rpm-limit`` as the admin API's ``rpm_limit``; ``--rpm`` was its name before (alias)."""
TPM_NAMES = ("--tpm-limit", "--tpm")
_ALIASES = {"rpm": "rpm_limit", "tpm": "tpm_limit"}
"""``--clear``'s names before (``rpm``, ``tpm``) for the fields they clear."""


def read_document(path: Path) -> Any:
    """A profile file's JSON; unreadable or malformed files exit 2 naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise fail(f"{path} is not valid JSON: {exc}") from None


class _Named(Protocol):
    @property
    def id(self) -> int: ...


RowT = TypeVar("RowT", bound=_Named)


def update_row(
    entity: str,
    ref: str,
    changes: dict[str, Any],
    get: Callable[[Session, str], RowT],
    update: Callable[..., RowT],
    shown: Callable[[RowT], dict[str, Any]],
) -> None:
    """An ``update`` command's change, audited, and what it changed (``shown``: the fields
    reported, ``name`` among them), in one transaction."""
    with transaction() as session:
        row = get(session, ref)
        before = shown(row)
        row = update(session, row.id, changes, actor=actor())
        after = shown(row)
    print_changes(f"{entity} [bold]{after['name']}[/]", before, after)


def partial_update(given: Mapping[str, Any], cleared: Iterable[StrEnum] | None) -> dict[str, Any]:
    """The changes an ``update`` command sends: the options given (not None) and the fields
    ``--clear`` names set to None, as the admin API's PATCH takes them.

    ``cleared``: members of the command's enum of what ``--clear`` takes, each named as its
    field (or ``rpm``, ``tpm``: the names before). A field both given and cleared, or no change
    at all, exits 2: an update that silently did one of the two, or nothing, would hide a typo.
    """
    changes = {field: value for field, value in given.items() if value is not None}
    for option in cleared or ():
        field = _ALIASES.get(option.name, option.name)
        if field in changes:
            name = type(option)[field]  # the option's current name, not an alias
            raise fail(f"--{name} and --clear {name} contradict each other")
        changes[field] = None
    if not changes:
        raise fail("nothing to update: give at least one option to change (see --help)")
    return changes
