"""An index that reads one owner's threads in `record_versions` by byte order.

Every commit under a quota sums the owner's threads from their versions, found as the
scopes between `users/{uid}/threads/` and the next prefix (services/quotas/usage.py). On
PostgreSQL that range compares with the "C" collation, so the database's locale cannot
reorder "/", and the primary key, built in the database's own collation, cannot serve it:
each commit read the whole table (4.5 ms at 50,000 threads, and growing with every
user's threads). This index holds the scopes in "C" order. SQLite compares bytes already;
there it is a plain index on the column, as `database.py` declares it for both.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

NAME = "ix_record_versions_scope_bytes"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index(NAME, "record_versions", [sa.text('scope COLLATE "C"')])
    else:
        op.create_index(NAME, "record_versions", ["scope"])


def downgrade() -> None:
    op.drop_index(NAME, table_name="record_versions")
