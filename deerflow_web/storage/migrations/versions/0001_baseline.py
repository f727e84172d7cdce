"""Baseline: every table of the first shared-database release.

Data dirs made before migrations existed already hold some of these tables (the accounts
tables, created directly): a table that exists is left as it is, the others are created,
so such a database ends up exactly like a new one. The tables are spelled out here rather
than imported, so later changes to `database.py` never rewrite history.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _tables(metadata: sa.MetaData) -> None:
    sa.Table(
        "users",
        metadata,
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("email", sa.String(320), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(255), nullable=False),
        sa.Column("system_role", sa.String(16), nullable=False),
        sa.Column("needs_setup", sa.Boolean, nullable=False),
        sa.Column("disabled", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    sa.Table(
        "sessions",
        metadata,
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column(
            "user_id", sa.String(36), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Index("ix_sessions_user", "user_id"),
    )
    sa.Table(
        "api_tokens",
        metadata,
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column(
            "user_id", sa.String(36), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("last_used_at", sa.Float, nullable=True),
        sa.Index("ix_api_tokens_user", "user_id"),
    )
    sa.Table(
        "login_failures",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(320), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Index("ix_login_failures_subject", "kind", "subject", "at"),
    )
    sa.Table(
        "thread_owners",
        metadata,
        sa.Column("thread_id", sa.String(64), primary_key=True),
        sa.Column(
            "user_id", sa.String(36), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Index("ix_thread_owners_user", "user_id"),
    )
    sa.Table(
        "uploads",
        metadata,
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.Text, nullable=False),
        sa.Column("content_type", sa.Text, nullable=False),
        sa.Column("uploaded_at", sa.Float, nullable=False),
        sa.Column("mtime_ns", sa.BigInteger, nullable=False),
        sa.Column("inode", sa.BigInteger, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("original_filename", sa.Text),
        sa.Column("converted_from", sa.Text),
        sa.Column("conversion_state", sa.Text),
        sa.Column("conversion_error", sa.Text),
        sa.Column("conversion_owner", sa.Text),
        sa.Column("source_sha256", sa.Text),
        sa.Column("conversion_queued_at", sa.Float),
        sa.Column("conversion_lease_until", sa.Float),
        sa.PrimaryKeyConstraint("scope", "filename"),
        sa.Index("ix_uploads_conversion_state", "conversion_state"),
        sqlite_with_rowid=False,
    )
    sa.Table(
        "preview_turns",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Index("ix_preview_turns_scope", "scope", "id"),
    )
    sa.Table(
        "resumable_uploads",
        metadata,
        sa.Column("upload_id", sa.String(64), primary_key=True),
        sa.Column("thread_id", sa.Text, nullable=False),
        sa.Column("user_id", sa.String(36)),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("on_conflict", sa.String(16), nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("length", sa.BigInteger, nullable=False),
        sa.Column("upload_offset", sa.BigInteger, nullable=False),
        sa.Column("pending_from", sa.BigInteger),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("staging_path", sa.Text, nullable=False),
        sa.Index("ix_resumable_uploads_expiry", "expires_at"),
        sa.Index("ix_resumable_uploads_staging", "staging_path"),
    )


def upgrade() -> None:
    metadata = sa.MetaData()
    _tables(metadata)
    metadata.create_all(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    metadata = sa.MetaData()
    _tables(metadata)
    metadata.drop_all(op.get_bind())
