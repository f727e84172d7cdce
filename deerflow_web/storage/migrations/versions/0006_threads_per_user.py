"""Thread ids per user: the global `thread_owners` claim becomes each user's `threads` rows.

Every claimed thread keeps its owner and creation time; titles and metadata start empty.
Downgrading keeps, for each id, its oldest owner (the old table held one owner per id) and
drops the single-user layout's rows, which the old table never had.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    threads = op.create_table(
        "threads",
        sa.Column("user_id", sa.String(36), nullable=False),
        sa.Column("thread_id", sa.String(64), nullable=False),
        sa.Column("title", sa.Text),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("user_id", "thread_id"),
    )
    owners = sa.table(
        "thread_owners",
        sa.column("thread_id", sa.String),
        sa.column("user_id", sa.String),
        sa.column("created_at", sa.Float),
    )
    op.execute(
        threads.insert().from_select(
            ["user_id", "thread_id", "title", "metadata", "created_at", "updated_at"],
            sa.select(
                owners.c.user_id,
                owners.c.thread_id,
                sa.null(),
                sa.literal("{}"),
                owners.c.created_at,
                owners.c.created_at,
            ),
        )
    )
    op.drop_index("ix_thread_owners_user", table_name="thread_owners")
    op.drop_table("thread_owners")


def downgrade() -> None:
    owners = op.create_table(
        "thread_owners",
        sa.Column("thread_id", sa.String(64), primary_key=True),
        sa.Column(
            "user_id", sa.String(36), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Index("ix_thread_owners_user", "user_id"),
    )
    threads = sa.table(
        "threads",
        sa.column("thread_id", sa.String),
        sa.column("user_id", sa.String),
        sa.column("created_at", sa.Float),
    )
    first = (
        sa.select(
            threads.c.thread_id,
            threads.c.user_id,
            threads.c.created_at,
            sa.func.row_number()
            .over(
                partition_by=threads.c.thread_id,
                order_by=(threads.c.created_at, threads.c.user_id),
            )
            .label("rank"),
        )
        .where(threads.c.user_id != "")
        .subquery()
    )
    op.execute(
        owners.insert().from_select(
            ["thread_id", "user_id", "created_at"],
            sa.select(first.c.thread_id, first.c.user_id, first.c.created_at).where(
                first.c.rank == 1
            ),
        )
    )
    op.drop_table("threads")
