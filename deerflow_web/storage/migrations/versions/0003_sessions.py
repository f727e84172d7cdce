"""Session idle timeout and persistence; one-time secrets kept for their session.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Sessions opened before this revision were "remember me" ones or browser sessions;
    # which, nobody recorded: they keep their absolute end and get no idle timeout.
    op.add_column(
        "sessions",
        sa.Column("persistent", sa.Boolean, nullable=False, server_default=sa.true()),
    )
    op.add_column("sessions", sa.Column("last_seen_at", sa.Float, nullable=True))
    op.create_table(
        "session_secrets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "session_hash",
            sa.String(64),
            sa.ForeignKey("sessions.id_hash", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("nonce", sa.String(32), nullable=False),
        sa.Column("sealed", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_session_secrets_session", "session_secrets", ["session_hash", "kind"])


def downgrade() -> None:
    op.drop_index("ix_session_secrets_session", table_name="session_secrets")
    op.drop_table("session_secrets")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("last_seen_at")
        batch.drop_column("persistent")
