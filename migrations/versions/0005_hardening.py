"""Hardening: a usage record is written once, and a tier says how much SLO slack admission allows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

* ``usage_records.request_id`` becomes unique (``uq_usage_records_request_id``). The usage
  writer inserts with ``ON CONFLICT DO NOTHING``, so a batch retried after a commit whose
  acknowledgement was lost (the database restarting mid-commit), or replayed from the on-disk
  spool after a crash, never counts a request twice. Rows already duplicated (none should be:
  request ids are UUIDs) are reduced to the first written before the index is built, and counted
  in a warning.
* ``tiers.shed_slack`` (NOT NULL, default 0): how far past its TTFT objective a request's
  predicted time to first token may be, as a fraction of the objective, and the request still
  be admitted under overload (0.25 = up to 25% late). Past it, admission refuses the request
  early, or demotes it to best effort where the tier allows that (``best_effort_allowed``).
  The bounds (``[0, 100]``) are checked by the gateway's schemas, not by a CHECK constraint:
  adding one would rebuild ``tiers`` on SQLite (see 0003) for a column no older code writes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger(__name__)

_usage = sa.table("usage_records", sa.column("id", sa.BigInteger), sa.column("request_id"))


def upgrade() -> None:
    first = sa.select(sa.func.min(_usage.c.id)).group_by(_usage.c.request_id).scalar_subquery()
    removed = op.get_bind().execute(_usage.delete().where(_usage.c.id.not_in(first))).rowcount
    if removed:
        log.warning("removed %d duplicated usage record(s) before indexing request_id", removed)
    op.create_index("uq_usage_records_request_id", "usage_records", ["request_id"], unique=True)
    op.add_column(
        "tiers",
        sa.Column("shed_slack", sa.Float(), nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    # not batch mode: rebuilding ``tiers`` on SQLite would cascade to its tenants (see 0003);
    # SQLite >= 3.35 drops an unindexed column in place
    op.drop_column("tiers", "shed_slack")
    op.drop_index("uq_usage_records_request_id", table_name="usage_records")
