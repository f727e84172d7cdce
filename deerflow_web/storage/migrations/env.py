"""Alembic's entry point: runs the migrations on the connection `migrate.py` hands over.

The caller holds the migration lock (PostgreSQL advisory lock, SQLite's write lock) on
that connection, inside its transaction, so instances starting together upgrade once.
"""

from __future__ import annotations

from alembic import context

from deerflow_web.storage.database import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters by copying tables
    transactional_ddl=True,
)
with context.begin_transaction():
    context.run_migrations()
