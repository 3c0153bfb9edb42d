"""Alembic migrations: round trip on both databases, and the migrated schema is the ORM's."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from gateway.db import crud, migrate
from gateway.db.errors import InUse
from gateway.db.models import Base
from gateway.db.session import make_engine, make_session_factory
from priority.profiles import load_profile

INITIAL_TABLES = {"tiers", "tenants", "api_keys", "backends", "usage_records", "audit_log"}
TABLES = INITIAL_TABLES | {"latency_profiles"}  # 0002


def _schema_diff(url: str) -> list[object]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_round_trip_upgrade_downgrade_upgrade(db_url: str) -> None:
    assert migrate.current_revisions(db_url) == ()
    migrate.upgrade(db_url)
    assert migrate.current_revisions(db_url) == migrate.head_revisions()
    assert _tables(db_url) == TABLES
    migrate.downgrade("base", db_url)
    assert migrate.current_revisions(db_url) == ()
    assert _tables(db_url) == set()
    migrate.upgrade(db_url, "head")
    assert _tables(db_url) == TABLES


def test_migrated_schema_matches_the_orm(db_url: str) -> None:
    # Not vacuous: against the empty database the comparison does find the missing tables.
    assert len(_schema_diff(db_url)) >= len(TABLES)
    migrate.upgrade(db_url)
    assert _schema_diff(db_url) == []


def test_foreign_keys_are_enforced_after_migration(db_url: str) -> None:
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tenants (name, tier_id, status, created_at, updated_at) "
                    "VALUES ('orphan', 12345, 'active', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
    finally:
        engine.dispose()


def test_each_revision_upgrades_and_downgrades_by_one_step(db_url: str) -> None:
    migrate.upgrade(db_url, "0001")
    assert migrate.current_revisions(db_url) == ("0001",)
    assert _tables(db_url) == INITIAL_TABLES
    migrate.upgrade(db_url, "0002")
    assert _tables(db_url) == TABLES
    migrate.downgrade("0001", db_url)
    assert migrate.current_revisions(db_url) == ("0001",)
    assert _tables(db_url) == INITIAL_TABLES
    migrate.upgrade(db_url)
    assert migrate.current_revisions(db_url) == ("0002",) == migrate.head_revisions()


def _store_profile_used_by_a_backend(url: str) -> None:
    engine = make_engine(url)
    try:
        with make_session_factory(engine).begin() as s:
            document = {**load_profile("a100-qwen2-7b").to_dict(), "name": "site-a100"}
            crud.import_profile(s, document, actor="test")
            crud.create_backend(
                s, actor="test", name="b1", base_url="http://h:1", model="m", profile="site-a100"
            )
    finally:
        engine.dispose()


def test_downgrade_below_0002_refuses_while_backends_use_stored_profiles(db_url: str) -> None:
    migrate.upgrade(db_url)
    _store_profile_used_by_a_backend(db_url)
    with pytest.raises(InUse, match=r"backend\(s\) b1 \(site-a100\) use stored latency"):
        migrate.downgrade("0001", db_url)
    assert migrate.current_revisions(db_url) == ("0002",)
    assert _tables(db_url) == TABLES  # nothing dropped
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM backends"))
    finally:
        engine.dispose()
    migrate.downgrade("0001", db_url)
    assert _tables(db_url) == INITIAL_TABLES
