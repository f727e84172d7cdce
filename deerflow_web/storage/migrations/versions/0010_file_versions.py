"""Versions of replaced files and the trash of deleted ones (issue 27).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "file_versions",
        sa.Column("version_id", sa.String(32), primary_key=True),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("area", sa.String(16), nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("content_type", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(36)),
        sa.Index("ix_file_versions_file", "scope", "area", "filename", "created_at"),
    )
    op.create_table(
        "trashed_files",
        sa.Column("trash_id", sa.String(32), primary_key=True),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("deleted_at", sa.Float, nullable=False),
        sa.Column("deleted_by", sa.String(36)),
        sa.Column("records", sa.Text, nullable=False),
        sa.Index("ix_trashed_files_scope", "scope", "deleted_at"),
        sa.Index("ix_trashed_files_expiry", "deleted_at"),
    )


def downgrade() -> None:
    op.drop_table("trashed_files")
    op.drop_table("file_versions")
