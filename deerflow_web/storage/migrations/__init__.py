"""Alembic migrations of the shared database (`storage/migrate.py` runs them)."""
