"""Stored latency profiles: operator-calibrated profile documents that backends can reference.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from gateway.db.errors import InUse

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "latency_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_latency_profiles")),
        sa.UniqueConstraint("name", name=op.f("uq_latency_profiles_name")),
    )


def downgrade() -> None:
    _refuse_while_backends_use_stored_profiles()
    op.drop_table("latency_profiles")


def _refuse_while_backends_use_stored_profiles() -> None:
    """Without the table those backends would name profiles no gateway can load: a gateway
    at 0001 would fail to configure its pool. (Offline ``--sql`` mode cannot look.)"""
    if context.is_offline_mode():
        return
    used = op.get_bind().execute(
        sa.text(
            "SELECT b.name, b.profile FROM backends b "
            "JOIN latency_profiles p ON p.name = b.profile ORDER BY b.name"
        )
    )
    names = [f"{backend} ({profile})" for backend, profile in used]
    if names:
        raise InUse(
            f"cannot downgrade below revision 0002: backend(s) {', '.join(names)} use stored "
            "latency profiles; point them at shipped profiles or delete them first",
            param="revision",
        )
