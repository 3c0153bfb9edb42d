"""Migration 0012 on SQLite and PostgreSQL: the credential that existed becomes an owner and
keeps its dashboard sessions; a tenant admin must name a tenant (and only it may); deleting a
tenant deletes its admins; the downgrade keeps every credential."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from gateway.db import migrate
from gateway.db.session import make_engine

_TIER = (
    "INSERT INTO tiers (name, weight, ttft_ms, tpot_ms, best_effort_allowed, shed_slack, "
    "created_at, updated_at) VALUES ('t', 1, 500, 50, false, 0, CURRENT_TIMESTAMP, "
    "CURRENT_TIMESTAMP)"
)
_TENANT = (
    "INSERT INTO tenants (name, tier_id, status, created_at, updated_at) VALUES "
    "(:name, (SELECT id FROM tiers WHERE name = 't'), 'active', CURRENT_TIMESTAMP, "
    "CURRENT_TIMESTAMP)"
)
_CREDENTIAL = (
    "INSERT INTO operator_credentials (name, credential_hash, created_at{extra}) VALUES "
    "(:name, :hash, CURRENT_TIMESTAMP{values})"
)
_SESSION = (
    "INSERT INTO operator_sessions (token_hash, operator, credential_id, created_at, "
    "last_seen_at) VALUES ('s1', 'operator', (SELECT id FROM operator_credentials WHERE "
    "name = 'operator'), CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
)
_WITH_ROLE = _CREDENTIAL.format(
    extra=", role, tenant_id",
    values=", :role, (SELECT id FROM tenants WHERE name = :tenant)",
)


def _columns(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("operator_credentials")}
    finally:
        engine.dispose()


def test_0012_makes_the_existing_credential_an_owner_and_binds_tenant_admins(db_url: str) -> None:
    migrate.upgrade(db_url, "0011")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(_TIER))
            conn.execute(text(_TENANT), {"name": "acme"})
            conn.execute(
                text(_CREDENTIAL.format(extra="", values="")), {"name": "operator", "hash": "h0"}
            )
            conn.execute(text(_SESSION))
        migrate.upgrade(db_url, "0012")
        with engine.begin() as conn:
            row = conn.execute(text("SELECT role, tenant_id FROM operator_credentials")).one()
            assert tuple(row) == ("owner", None)
            sessions = conn.execute(text("SELECT count(*) FROM operator_sessions")).scalar_one()
            assert sessions == 1  # the rebuild signed nobody out
            conn.execute(
                text(_WITH_ROLE),
                {"name": "tina", "hash": "h1", "role": "tenant_admin", "tenant": "acme"},
            )
            conn.execute(
                text(_WITH_ROLE), {"name": "vera", "hash": "h2", "role": "viewer", "tenant": None}
            )
        refused = [
            {"name": "x1", "hash": "h3", "role": "tenant_admin", "tenant": None},  # no tenant
            {"name": "x2", "hash": "h4", "role": "viewer", "tenant": "acme"},  # a viewer bound
            {"name": "x3", "hash": "h5", "role": "root", "tenant": None},  # no such role
        ]
        for values in refused:
            with pytest.raises(IntegrityError), engine.begin() as conn:
                conn.execute(text(_WITH_ROLE), values)
        token = _CREDENTIAL.format(extra=", form_token_hash", values=", :token")
        with engine.begin() as conn:  # several credentials without a form token coexist
            conn.execute(text(token), {"name": "f1", "hash": "h6", "token": "t1"})
        with pytest.raises(IntegrityError), engine.begin() as conn:  # one per form token
            conn.execute(text(token), {"name": "f2", "hash": "h7", "token": "t1"})
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM operator_credentials WHERE name = 'f1'"))
        with engine.begin() as conn:  # the tenant goes, its admin with it
            conn.execute(text("DELETE FROM tenants WHERE name = 'acme'"))
            names = set(conn.execute(text("SELECT name FROM operator_credentials")).scalars())
            assert names == {"operator", "vera"}
        migrate.downgrade("0011", db_url)
        assert not {"role", "tenant_id", "form_token_hash"} & _columns(db_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM operator_credentials")).scalar_one() == 2
            assert conn.execute(text("SELECT count(*) FROM operator_sessions")).scalar_one() == 1
        migrate.upgrade(db_url)
        assert {"role", "tenant_id", "form_token_hash"} <= _columns(db_url)
    finally:
        engine.dispose()
