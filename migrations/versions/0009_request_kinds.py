"""Request kinds: a tier's default kind.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26

* ``tiers.default_kind`` (NOT NULL, default ``'latency'``): the kind of a request of the tier that
  names none (no ``x-tiergate-workflow-id``, no ``x-slo-deadline-ms``): ``latency`` (TTFT and
  TPOT, what every tier did before), ``deadline`` or ``best-effort`` — both scheduled to the
  tier's ``deadline_ms``, its default deadline, which the CRUD layer then requires. Not a
  database CHECK: adding one to ``tiers`` on SQLite would rebuild the table, which cascades to
  its tenants (see 0003); the CRUD layer is the only writer.

Existing tiers become ``latency``: nothing changes for them. The downgrade drops the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tiers",
        sa.Column("default_kind", sa.String(length=16), nullable=False, server_default="latency"),
    )


def downgrade() -> None:
    # not batch mode: rebuilding ``tiers`` on SQLite would cascade to its tenants (see 0003);
    # SQLite >= 3.35 drops an unindexed column in place
    op.drop_column("tiers", "default_kind")
