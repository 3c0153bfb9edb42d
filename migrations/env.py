"""Alembic environment of the tiergate gateway database (driven by gateway.db.migrate).

SQLite gets batch mode (it cannot ALTER most things in place) and foreign keys, through the
same engine set-up as the application.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from gateway.db.models import Base
from gateway.db.session import is_sqlite, make_engine

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=is_sqlite(str(connection.engine.url)),
        compare_type=True,
    )


def run_offline() -> None:
    """``--sql`` mode: emit the DDL instead of running it."""
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=bool(url) and is_sqlite(str(url)),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:  # a caller lent us its connection
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
