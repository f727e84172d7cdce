"""Where an install's file bytes live, as the shared database says (`install_storage`).

`flask --app app storage migrate --to s3` copies a local install's files into a bucket
and, once every one is there and verified, writes the row `s3` (`mark_moved`). From then
on the bucket is where the install's bytes are: an instance that still starts with
`storage.backend: local` would keep new files on a disk of its own, which no other
instance (and no later instance on S3) ever sees. So every process that serves files
(the app, the worker, which builds the app, and the agent side's `resolve_thread_paths`)
runs the one check here at start-up, `refuse_local_after_move`, and stops with the fix.

An install never moved has no row and starts on either backend.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy import delete
from sqlalchemy import insert
from sqlalchemy import inspect
from sqlalchemy import select

from deerflow_web.errors import ConfigError
from deerflow_web.settings import S3Settings
from deerflow_web.settings import StorageSettings
from deerflow_web.storage.database import DATABASE_FILE
from deerflow_web.storage.database import default_database_url
from deerflow_web.storage.database import install_storage
from deerflow_web.storage.database import make_engine
from deerflow_web.storage.database import write_transaction

ROW_ID = 1


@dataclass(frozen=True)
class InstallStorage:
    """The row: the backend the bytes live in and, for the message, which bucket."""

    backend: str
    bucket: str | None
    prefix: str | None
    endpoint_url: str | None
    moved_at: float


def read_install_storage(engine: Engine) -> InstallStorage | None:
    """The install's row, or None when its bytes never moved (or the table is not
    there yet: a database of an earlier release, before its migration)."""
    with engine.connect() as db:
        if not inspect(db).has_table(install_storage.name):
            return None
        row = db.execute(
            select(
                install_storage.c.backend,
                install_storage.c.bucket,
                install_storage.c.prefix,
                install_storage.c.endpoint_url,
                install_storage.c.moved_at,
            ).where(install_storage.c.id == ROW_ID)
        ).first()
    return InstallStorage(*row) if row is not None else None


def mark_moved(engine: Engine, s3: S3Settings, *, now: float | None = None) -> InstallStorage:
    """Record that every byte of the install is in the bucket of `s3` (the switch)."""
    moved = InstallStorage(
        "s3", s3.bucket, s3.prefix or None, s3.endpoint_url, time.time() if now is None else now
    )
    with write_transaction(engine) as db:
        db.execute(delete(install_storage).where(install_storage.c.id == ROW_ID))
        db.execute(
            insert(install_storage).values(
                id=ROW_ID,
                backend=moved.backend,
                bucket=moved.bucket,
                prefix=moved.prefix,
                endpoint_url=moved.endpoint_url,
                moved_at=moved.moved_at,
            )
        )
    return moved


def settings_to_set(moved: InstallStorage) -> list[str]:
    """What the settings of every instance must say to serve a moved install, one line
    each, as config.yaml keys and the environment variables that do the same."""
    lines = ["storage.backend: s3  (or DEER_FLOW_STORAGE_BACKEND=s3)"]
    if moved.bucket:
        lines.append(f"storage.s3.bucket: {moved.bucket}  (or DEER_FLOW_STORAGE_S3_BUCKET)")
    if moved.prefix:
        lines.append(f"storage.s3.prefix: {moved.prefix}  (or DEER_FLOW_STORAGE_S3_PREFIX)")
    if moved.endpoint_url:
        lines.append(
            f"storage.s3.endpoint_url: {moved.endpoint_url}  (or DEER_FLOW_STORAGE_S3_ENDPOINT_URL)"
        )
    return lines


def moved_message(moved: InstallStorage) -> str:
    """The refusal: what happened, why the instance stops, and exactly what to set."""
    where = f"the S3 bucket {moved.bucket}" if moved.bucket else "an S3 bucket"
    if moved.prefix:
        where += f" (prefix {moved.prefix})"
    return (
        f"This install's files were moved to {where} by `flask --app app storage migrate "
        "--to s3`, but this instance is set to storage.backend: local: it would keep new "
        "files on its own disk, where no other instance sees them, so it does not start. "
        "Set " + "; ".join(settings_to_set(moved)) + ", then start it again."
    )


def refuse_local_after_move(engine: Engine, storage: StorageSettings) -> None:
    """Stop start-up of an instance set to `local` on an install moved to S3.

    Raises:
        ConfigError: The database says the bytes live in a bucket and `storage.backend`
            is `local`.
    """
    if storage.backend != "local":
        return
    moved = read_install_storage(engine)
    if moved is not None and moved.backend != "local":
        raise ConfigError(moved_message(moved))


def refuse_local_after_move_at(
    base_dir: Path, database_url: str | None, storage: StorageSettings
) -> None:
    """`refuse_local_after_move` for a process with no engine of its own (the agent side):
    opens the database only for the check. A data dir without its embedded database
    file was never moved (nothing is created for the check).

    Raises:
        ConfigError: As `refuse_local_after_move`.
    """
    if storage.backend != "local":
        return
    if database_url is None and not (base_dir / DATABASE_FILE).is_file():
        return
    engine = make_engine(database_url or default_database_url(base_dir))
    try:
        refuse_local_after_move(engine, storage)
    finally:
        engine.dispose()
