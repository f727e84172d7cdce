"""Per-user storage quotas: an admin's override of the configured default, per account;
and a `record_versions` row for every thread that has records, since the usage sums are
kept per thread by that version (services/quotas/usage.py).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "user_quotas",
        sa.Column(
            "user_id",
            sa.String(36),
            sa.ForeignKey("users.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("quota_bytes", sa.BigInteger),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    uploads = sa.table("uploads", sa.column("scope", sa.Text))
    versions = sa.table(
        "record_versions", sa.column("scope", sa.Text), sa.column("version", sa.BigInteger)
    )
    missing = (
        sa.select(uploads.c.scope, sa.literal(1))
        .where(~sa.exists().where(versions.c.scope == uploads.c.scope))
        .distinct()
    )
    op.execute(versions.insert().from_select(["scope", "version"], missing))


def downgrade() -> None:
    op.drop_table("user_quotas")
