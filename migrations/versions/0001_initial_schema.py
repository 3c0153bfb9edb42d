"""Initial schema: tiers, tenants, API keys, backends, usage records, audit log.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIGINT_PK = sa.BigInteger().with_variant(sa.INTEGER(), "sqlite")


def _time(name: str, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "tiers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=False),
        sa.Column("tpot_ms", sa.Float(), nullable=False),
        sa.Column("deadline_ms", sa.Float(), nullable=True),
        sa.Column("min_ttft_ms", sa.Float(), nullable=True),
        sa.Column("min_tpot_ms", sa.Float(), nullable=True),
        sa.Column("min_deadline_ms", sa.Float(), nullable=True),
        sa.Column("rpm_limit", sa.Integer(), nullable=True),
        sa.Column("tpm_limit", sa.Integer(), nullable=True),
        sa.Column("max_concurrency", sa.Integer(), nullable=True),
        sa.Column("best_effort_allowed", sa.Boolean(), nullable=False),
        _time("created_at"),
        _time("updated_at"),
        sa.CheckConstraint(
            "deadline_ms IS NULL OR deadline_ms > 0", name=op.f("ck_tiers_deadline_positive")
        ),
        sa.CheckConstraint("ttft_ms > 0 AND tpot_ms > 0", name=op.f("ck_tiers_slo_positive")),
        sa.CheckConstraint("weight > 0", name=op.f("ck_tiers_weight_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tiers")),
        sa.UniqueConstraint("name", name=op.f("uq_tiers_name")),
    )
    op.create_table(
        "tenants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("tier_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("tpot_ms", sa.Float(), nullable=True),
        sa.Column("deadline_ms", sa.Float(), nullable=True),
        sa.Column("rpm_limit", sa.Integer(), nullable=True),
        sa.Column("tpm_limit", sa.Integer(), nullable=True),
        sa.Column("max_concurrency", sa.Integer(), nullable=True),
        _time("created_at"),
        _time("updated_at"),
        sa.CheckConstraint("status IN ('active', 'suspended')", name=op.f("ck_tenants_status")),
        sa.ForeignKeyConstraint(
            ["tier_id"], ["tiers.id"], name=op.f("fk_tenants_tier_id_tiers"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_index(op.f("ix_tenants_tier_id"), "tenants", ["tier_id"])
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=True),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        _time("created_at"),
        _time("expires_at", nullable=True),
        _time("revoked_at", nullable=True),
        _time("last_used_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_api_keys_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"])
    op.create_table(
        "backends",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("base_url", sa.String(length=512), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("profile", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        _time("created_at"),
        _time("updated_at"),
        sa.CheckConstraint(
            "kind IN ('vllm', 'vllm-ascend', 'emulated')", name=op.f("ck_backends_kind")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_backends")),
        sa.UniqueConstraint("name", name=op.f("uq_backends_name")),
    )
    op.create_table(
        "usage_records",
        sa.Column("id", BIGINT_PK, nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("api_key_id", sa.Integer(), nullable=True),
        sa.Column("tier", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column("backend", sa.String(length=64), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("tpot_ms", sa.Float(), nullable=True),
        sa.Column("gain", sa.Float(), nullable=False),
        sa.Column("ideal_gain", sa.Float(), nullable=False),
        sa.Column("slo_met", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reject_reason", sa.String(length=128), nullable=True),
        _time("created_at"),
        sa.CheckConstraint(
            "status IN ('ok', 'error', 'rejected', 'cancelled')",
            name=op.f("ck_usage_records_status"),
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name=op.f("fk_usage_records_api_key_id_api_keys"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_usage_records_tenant_id_tenants"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
    )
    op.create_index("ix_usage_records_tenant_created", "usage_records", ["tenant_id", "created_at"])
    op.create_index("ix_usage_records_tier_created", "usage_records", ["tier", "created_at"])
    op.create_table(
        "audit_log",
        sa.Column("id", BIGINT_PK, nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("entity_type", sa.String(length=32), nullable=False),
        sa.Column("entity_id", sa.String(length=64), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        _time("at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_at"), "audit_log", ["at"])
    op.create_index("ix_audit_log_entity", "audit_log", ["entity_type", "entity_id"])


def downgrade() -> None:
    op.drop_table("audit_log")  # dropping a table drops its indexes on both databases
    op.drop_table("usage_records")
    op.drop_table("backends")
    op.drop_table("api_keys")
    op.drop_table("tenants")
    op.drop_table("tiers")
