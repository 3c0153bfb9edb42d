"""Engines and session factories, configured alike for SQLite and PostgreSQL.

Every engine hides statement parameters (``hide_parameters=True``): an error's text, and so any
traceback or log line made of it, never carries a value — an API key's hash included.

SQLite needs three fixes to behave like a real database under concurrent writers (the gateway's
threads, a second gateway, the CLI in another process):

* foreign keys are off unless each connection turns them on;
* pysqlite's own transaction handling defers ``BEGIN`` and breaks SAVEPOINTs, so SQLAlchemy emits
  ``BEGIN`` itself (the recipe in SQLAlchemy's SQLite notes);
* a deferred transaction that reads and then writes must upgrade its read lock to a write lock
  while another connection may hold it. SQLite refuses that upgrade at once with "database is
  locked" — waiting could deadlock, so the busy timeout is not even consulted. Write
  transactions therefore start with ``BEGIN IMMEDIATE``, which takes the write lock first and
  waits for it (up to the busy timeout) like any lock. Writers queue instead of failing, in
  this process and across processes, since the lock is the database file's own.

Which transactions write is the project's convention: a unit of work is opened explicitly
(``with factory.begin()`` or ``with session.begin()``) and takes the write lock there; reads
use the session as is (autobegin, plain ``BEGIN``). WAL journaling lets those reads go on
while a writer holds the lock.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from gateway.settings import get_settings

SQLITE_BUSY_TIMEOUT_MS = 10_000
"""How long a SQLite writer waits for the write lock before the database counts as busy."""

WRITE_TRANSACTION = "tiergate_write_transaction"
"""Connection execution option: this transaction writes (SQLite: ``BEGIN IMMEDIATE``)."""


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN (below)
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")  # first: WAL may wait
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")  # kept in the file; in-memory ones say 'memory'
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        writes = connection.get_execution_options().get(WRITE_TRANSACTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")


def make_engine(url: str | None = None, **kwargs: Any) -> Engine:
    """An engine for ``url`` (default: ``TIERGATE_DATABASE_URL``)."""
    url = url or get_settings().database_url
    kwargs.setdefault("hide_parameters", True)
    if is_sqlite(url):
        kwargs.setdefault("connect_args", {}).setdefault("check_same_thread", False)
        engine = create_engine(url, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


class UnitOfWorkSession(Session):
    """A session whose explicitly begun transactions are write transactions.

    ``begin()`` (what ``factory.begin()`` and ``with session.begin():`` call) takes the
    connection at once, on SQLite with ``BEGIN IMMEDIATE``: the unit of work waits for the write
    lock before it reads anything, so its later writes cannot be refused. Elsewhere nothing
    changes (PostgreSQL locks rows, not the database).
    """

    def begin(self, nested: bool = False) -> SessionTransaction:
        transaction = super().begin(nested=nested)
        if nested or not _on_sqlite(self):
            return transaction
        try:
            self.connection(execution_options={WRITE_TRANSACTION: True})
        except BaseException:
            self.rollback()  # e.g. the lock stayed busy: leave no half-begun transaction behind
            raise
        return transaction


def _on_sqlite(session: Session) -> bool:
    bind = session.bind
    return bind is not None and bind.dialect.name == "sqlite"


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (results outlive their transaction).

    Use ``with factory.begin() as session:`` for one unit of work that writes: it takes the
    write lock up front (see :class:`UnitOfWorkSession`), commits on success and rolls back on
    any exception, domain errors included. Plain reads use ``with factory() as session:``.
    """
    return sessionmaker(bind=engine, class_=UnitOfWorkSession, expire_on_commit=False)
