"""Resumable uploads on the S3 backend: the parts each PATCH sent, and one writer at a time
across instances.

`resumable_uploads` gains the S3 multipart upload an upload's bytes go to
(`s3_upload_id`), the object holding the bytes after its last full part (`tail_key`), the
SHA-256 once the bytes became the thread's blob (`sha256`), and a lease (`lease_owner`,
`lease_expires`): instances share no disk, so no `flock` can say who writes.
`resumable_parts` lists the parts sent (number, ETag, SHA-256, size), removed with their
upload.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("resumable_uploads", sa.Column("s3_upload_id", sa.Text))
    op.add_column("resumable_uploads", sa.Column("tail_key", sa.Text))
    op.add_column("resumable_uploads", sa.Column("sha256", sa.String(64)))
    op.add_column("resumable_uploads", sa.Column("lease_owner", sa.String(64)))
    op.add_column("resumable_uploads", sa.Column("lease_expires", sa.Float))
    op.create_table(
        "resumable_parts",
        sa.Column("upload_id", sa.String(64), primary_key=True),
        sa.Column("part_number", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("etag", sa.Text, nullable=False),
        sa.Column("checksum_sha256", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(["upload_id"], ["resumable_uploads.upload_id"], ondelete="CASCADE"),
    )


def downgrade() -> None:
    op.drop_table("resumable_parts")
    with op.batch_alter_table("resumable_uploads") as batch:
        for name in ("lease_expires", "lease_owner", "sha256", "tail_key", "s3_upload_id"):
            batch.drop_column(name)
