"""Engines and session factories, configured alike for SQLite and PostgreSQL.

SQLite needs two fixes to behave like a real database: foreign keys are off unless each
connection turns them on, and pysqlite's own transaction handling defers ``BEGIN`` and breaks
SAVEPOINTs, so we let SQLAlchemy emit ``BEGIN`` itself (the recipe in SQLAlchemy's SQLite notes).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from gateway.settings import get_settings


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN (below)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")


def make_engine(url: str | None = None, **kwargs: Any) -> Engine:
    """An engine for ``url`` (default: ``TIERGATE_DATABASE_URL``)."""
    url = url or get_settings().database_url
    if is_sqlite(url):
        kwargs.setdefault("connect_args", {}).setdefault("check_same_thread", False)
        engine = create_engine(url, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (results outlive their transaction).

    Use ``with factory.begin() as session:`` for one unit of work: it commits on success and
    rolls back on any exception, domain errors included.
    """
    return sessionmaker(bind=engine, expire_on_commit=False)
