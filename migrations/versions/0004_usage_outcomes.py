"""Usage outcomes: an engine's refusal is a rejection, and refused work carries no usage or gain.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

No schema change: the definitions of ``docs/usage.md`` (only work an engine accepted carries
tokens, gain and ideal gain) are applied by the gateway from now on, and this brings the rows
written before them in line, as far as a row tells:

* an engine's 4xx was recorded as ``error`` with ``reject_reason = 'upstream_rejected'``; it is
  a rejection;
* a rejected row keeps its count and reason but loses its tokens, gain and ideal gain — one
  request with an absurd ``max_tokens`` had put its whole budget into its tier's ideal gain,
  reading the tier's TDG ratio as 0 for the whole retention window;
* a failed or cancelled row that never delivered a token (no TTFT recorded) shows no sign that
  an engine accepted it: it loses them too.

``slo_met`` needs no repair (it was only ever true on ``ok`` rows), nor do ``ok`` rows. The
downgrade leaves the repaired rows as they are: the old values were the defect.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_usage = sa.table(
    "usage_records",
    sa.column("status", sa.String),
    sa.column("reject_reason", sa.String),
    sa.column("ttft_ms", sa.Float),
    sa.column("prompt_tokens", sa.Integer),
    sa.column("completion_tokens", sa.Integer),
    sa.column("gain", sa.Float),
    sa.column("ideal_gain", sa.Float),
)
_NOTHING = {"prompt_tokens": 0, "completion_tokens": 0, "gain": 0.0, "ideal_gain": 0.0}


def upgrade() -> None:
    status = _usage.c.status
    op.execute(
        _usage.update()
        .where(status == "error", _usage.c.reject_reason == "upstream_rejected")
        .values(status="rejected")
    )
    op.execute(_usage.update().where(status == "rejected").values(**_NOTHING))
    op.execute(
        _usage.update()
        .where(status.in_(("error", "cancelled")), _usage.c.ttft_ms.is_(None))
        .values(**_NOTHING)
    )


def downgrade() -> None:
    """Nothing to undo: no schema changed, and the repaired values were the right ones."""
