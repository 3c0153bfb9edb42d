"""Spend: a price per model, the cost of each usage record, and budgets.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28

* ``model_prices``: one row per model name clients ask for, with the price of a million prompt
  and a million completion tokens (``NUMERIC(12, 6)``, never negative: CHECK
  ``ck_model_prices_price_not_negative``).
* ``usage_records.cost`` (``NUMERIC(18, 9)``, nullable): what the request cost at its model's
  price when the record was written; NULL for records before this revision and for models
  without a price. Nothing is back-filled: history is charged at the prices it had (none).
* ``budgets``: a tenant's, or a key's, spend budget over a UTC day or month (``amount``
  ``NUMERIC(18, 9)`` > 0, an optional ``soft_fraction`` in (0, 1] and ``webhook_url``);
  ``target`` is ``tenant:<id>`` or ``key:<id>``, unique with the period
  (``uq_budgets_target_period``); deleting the tenant or the key deletes its budgets.

Adding a nullable column needs no table rebuild on either database. The downgrade drops the two
tables and the column (the recorded costs are lost; the usage records stay).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PRICE = sa.Numeric(12, 6)
MONEY = sa.Numeric(18, 9)


def _stamps() -> list[sa.Column[object]]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "model_prices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("prompt_per_mtok", PRICE, nullable=False),
        sa.Column("completion_per_mtok", PRICE, nullable=False),
        *_stamps(),
        sa.CheckConstraint(
            "prompt_per_mtok >= 0 AND completion_per_mtok >= 0",
            name=op.f("ck_model_prices_price_not_negative"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_prices")),
        sa.UniqueConstraint("model", name=op.f("uq_model_prices_model")),
    )
    op.create_table(
        "budgets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("api_key_id", sa.Integer(), nullable=True),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("amount", MONEY, nullable=False),
        sa.Column("soft_fraction", sa.Float(), nullable=True),
        sa.Column("webhook_url", sa.String(length=512), nullable=True),
        *_stamps(),
        sa.CheckConstraint("period IN ('day', 'month')", name=op.f("ck_budgets_period")),
        sa.CheckConstraint("amount > 0", name=op.f("ck_budgets_amount_positive")),
        sa.CheckConstraint(
            "soft_fraction IS NULL OR (soft_fraction > 0 AND soft_fraction <= 1)",
            name=op.f("ck_budgets_soft_fraction_range"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_budgets_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name=op.f("fk_budgets_api_key_id_api_keys"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budgets")),
    )
    op.create_index("ix_budgets_tenant_id", "budgets", ["tenant_id"])
    op.create_index("ix_budgets_api_key_id", "budgets", ["api_key_id"])
    op.create_index("uq_budgets_target_period", "budgets", ["target", "period"], unique=True)
    op.add_column("usage_records", sa.Column("cost", MONEY, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("cost")
    op.drop_index("uq_budgets_target_period", table_name="budgets")
    op.drop_index("ix_budgets_api_key_id", table_name="budgets")
    op.drop_index("ix_budgets_tenant_id", table_name="budgets")
    op.drop_table("budgets")
    op.drop_table("model_prices")
