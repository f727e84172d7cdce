"""Share links: a thread's files handed to someone without an account, and their rate limit.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "share_links",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("user_id", sa.String(36), nullable=False),
        sa.Column("thread_id", sa.String(64), nullable=False),
        sa.Column("paths", sa.Text, nullable=False),
        sa.Column("password_hash", sa.String(255)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float),
        sa.Index("ix_share_links_thread", "user_id", "thread_id"),
    )
    op.create_table(
        "share_link_hits",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(320), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Index("ix_share_link_hits_subject", "kind", "subject", "at"),
    )


def downgrade() -> None:
    op.drop_table("share_link_hits")
    op.drop_table("share_links")
