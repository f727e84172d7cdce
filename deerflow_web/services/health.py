"""Readiness (SPEC D20): can this process reach its records, write to its data dir and,
on the S3 backend, reach its bucket?

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
from typing import Protocol

from deerflow_web.storage.local import is_disk_full

logger = logging.getLogger(__name__)

OK = "ok"
FAILED = "failed"
FULL = "full"  # the data dir has no space left: free some, nothing to wait for
OFF = "off"  # virus scanning is not configured; the bucket: files are on the local disk


class Pingable(Protocol):
    """Something that raises unless its server answers (the virus scanner)."""

    def check(self) -> None: ...


def scanner_state(scanner: Pingable | None) -> str:
    """`off` without scanning, `ok` when clamd answers PING, else `failed` (logged)."""
    if scanner is None:
        return OFF
    try:
        scanner.check()
    except Exception as error:  # unreachable, timed out, a wrong answer: not ready to scan
        logger.warning("readiness: virus scanner unavailable: %s", error)
        return FAILED
    return OK


@dataclass(frozen=True)
class Readiness:
    """The outcome of each check, and what went wrong where one failed."""

    database: str
    storage: str
    problems: tuple[str, ...] = ()
    bucket: str = OFF

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


def check_readiness(
    ping_database: Callable[[], None],
    base_dir: Path,
    ping_bucket: Callable[[], None] | None = None,
) -> Readiness:
    """Run the checks; a failure is logged and named, never raised.

    The two kinds of storage trouble are told apart, as the API's answers tell them
    apart: a database out of reach (`database: failed`, 503 on the API: wait and retry)
    and a data dir without space (`storage: full`, 507 on the API: free space). On the
    embedded SQLite database a full data dir is also why its writes fail.

    `ping_bucket` (the S3 backend): one cheap request to the bucket. An instance that
    cannot reach it cannot store an upload nor serve a file it has not fetched yet, so
    it is not ready (`bucket: failed`); None (the local backend) reports `off`.
    """
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
        if is_disk_full(error):
            storage = FULL
            problems.append(f"storage: data dir is full ({error.strerror or error})")
        else:
            storage = FAILED
            problems.append(f"storage: data dir is not writable ({error.strerror or error})")
    bucket = OFF
    if ping_bucket is not None:
        bucket = OK
        try:
            ping_bucket()
        except Exception as error:  # unreachable, refused, no credentials: not ready
            logger.warning("readiness: object store bucket unavailable: %s", error)
            bucket = FAILED
            problems.append(f"bucket: the object store cannot be reached ({error})")
    return Readiness(database, storage, tuple(problems), bucket)
