"""Alembic, driven from code: the migration scripts live in ``migrations/`` at the repo root.

No ``alembic.ini``: the configuration is built here so that the URL always comes from the
caller (or ``TIERGATE_DATABASE_URL``) and the CLI works from any directory. A new migration:
``command.revision(alembic_config(url), "message", autogenerate=True)`` against a database at
head, then review the script (keep ``sa.DateTime(timezone=True)`` for ``UTCDateTime``).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import SQLAlchemyError

from gateway.db.session import make_engine
from gateway.settings import get_settings

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str | None = None) -> Config:
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise RuntimeError(f"Alembic scripts not found in {MIGRATIONS_DIR}")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # '%' is ConfigParser interpolation syntax; URLs may contain it (escaped passwords).
    url = url or get_settings().database_url
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(revision: str, url: str | None = None) -> None:
    command.downgrade(alembic_config(url), revision)


def current_revisions(url: str | None = None) -> tuple[str, ...]:
    """The revision(s) the database is at; empty when it has never been migrated."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_heads()
    finally:
        engine.dispose()


def head_revisions() -> tuple[str, ...]:
    return tuple(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())


def schema_mismatch(url: str | None = None) -> str | None:
    """Why the database's schema is not the one this code expects (never migrated, or at
    another revision), in words; None when it is at head — or cannot be read, which is a
    different problem than migrations.

    Callers give the ``tiergate db upgrade`` hint only when this says so: an error is not a
    missing migration just because it came from the database.
    """
    try:
        current = current_revisions(url)
    except SQLAlchemyError:
        return None
    heads = head_revisions()
    if set(current) == set(heads):
        return None
    at = f"at {', '.join(current)}" if current else "not migrated"
    return f"the database schema is {at}; this tiergate needs {', '.join(heads)}"
