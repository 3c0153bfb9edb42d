"""A database seeded for app-level tests: the schema, the default tiers, one tenant and its key.

Several test modules build the whole gateway app on such a database (the error dialect, the
OpenAPI contract, text safety); they differ only in the settings they override.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from gateway.db import crud
from gateway.db.models import Base
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings


def seed_database(url: str, secret: str, tenant: str = "acme") -> tuple[Engine, str]:
    """Create the schema at ``url``, seed the default tiers and ``tenant`` (tier ``standard``);
    return the engine and the tenant's new API key."""
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    with make_session_factory(engine).begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name=tenant, tier="standard")
        key = crud.create_key(session, actor="test", tenant=tenant, secret=secret).plaintext
    return engine, key


def app_settings(url: str, root: Path, secret: str, admin_key: str, **overrides: Any) -> Settings:
    """The gateway's settings for ``url``: the admin API on, no Redis, data under ``root``."""
    return Settings(
        database_url=url,
        secret=SecretStr(secret),
        admin_key=SecretStr(admin_key),
        data_dir=root,
        redis_url=None,
        **overrides,
    )


@contextmanager
def empty_postgres_schema(server_url: str, prefix: str = "t") -> Iterator[str]:
    """A URL of ``server_url`` whose search_path is a new, empty schema, dropped afterwards (for
    module-scoped apps: the conftest's per-test ``postgres_url`` would not outlive one test)."""
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = make_url(server_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text("SET lock_timeout = '5s'"))
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def create_agents_tier(session: Any) -> None:
    """A tier for agent workflows, whose deadlines may be short in tests (a 1 ms deadline
    floor), with best effort allowed."""
    crud.create_tier(
        session,
        actor="test",
        name="agents",
        weight=2.0,
        ttft_ms=500.0,
        tpot_ms=50.0,
        min_deadline_ms=1.0,
        best_effort_allowed=True,
    )
