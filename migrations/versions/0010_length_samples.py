"""Length samples: what the gateway's periodic length-predictor trainer learns from.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27

* ``length_samples``: one row per finished request while ``TIERGATE_LENGTHS_LEARN`` is on
  (:class:`gateway.db.models.LengthSample`): the request's hashed feature vector (bytes, never
  the prompt's text), its model, a hash of its tenant, prompt tokens, ``max_tokens``, output
  tokens, how it finished (``stop``; ``length``: censored at ``max_tokens``), and the raw prompt
  only where the operator turned ``TIERGATE_LENGTHS_STORE_PROMPTS`` on. Indexed by (layout, id):
  the trainer reads the newest rows of its feature layout, the writer prunes the oldest by id.

The downgrade drops the table (samples are training data, rebuilt by the next requests).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIGINT_PK = sa.BigInteger().with_variant(sa.INTEGER(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "length_samples",
        sa.Column("id", BIGINT_PK, nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("tenant_hash", sa.String(length=16), nullable=True),
        sa.Column("layout", sa.String(length=16), nullable=False),
        sa.Column("features", sa.LargeBinary(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("max_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("finish", sa.String(length=8), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("finish IN ('stop', 'length')", name=op.f("ck_length_samples_finish")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_length_samples")),
    )
    op.create_index("ix_length_samples_layout_id", "length_samples", ["layout", "id"])


def downgrade() -> None:
    op.drop_index("ix_length_samples_layout_id", table_name="length_samples")
    op.drop_table("length_samples")
