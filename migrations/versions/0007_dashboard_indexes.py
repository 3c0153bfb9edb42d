"""Dashboard indexes: the admin dashboard's list pages and usage charts at scale.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25

The dashboard pages its lists (newest first, id as the tie-break) and charts usage over any
window; with 50,000 keys, a long audit log and a million usage records those must not sort or
scan whole tables (``bench/admin_scale.py``):

* ``ix_api_keys_created`` (``created_at``, ``id``): the keys list, newest first, read from the
  index's end instead of sorting every key.
* ``ix_audit_log_at_id`` (``at``, ``id``) replaces ``ix_audit_log_at``: the same order for the
  audit log, tie-break included (an index on ``at`` alone still sorts rows of one instant).
* ``ix_audit_log_actor_at`` (``actor``, ``at``): the audit page's actor filter, newest first.
* ``ix_usage_records_created`` (``created_at``): usage over a window across all tenants and
  tiers (the existing indexes lead with the tenant or the tier, so they serve only a filtered
  chart).

Only indexes: no row changes, and both directions are cheap on both databases.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_api_keys_created", "api_keys", ["created_at", "id"])
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.create_index("ix_audit_log_at_id", "audit_log", ["at", "id"])
    op.create_index("ix_audit_log_actor_at", "audit_log", ["actor", "at"])
    op.create_index("ix_usage_records_created", "usage_records", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_usage_records_created", table_name="usage_records")
    op.drop_index("ix_audit_log_actor_at", table_name="audit_log")
    op.drop_index("ix_audit_log_at_id", table_name="audit_log")
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.drop_index("ix_api_keys_created", table_name="api_keys")
