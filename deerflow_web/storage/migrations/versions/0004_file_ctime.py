"""Upload records keep the file's ctime, which no writer can set back (unlike the mtime).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: a record of an earlier release is checked by hashing its file once.
    op.add_column("uploads", sa.Column("ctime_ns", sa.BigInteger))


def downgrade() -> None:
    with op.batch_alter_table("uploads") as batch:
        batch.drop_column("ctime_ns")
