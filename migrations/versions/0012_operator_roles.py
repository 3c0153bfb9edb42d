"""Named operators with roles: each operator credential gets a role and, for a tenant admin,
its tenant.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28

* ``operator_credentials.role`` (``owner | operator | viewer | tenant_admin``, CHECK
  ``ck_operator_credentials_role``), NOT NULL with the server default ``owner``: every
  credential that exists before this revision (the one ``tiergate serve`` printed, those of
  ``tiergate admin reset-credential``) keeps doing everything it did.
* ``operator_credentials.tenant_id`` (nullable, ``ON DELETE CASCADE`` to ``tenants.id``,
  indexed): the one tenant a tenant admin administers. CHECK
  ``ck_operator_credentials_role_tenant``: a tenant admin names a tenant, no other role does.
* ``operator_credentials.form_token_hash`` (nullable, unique index
  ``uq_operator_credentials_form_token_hash``): the keyed hash of the dashboard form that issued
  the credential, so that reloading the page that showed it issues no second one (as 0011 does
  for keys). NULL for credentials from the API, the CLI and before this revision.

On SQLite adding a foreign key or a CHECK rebuilds the table (Alembic's batch mode). Dropping
the old ``operator_credentials`` with foreign keys enforced would cascade to every dashboard
session, so enforcement is switched off around the rebuild and every reference is checked
before it is switched back on (as 0003 does). PostgreSQL alters the table in place.

The downgrade drops the three columns: the credentials stay (a tenant admin's then does everything,
as every credential did before roles; drop them first with ``tiergate operators delete`` if
that is not wanted).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "operator_credentials"
ROLES = ("owner", "operator", "viewer", "tenant_admin")


def upgrade() -> None:
    with _sqlite_foreign_keys_off(), op.batch_alter_table(TABLE) as batch:
        batch.add_column(
            sa.Column("role", sa.String(length=16), nullable=False, server_default="owner")
        )
        batch.add_column(sa.Column("tenant_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_operator_credentials_tenant_id_tenants"),
            "tenants",
            ["tenant_id"],
            ["id"],
            ondelete="CASCADE",
        )
        batch.create_index(op.f("ix_operator_credentials_tenant_id"), ["tenant_id"])
        roles = ", ".join(f"'{r}'" for r in ROLES)
        batch.create_check_constraint(op.f("ck_operator_credentials_role"), f"role IN ({roles})")
        batch.create_check_constraint(
            op.f("ck_operator_credentials_role_tenant"),
            "(role = 'tenant_admin') = (tenant_id IS NOT NULL)",
        )
        batch.add_column(sa.Column("form_token_hash", sa.String(length=64), nullable=True))
        batch.create_index(
            "uq_operator_credentials_form_token_hash", ["form_token_hash"], unique=True
        )


def downgrade() -> None:
    with _sqlite_foreign_keys_off(), op.batch_alter_table(TABLE) as batch:
        batch.drop_index("uq_operator_credentials_form_token_hash")
        batch.drop_column("form_token_hash")
        batch.drop_constraint(op.f("ck_operator_credentials_role_tenant"), type_="check")
        batch.drop_constraint(op.f("ck_operator_credentials_role"), type_="check")
        batch.drop_index(op.f("ix_operator_credentials_tenant_id"))
        batch.drop_constraint(op.f("fk_operator_credentials_tenant_id_tenants"), type_="foreignkey")
        batch.drop_column("tenant_id")
        batch.drop_column("role")


@contextmanager
def _sqlite_foreign_keys_off() -> Iterator[None]:
    """SQLite only: foreign keys unenforced while the table is rebuilt, then checked (see
    0003: the pragma is issued between transactions on the driver connection)."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite" or context.is_offline_mode():
        yield
        return
    driver = bind.connection.dbapi_connection
    assert driver is not None
    _between_transactions(driver, "PRAGMA foreign_keys=OFF", commit=True)
    try:
        yield
        broken = bind.exec_driver_sql("PRAGMA foreign_key_check").all()
        if broken:
            raise RuntimeError(f"0012: {len(broken)} broken reference(s) after the rebuild")
    except BaseException:
        _between_transactions(driver, "PRAGMA foreign_keys=ON", commit=False)
        raise
    _between_transactions(driver, "PRAGMA foreign_keys=ON", commit=True)


def _between_transactions(driver: Any, pragma: str, *, commit: bool) -> None:
    if driver.in_transaction:
        driver.execute("COMMIT" if commit else "ROLLBACK")
    driver.execute(pragma)
    driver.execute("BEGIN")
