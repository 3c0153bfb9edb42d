"""Fixtures: the admin API on both databases, or on SQLite alone (see :mod:`.support`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.models import Base
from gateway.db.session import make_engine, make_session_factory

from .support import Admin, running_admin


@pytest.fixture
def admin(session_factory: sessionmaker[Session], server_secret: str) -> Iterator[Admin]:
    """The admin API on SQLite and on PostgreSQL."""
    with running_admin(session_factory, server_secret) as a:
        yield a


@pytest.fixture
def sqlite_admin(sqlite_url: str, server_secret: str) -> Iterator[Admin]:
    """The admin API on SQLite only, for checks that end before the database is touched."""
    engine = make_engine(sqlite_url)
    Base.metadata.create_all(engine)
    try:
        with running_admin(make_session_factory(engine), server_secret) as a:
            yield a
    finally:
        engine.dispose()
