"""Where an install's file bytes live: `install_storage`, one row once
`flask --app app storage migrate --to s3` has moved them into a bucket (none before).

An instance whose settings still say `storage.backend: local` refuses to start on a
database whose row says `s3` (`storage/install_storage.py`).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "install_storage",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("bucket", sa.Text),
        sa.Column("prefix", sa.Text),
        sa.Column("endpoint_url", sa.Text),
        sa.Column("moved_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("install_storage")
