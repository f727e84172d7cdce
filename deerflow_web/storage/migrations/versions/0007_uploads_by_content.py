"""Upload records are found by content and by the file they were converted from.

An upload's commit asks whether the thread already holds its bytes (`duplicate_of`), and a
replaced, renamed or deleted file which records were converted from it: with these two
indexes both are a few index reads, whatever the size of the thread, instead of a pass
over all of its records on every upload (issue 24).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_uploads_sha256", "uploads", ["scope", "sha256", "filename"])
    op.create_index("ix_uploads_converted_from", "uploads", ["scope", "converted_from"])


def downgrade() -> None:
    op.drop_index("ix_uploads_converted_from", table_name="uploads")
    op.drop_index("ix_uploads_sha256", table_name="uploads")
