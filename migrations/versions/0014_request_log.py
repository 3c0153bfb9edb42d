"""The request log: one row per request explaining how each stage saw it, trimmed by age.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28

* ``request_log``: outcome, HTTP status, reject reason, admission's verdict and predicted TTFT,
  the router's predicted TTFT, queue wait, measured engine TTFT, TTFT, TPOT, the tier's
  objectives, attempts, gain, ideal gain, SLO met (NULL: no sample) and why an SLO was missed
  (``miss_reason``). Never the prompt or the output. Tenant and key are plain ids (no
  foreign keys: writing a row never fails for a tenant deleted meanwhile).
* Indexes: ``uq_request_log_request_id`` (a retried batch stores a request once),
  ``ix_request_log_tenant_id_id`` (a tenant's requests, newest first, by keyset),
  ``ix_request_log_created_at`` (trimming by age, time ranges), and two partial indexes of the
  misses only (``miss_reason IS NOT NULL``): ``ix_request_log_missed`` (id) and
  ``ix_request_log_tenant_missed`` (tenant_id, id).

A new table: no rebuild of anything that exists. The downgrade drops it (the log is lost; the
usage records, the billing, are untouched).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIGINT_PK = sa.BigInteger().with_variant(sa.INTEGER(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "request_log",
        sa.Column("id", BIGINT_PK, nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("api_key_id", sa.Integer(), nullable=True),
        sa.Column("tier", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column("backend", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("reject_reason", sa.String(length=128), nullable=True),
        sa.Column("admission", sa.String(length=16), nullable=True),
        sa.Column("admission_ttft_ms", sa.Float(), nullable=True),
        sa.Column("predicted_ttft_ms", sa.Float(), nullable=True),
        sa.Column("queue_ms", sa.Float(), nullable=True),
        sa.Column("engine_ttft_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("tpot_ms", sa.Float(), nullable=True),
        sa.Column("slo_ttft_ms", sa.Float(), nullable=True),
        sa.Column("slo_tpot_ms", sa.Float(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("gain", sa.Float(), nullable=False),
        sa.Column("ideal_gain", sa.Float(), nullable=False),
        sa.Column("slo_met", sa.Boolean(), nullable=True),
        sa.Column("miss_reason", sa.String(length=16), nullable=True),
        sa.CheckConstraint(
            "status IN ('ok', 'error', 'rejected', 'cancelled')",
            name=op.f("ck_request_log_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_request_log")),
    )
    op.create_index("uq_request_log_request_id", "request_log", ["request_id"], unique=True)
    op.create_index("ix_request_log_tenant_id_id", "request_log", ["tenant_id", "id"])
    op.create_index("ix_request_log_created_at", "request_log", ["created_at"])
    missed = sa.text("miss_reason IS NOT NULL")
    for name, columns in (
        ("ix_request_log_missed", ["id"]),
        ("ix_request_log_tenant_missed", ["tenant_id", "id"]),
    ):
        op.create_index(name, "request_log", columns, postgresql_where=missed, sqlite_where=missed)


def downgrade() -> None:
    op.drop_index("ix_request_log_tenant_missed", table_name="request_log")
    op.drop_index("ix_request_log_missed", table_name="request_log")
    op.drop_index("ix_request_log_created_at", table_name="request_log")
    op.drop_index("ix_request_log_tenant_id_id", table_name="request_log")
    op.drop_index("uq_request_log_request_id", table_name="request_log")
    op.drop_table("request_log")
