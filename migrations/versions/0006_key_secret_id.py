"""Secret rotation: each API key records which server secret its hash is under.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

``api_keys.secret_id`` (nullable, 16 hex digits): a short HMAC name of the server secret that
made ``key_hash`` (``gateway.db.security.secret_id``). With ``TIERGATE_SECRET_PREVIOUS`` set, a
key found under a previous secret is re-hashed under the current one and its ``secret_id``
moves with it, so ``tiergate keys secret-status`` can say when no usable key needs a previous
secret any more. Keys issued before this revision keep NULL ("unrecorded") until their next
use: the migration cannot know the secret, and must not read it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("secret_id", sa.String(16), nullable=True))


def downgrade() -> None:
    # not batch mode: rebuilding ``api_keys`` on SQLite is not needed; SQLite >= 3.35 drops an
    # unindexed column in place (as 0005 does)
    op.drop_column("api_keys", "secret_id")
