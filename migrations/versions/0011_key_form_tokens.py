"""Key form tokens: re-sending the dashboard's create or rotate form cannot issue a second key.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28

``api_keys.form_token_hash`` (nullable, 64 hex digits): ``HMAC(server secret, label + token)``
of the one-time token the dashboard puts in its create and rotate forms
(:func:`gateway.db.crud.keys.form_token_hash`). A browser that re-posts the form (a reload of
the page that showed the new secret) sends the same token; the unique index
``uq_api_keys_form_token_hash`` makes the second insert fail even when two posts race, and the
dashboard answers 409 naming the key the first one made. NULL for keys issued by the API or
the CLI and for every key that exists before this revision (several NULLs never collide, on
either database).

The downgrade drops the index and the column: keys stay; only the memory of which form made
them goes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("form_token_hash", sa.String(64), nullable=True))
    op.create_index("uq_api_keys_form_token_hash", "api_keys", ["form_token_hash"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_api_keys_form_token_hash", table_name="api_keys")
    # the index gone, SQLite >= 3.35 drops the column in place (as 0006's downgrade does)
    op.drop_column("api_keys", "form_token_hash")
