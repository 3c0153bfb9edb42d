"""The admin dashboard's sign-in: operator credentials and server-side sessions.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25

* ``operator_credentials``: the dashboard's sign-in credential (also accepted as the admin API's
  bearer), created on the first ``tiergate serve`` without ``TIERGATE_ADMIN_KEY``. Only its
  keyed hash is stored (``HMAC-SHA256(server secret, credential)``, as for API keys) with the
  ``secret_id`` of the secret that made it.
* ``operator_sessions``: one row per signed-in browser, so that every worker process and
  replica sees the same sessions; the cookie holds the token, the row its keyed hash.
  ``last_seen_at`` is indexed for the idle-expiry sweep; deleting a credential deletes its
  sessions (``ON DELETE CASCADE``).

New tables only: both directions are cheap, and a downgrade signs everybody out.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "operator_credentials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("credential_hash", sa.String(length=64), nullable=False),
        sa.Column("secret_id", sa.String(length=16), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operator_credentials")),
        sa.UniqueConstraint("name", name=op.f("uq_operator_credentials_name")),
        sa.UniqueConstraint(
            "credential_hash", name=op.f("uq_operator_credentials_credential_hash")
        ),
    )
    op.create_table(
        "operator_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("operator", sa.String(length=64), nullable=False),
        sa.Column("credential_id", sa.Integer(), nullable=True),
        sa.Column("client", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["credential_id"],
            ["operator_credentials.id"],
            name=op.f("fk_operator_sessions_credential_id_operator_credentials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operator_sessions")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_operator_sessions_token_hash")),
    )
    op.create_index(
        op.f("ix_operator_sessions_credential_id"), "operator_sessions", ["credential_id"]
    )
    op.create_index(
        op.f("ix_operator_sessions_last_seen_at"), "operator_sessions", ["last_seen_at"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_operator_sessions_last_seen_at"), table_name="operator_sessions")
    op.drop_index(op.f("ix_operator_sessions_credential_id"), table_name="operator_sessions")
    op.drop_table("operator_sessions")
    op.drop_table("operator_credentials")
