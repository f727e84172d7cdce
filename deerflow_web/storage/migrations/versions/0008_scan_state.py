"""Virus scanning: each upload record's scan state, refused and quarantined files, job leases.

Existing records get no state (NULL): they were stored while scanning was off, are used as
before while it stays off, and are held back and rescanned once it is turned on.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("uploads", sa.Column("scan_state", sa.Text))
    op.add_column("uploads", sa.Column("scan_signatures", sa.Text))
    op.create_table(
        "scan_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("user_id", sa.String(36)),
        sa.Column("thread_id", sa.String(64), nullable=False),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("sha256", sa.Text),
        sa.Column("size", sa.BigInteger),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("quarantine_path", sa.Text),
        sa.Column("purge_after", sa.Float),
    )
    op.create_index("ix_scan_events_at", "scan_events", ["at"])
    op.create_index("ix_scan_events_scope", "scan_events", ["scope", "at"])
    op.create_table(
        "job_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("lease_until", sa.Float, nullable=False),
        sa.Column("state", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("job_leases")
    op.drop_index("ix_scan_events_scope", table_name="scan_events")
    op.drop_index("ix_scan_events_at", table_name="scan_events")
    op.drop_table("scan_events")
    with op.batch_alter_table("uploads") as batch:
        batch.drop_column("scan_signatures")
        batch.drop_column("scan_state")
