"""Alembic migrations: round trip on both databases, and the migrated schema is the ORM's."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import CheckConstraint, inspect, text
from sqlalchemy.exc import IntegrityError

from gateway.bounds import MAX_LIMIT, MAX_SLO_MS, MAX_WEIGHT, MIN_LIMIT, MIN_SLO_MS, MIN_WEIGHT
from gateway.db import crud, migrate
from gateway.db.errors import InUse
from gateway.db.models import TENANT_CHECKS, TIER_CHECKS, Base
from gateway.db.session import make_engine, make_session_factory
from priority.profiles import load_profile

INITIAL_TABLES = {"tiers", "tenants", "api_keys", "backends", "usage_records", "audit_log"}
TABLES_0002 = INITIAL_TABLES | {"latency_profiles"}
TABLES = TABLES_0002 | {
    "operator_credentials",
    "operator_sessions",
    "length_samples",
    "model_prices",
    "budgets",
    "request_log",
}  # head


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
    assert _tables(db_url) == TABLES_0002
    migrate.downgrade("0001", db_url)
    assert migrate.current_revisions(db_url) == ("0001",)
    assert _tables(db_url) == INITIAL_TABLES
    migrate.upgrade(db_url, "0003")
    assert _checks(db_url, "tiers") == _orm_checks("tiers")
    migrate.downgrade("0002", db_url)
    assert migrate.current_revisions(db_url) == ("0002",)
    assert _checks(db_url, "tiers") == {"ck_tiers_" + n for n in OLD_TIER_CHECKS}
    migrate.upgrade(db_url)
    assert migrate.current_revisions(db_url) == migrate.head_revisions()


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
    migrate.downgrade("0002", db_url)  # PostgreSQL runs a downgrade's steps in one transaction
    with pytest.raises(InUse, match=r"backend\(s\) b1 \(site-a100\) use stored latency"):
        migrate.downgrade("0001", db_url)
    assert migrate.current_revisions(db_url) == ("0002",)
    assert _tables(db_url) == TABLES_0002  # nothing dropped
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM backends"))
    finally:
        engine.dispose()
    migrate.downgrade("0001", db_url)
    assert _tables(db_url) == INITIAL_TABLES


# ---- 0003: numeric bounds ------------------------------------------------------------------

OLD_TIER_CHECKS = ("weight_positive", "slo_positive", "deadline_positive")


def _checks(url: str, table: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {str(c["name"]) for c in inspect(engine).get_check_constraints(table)}
    finally:
        engine.dispose()


def _orm_checks(table: str) -> set[str]:
    constraints = Base.metadata.tables[table].constraints
    return {str(c.name) for c in constraints if isinstance(c, CheckConstraint)}


def _migration_0003() -> Any:
    path = migrate.MIGRATIONS_DIR / "versions" / "0003_numeric_bounds.py"
    spec = importlib.util.spec_from_file_location("migration_0003", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_0003_writes_the_orms_bounds() -> None:
    """The migration states its bounds as literals (a migration never changes); they are the
    ORM's, which read gateway.bounds."""
    migration = _migration_0003()
    assert migration.TIER_CHECKS == TIER_CHECKS
    assert migration.TENANT_CHECKS == TENANT_CHECKS
    assert (migration.WEIGHT, migration.SLO_MS, migration.LIMIT) == (
        (MIN_WEIGHT, MAX_WEIGHT),
        (MIN_SLO_MS, MAX_SLO_MS),
        (MIN_LIMIT, MAX_LIMIT),
    )


OUT_OF_BOUNDS = [
    ("tiers", "weight", 1e308),
    ("tiers", "weight", 1e-308),
    ("tiers", "ttft_ms", 1e12),
    ("tiers", "tpot_ms", 1e-9),
    ("tiers", "deadline_ms", 5e12),
    ("tiers", "min_ttft_ms", 1e-6),
    ("tiers", "rpm_limit", 0),
    ("tenants", "ttft_ms", 1e-300),
    ("tenants", "max_concurrency", -5),
]


def test_the_database_refuses_numbers_out_of_bounds(db_url: str) -> None:
    """The last line of defence, whatever wrote the row (not the API, not the CLI)."""
    migrate.upgrade(db_url)
    _seed_tier_tenant_key_usage(db_url)
    engine = make_engine(db_url)
    try:
        for table, column, value in OUT_OF_BOUNDS:
            with pytest.raises(IntegrityError), engine.begin() as conn:
                conn.execute(text(f"UPDATE {table} SET {column} = :v"), {"v": value})
        with engine.begin() as conn:  # the edges are in
            conn.execute(text("UPDATE tiers SET weight = :w"), {"w": MAX_WEIGHT})
            conn.execute(text("UPDATE tenants SET ttft_ms = :t"), {"t": MIN_SLO_MS})
    finally:
        engine.dispose()


def _seed_tier_tenant_key_usage(url: str) -> None:
    """A tier, a tenant, a key and a usage record, in SQL: the tests seed at old revisions,
    whose tables lack the ORM's later columns."""
    statements = (
        "INSERT INTO tiers (name, weight, ttft_ms, tpot_ms, best_effort_allowed, created_at, "
        "updated_at) VALUES ('gold', 3.0, 100.0, 10.0, false, CURRENT_TIMESTAMP, "
        "CURRENT_TIMESTAMP)",
        "INSERT INTO tenants (name, tier_id, status, created_at, updated_at) SELECT 'acme', id, "
        "'active', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP FROM tiers WHERE name = 'gold'",
        "INSERT INTO api_keys (tenant_id, prefix, key_hash, created_at) SELECT id, 'abcd1234', "
        "'0123456789abcdef', CURRENT_TIMESTAMP FROM tenants WHERE name = 'acme'",
        "INSERT INTO usage_records (request_id, tenant_id, api_key_id, prompt_tokens, "
        "completion_tokens, gain, ideal_gain, slo_met, status, created_at) "
        "SELECT 'r-1', k.tenant_id, k.id, 1, 1, 0, 0, false, 'ok', CURRENT_TIMESTAMP "
        "FROM api_keys k",
    )
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql))]
    finally:
        engine.dispose()


def test_0003_clamps_rows_out_of_bounds_and_keeps_every_reference(db_url: str) -> None:
    """Rows 0002 allowed but the gain cannot take are moved to the nearest bound; rebuilding
    the tables on SQLite loses no API key and no usage record's tenant (with foreign keys
    enforced, dropping ``tenants`` would cascade to its keys)."""
    migrate.upgrade(db_url, "0002")
    _seed_tier_tenant_key_usage(db_url)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE tiers SET weight = 1e308, ttft_ms = 1e12, tpot_ms = 1e-9, "
                    "deadline_ms = 5e12, min_tpot_ms = 1e-9, rpm_limit = 0"
                )
            )
            conn.execute(text("UPDATE tenants SET ttft_ms = 1e-300, max_concurrency = -5"))
    finally:
        engine.dispose()
    usage_before = _rows(db_url, "SELECT tenant_id, api_key_id FROM usage_records")
    migrate.upgrade(db_url)
    assert _rows(
        db_url, "SELECT weight, ttft_ms, tpot_ms, deadline_ms, min_tpot_ms, rpm_limit FROM tiers"
    ) == [(MAX_WEIGHT, MAX_SLO_MS, MIN_SLO_MS, MAX_SLO_MS, MIN_SLO_MS, MIN_LIMIT)]
    assert _rows(db_url, "SELECT ttft_ms, max_concurrency FROM tenants") == [
        (MIN_SLO_MS, MIN_LIMIT)
    ]
    assert _rows(db_url, "SELECT COUNT(*) FROM api_keys") == [(1,)]
    assert _rows(db_url, "SELECT tenant_id, api_key_id FROM usage_records") == usage_before
    assert None not in usage_before[0]
    assert _checks(db_url, "tiers") == _orm_checks("tiers")
    assert _checks(db_url, "tenants") == _orm_checks("tenants")
    migrate.downgrade("0002", db_url)  # the clamped values satisfy 0002's constraints
    assert _rows(db_url, "SELECT COUNT(*) FROM api_keys") == [(1,)]
    assert _rows(db_url, "SELECT tenant_id, api_key_id FROM usage_records") == usage_before
    assert _checks(db_url, "tenants") == {"ck_tenants_status"}


def _columns(url: str, table: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {str(c["name"]) for c in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def _tier_columns(url: str) -> set[str]:
    return _columns(url, "tiers")


def test_0009_adds_the_default_kind_and_existing_tiers_stay_latency(db_url: str) -> None:
    migrate.upgrade(db_url, "0008")
    assert "default_kind" not in _tier_columns(db_url)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tiers (name, weight, ttft_ms, tpot_ms, best_effort_allowed, "
                    "shed_slack, created_at, updated_at) VALUES ('old', 1, 500, 50, false, 0, "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
        migrate.upgrade(db_url, "0009")
        with engine.connect() as conn:
            kind = conn.execute(text("SELECT default_kind FROM tiers WHERE name = 'old'"))
            assert kind.scalar_one() == "latency"
        migrate.downgrade("0008", db_url)
        assert "default_kind" not in _tier_columns(db_url)
        with engine.connect() as conn:  # the tier itself survives the downgrade
            assert conn.execute(text("SELECT count(*) FROM tiers")).scalar_one() == 1
    finally:
        engine.dispose()


def test_0010_adds_length_samples_and_its_downgrade_drops_them(db_url: str) -> None:
    migrate.upgrade(db_url, "0009")
    assert "length_samples" not in _tables(db_url)
    migrate.upgrade(db_url, "0010")
    assert "length_samples" in _tables(db_url)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:  # a row of each finish; any other is refused
            for finish in ("stop", "length"):
                conn.execute(
                    text(
                        "INSERT INTO length_samples (model, layout, features, prompt_tokens, "
                        "output_tokens, finish, created_at) VALUES ('m', 'l', :f, 3, 4, :finish, "
                        "CURRENT_TIMESTAMP)"
                    ),
                    {"f": b"\x00\x01", "finish": finish},
                )
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO length_samples (model, layout, features, prompt_tokens, "
                    "output_tokens, finish, created_at) VALUES ('m', 'l', :f, 3, 4, 'cancel', "
                    "CURRENT_TIMESTAMP)"
                ),
                {"f": b"\x00"},
            )
    finally:
        engine.dispose()
    migrate.downgrade("0009", db_url)
    assert "length_samples" not in _tables(db_url)


def _api_key_columns(url: str) -> set[str]:
    return _columns(url, "api_keys")


_INSERT_KEY = (
    "INSERT INTO api_keys (tenant_id, prefix, key_hash, created_at{extra}) VALUES "
    "((SELECT id FROM tenants WHERE name = 'acme'), :prefix, :hash, CURRENT_TIMESTAMP{value})"
)


def test_0011_adds_the_unique_form_token_hash_and_its_downgrade_keeps_the_keys(
    db_url: str,
) -> None:
    migrate.upgrade(db_url, "0010")
    assert "form_token_hash" not in _api_key_columns(db_url)
    engine = make_engine(db_url)
    insert = text(_INSERT_KEY.format(extra="", value=""))
    with_token = text(_INSERT_KEY.format(extra=", form_token_hash", value=", :token"))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tiers (name, weight, ttft_ms, tpot_ms, best_effort_allowed, "
                    "shed_slack, created_at, updated_at) VALUES ('t', 1, 500, 50, false, 0, "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO tenants (name, tier_id, status, created_at, updated_at) VALUES "
                    "('acme', (SELECT id FROM tiers WHERE name = 't'), 'active', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(insert, {"prefix": "old00001", "hash": "h1"})
        migrate.upgrade(db_url, "0011")
        with engine.begin() as conn:  # the old key has none; several keys without one coexist
            token = conn.execute(text("SELECT form_token_hash FROM api_keys")).scalar_one()
            assert token is None
            conn.execute(insert, {"prefix": "new00002", "hash": "h2"})
            conn.execute(with_token, {"prefix": "new00003", "hash": "h3", "token": "f1"})
        with pytest.raises(IntegrityError), engine.begin() as conn:  # one key per form token
            conn.execute(with_token, {"prefix": "new00004", "hash": "h4", "token": "f1"})
        migrate.downgrade("0010", db_url)
        assert "form_token_hash" not in _api_key_columns(db_url)
        with engine.connect() as conn:  # every key survives the downgrade
            assert conn.execute(text("SELECT count(*) FROM api_keys")).scalar_one() == 3
        migrate.upgrade(db_url)
        assert "form_token_hash" in _api_key_columns(db_url)
    finally:
        engine.dispose()
