"""A finished resumable upload keeps its row (with the name it was stored under) until it
expires, so a client retrying after an answer it never got learns the upload is complete.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("resumable_uploads") as table:
        table.add_column(sa.Column("committed_name", sa.Text, nullable=True))
    op.create_index("ix_resumable_uploads_user", "resumable_uploads", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_resumable_uploads_user", "resumable_uploads")
    with op.batch_alter_table("resumable_uploads") as table:
        table.drop_column("committed_name")
