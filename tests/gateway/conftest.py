"""Database fixtures for gateway tests, on SQLite and a real PostgreSQL.

* ``db_url`` — an EMPTY database, parametrized ``sqlite`` (a temp file) and ``postgresql``
  (a fresh schema in a per-session database). Use ``sqlite_url`` / ``postgres_url`` for one.
* ``db_engine`` / ``session_factory`` / ``db_session`` — parametrized the same way, with the
  schema created and no rows (PostgreSQL: a shared schema emptied after each test).
* ``server_secret`` — an HMAC secret for API keys.

PostgreSQL comes from ``TIERGATE_TEST_POSTGRES_URL`` (default: the local server, user postgres,
database ``test``). When it is unreachable its tests are skipped with the reason — except under
``CI=true``, where they fail: CI must not silently lose half the matrix.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.models import Base
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import get_settings
from tests.gateway.private_redis import PrivateRedis, need_redis_server

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(autouse=True)
def _isolated_settings(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """No gateway test uses the developer's database or secret, or writes to ~/.tiergate.

    Only the data layer's variables are reset; others (e.g. ``TIERGATE_REDIS_URL`` naming a
    test server) are left for the tests that read them.
    """
    monkeypatch.delenv("TIERGATE_DATABASE_URL", raising=False)
    monkeypatch.delenv("TIERGATE_SECRET", raising=False)
    monkeypatch.delenv("TIERGATE_SECRET_PREVIOUS", raising=False)
    monkeypatch.setenv("TIERGATE_DATA_DIR", str(tmp_path_factory.mktemp("tiergate-data")))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """A URL of the PostgreSQL server's maintenance database; skips (fails in CI) if down."""
    url = os.environ.get("TIERGATE_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        where = make_url(url).render_as_string()  # password masked
        reason = f"PostgreSQL unreachable at {where}: {exc.__class__.__name__}"
        if _in_ci():
            pytest.fail(f"{reason} (CI=true: PostgreSQL tests must run)")
        pytest.skip(reason)
    finally:
        engine.dispose()
    return url


@pytest.fixture(scope="session")
def postgres_database_url(postgres_server_url: str) -> Iterator[str]:
    """A database created for this test session, dropped at its end."""
    name = f"tiergate_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(postgres_server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _new_schema(database_url: str) -> tuple[str, str]:
    """Create an empty schema; returns it and a URL whose search_path points at it."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    finally:
        admin.dispose()
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return schema, url.render_as_string(hide_password=False)


def _drop_schema(database_url: str, schema: str) -> None:
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text("SET lock_timeout = '5s'"))
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        admin.dispose()


@pytest.fixture
def postgres_url(postgres_database_url: str) -> Iterator[str]:
    """An empty schema of its own per test (search_path points at it), dropped afterwards."""
    schema, url = _new_schema(postgres_database_url)
    try:
        yield url
    finally:
        _drop_schema(postgres_database_url, schema)


@pytest.fixture(scope="session")
def _postgres_schema_with_tables(postgres_database_url: str) -> Iterator[str]:
    """One schema with the ORM tables for the whole session; tests empty it after use.

    Creating the tables for every test would cost ~0.15 s each; deleting the rows is cheap.
    """
    schema, url = _new_schema(postgres_database_url)
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    try:
        yield url
    finally:
        _drop_schema(postgres_database_url, schema)


def _delete_all_rows(url: str) -> None:
    """Empty every table (DELETE: much faster than TRUNCATE on tables this small)."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '5s'"))
            for table in reversed(Base.metadata.sorted_tables):
                conn.execute(table.delete())
    finally:
        engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tiergate.db'}"


@pytest.fixture
def factory(sqlite_url: str) -> Iterator[sessionmaker[Session]]:
    """Sessions on an empty SQLite database with the ORM schema (the app-level tests' own)."""
    engine = make_engine(sqlite_url)
    Base.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """An empty database on each backend."""
    name = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    return str(request.getfixturevalue(name))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine on each backend with the ORM schema (the migrations give the same one), empty.

    Close sessions and background writers before the test ends: PostgreSQL's tables are
    emptied afterwards for the next test.
    """
    if request.param == "sqlite":
        engine = make_engine(str(request.getfixturevalue("sqlite_url")))
        Base.metadata.create_all(engine)
        try:
            yield engine
        finally:
            engine.dispose()
        return
    url = str(request.getfixturevalue("_postgres_schema_with_tables"))
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()
        _delete_all_rows(url)


@pytest.fixture
def session_factory(db_engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(db_engine)


@pytest.fixture
def db_session(session_factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session for one test; commit what you want other sessions to see."""
    with session_factory() as session:
        yield session


@pytest.fixture
def server_secret() -> str:
    return "test-server-secret-" + uuid.uuid4().hex


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of the test's own (:mod:`tests.gateway.private_redis`), killed after."""
    need_redis_server()
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()
