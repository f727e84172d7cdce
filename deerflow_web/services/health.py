"""Readiness (SPEC D20): can this process reach its records and write to its data dir?

Load balancers call `/readyz` every few seconds, so each check is one small real operation
(a query, a file created and removed) rather than a guess from permissions: a read-only
remount or a database file that cannot be opened shows up as what it is.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

OK = "ok"
FAILED = "failed"


@dataclass(frozen=True)
class Readiness:
    """The outcome of each check, and what went wrong where one failed."""

    database: str
    storage: str
    problems: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        """Whether every check passed."""
        return not self.problems


def _storage_writable(base_dir: Path) -> None:
    handle, name = tempfile.mkstemp(dir=base_dir, prefix=".readyz-")
    try:
        os.write(handle, b"ok")
    finally:
        os.close(handle)
        os.unlink(name)


def check_readiness(ping_database: Callable[[], None], base_dir: Path) -> Readiness:
    """Run both checks; a failure is logged and named, never raised."""
    problems: list[str] = []
    database = storage = OK
    try:
        ping_database()
    except Exception as error:  # any driver error means "not ready", not a 500
        logger.warning("readiness: records database unreachable: %s", error)
        database = FAILED
        problems.append(f"database: records database unreachable ({type(error).__name__})")
    try:
        _storage_writable(base_dir)
    except OSError as error:
        logger.warning("readiness: data dir %s not writable: %s", base_dir, error)
        storage = FAILED
        problems.append(f"storage: data dir is not writable ({error.strerror or error})")
    return Readiness(database, storage, tuple(problems))
