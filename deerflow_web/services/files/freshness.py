"""A record checked against its file at the moment the file is used.

A listing trusts the records between two scans of the folder (`UploadService.list_uploads`),
so an edit in place behind the app's back (same name, same inode, the folder untouched) shows
in a list only at the next scan. Whatever is served *from* a record is checked first: a
download's ETag, the text an agent reads, the companion chosen for a document, the source a
conversion starts from. One `fstat` of the opened file gives its size, mtime, inode and
ctime; the ctime is the fact no writer can set back (`cp -p`, `touch -d` and `os.utime`
restore an mtime, and move the ctime doing so). When they differ from the record, the open
file is hashed again and the record updated under the records lock, so its SHA-256 and all
that follows from it (the ETag, whether a companion is current) describe the bytes about
to be served.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import BinaryIO

from deerflow_web.concurrency import off_loop
from deerflow_web.models import UploadRecord
from deerflow_web.storage.digest import hash_and_sniff_open
from deerflow_web.storage.local import FileFacts
from deerflow_web.storage.local import facts_of
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.records import StoredRecord

if TYPE_CHECKING:
    from deerflow_web.services.files.artifacts import Artifact
    from deerflow_web.services.uploads.service import UploadService


@dataclass(frozen=True)
class CheckedFile:
    """An opened file, its identity at the moment it was opened, and the upload record that
    describes exactly those bytes (None outside uploads/, or while the file keeps changing)."""

    file: BinaryIO
    facts: FileFacts
    record: UploadRecord | None

    @property
    def etag(self) -> str:
        """Changes whenever the bytes may have: their SHA-256 when a record vouches for them
        (bare hex, the form DeerFlow's artifact editor reads back as `expected_sha256`), else
        the whole identity (a write always moves the ctime)."""
        if self.record is not None:
            return self.record.sha256
        facts = self.facts
        return f"{facts.inode:x}-{facts.size:x}-{facts.mtime_ns:x}-{facts.ctime_ns:x}"


def describes(stored: StoredRecord, facts: FileFacts, *, working_copy: bool = False) -> bool:
    """Whether a record was written for the file as it is now (a record without a ctime,
    from an earlier release, never counts: its file is hashed once).

    A `working_copy` (the S3 backend's data dir) was written by this instance, or fetched
    and given its record's mtime, so there size and mtime tell: its inode and ctime are
    this machine's, never the ones the record was written with.
    """
    if working_copy:
        return (stored.record.size, stored.mtime_ns) == (facts.size, facts.mtime_ns)
    return stored.ctime_ns is not None and (
        stored.record.size,
        stored.mtime_ns,
        stored.inode,
        stored.ctime_ns,
    ) == tuple(facts)


def open_checked(uploads: UploadService, thread: Thread, path: Path) -> CheckedFile:
    """Open a resolved file of the thread (never through a link) and check its record.

    Raises:
        OSError: The file is gone or cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    handle = os.fdopen(fd, "rb")
    try:
        info = os.fstat(fd)
        record = None
        folders = uploads.folders(thread)
        if stat.S_ISREG(info.st_mode) and folders.holds_upload(path):
            record = checked_record(uploads, folders, path.name, fd, info)
        return CheckedFile(handle, facts_of(info), record)
    except BaseException:
        handle.close()
        raise


def open_artifact(uploads: UploadService, thread: Thread, artifact: Artifact) -> CheckedFile:
    """Open a resolved artifact to send it: the file here (`open_checked`) or, for an
    upload streamed from the bucket (`Artifact.in_bucket`), its blob, described by its
    record as a file fetched here would be (same size, mtime and ETag).

    Raises:
        OSError: The file is gone or cannot be opened.
    """
    record = artifact.in_bucket
    if record is None:
        return open_checked(uploads, thread, artifact.path)
    copies = uploads.paths.copies
    assert copies is not None  # only the S3 backend makes such artifacts
    mtime_ns = round(record.modified * 1e9)  # Last-Modified is in whole seconds
    blob = copies.open_blob(uploads.folders(thread), record)
    return CheckedFile(blob, FileFacts(record.size, mtime_ns, 0, 0), record)


def checked_upload(uploads: UploadService, thread: Thread, filename: str) -> UploadRecord | None:
    """The upload's record, checked against its file now (see `checked_record`); None when
    the file cannot be opened as a regular file."""
    folders = uploads.folders(thread)
    path = folders.uploads_dir() / filename
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return checked_record(uploads, folders, filename, fd, info)
    finally:
        os.close(fd)


def checked_record(
    uploads: UploadService,
    thread: Thread,
    filename: str,
    fd: int,
    info: os.stat_result,
) -> UploadRecord | None:
    """The record of the upload open as `fd` (whose `fstat` is `info`), made to describe it.

    None when there is no record, or when the file changed while it was hashed or no longer
    has this name: then nothing vouches for its bytes, and the next use looks again.
    """
    folders = uploads.folders(thread)
    scope = folders.scope
    records = uploads.records
    stored = records.get(scope, filename)
    if stored is None:
        return None
    facts = facts_of(info)
    if describes(stored, facts, working_copy=uploads.paths.copies is not None):
        return stored.record
    sha256, content_type = off_loop(hash_and_sniff_open, fd, filename)
    if facts_of(os.fstat(fd)) != facts:
        return None  # written to while we read it
    path = folders.uploads_dir() / filename
    with records.locked(scope) as txn:
        current = txn.get(filename)
        try:
            named = path.lstat()
        except OSError:
            return None
        if current is None or named.st_ino != facts.inode or named.st_nlink != 1:
            return None  # deleted, renamed over or linked meanwhile
        record = replace(
            current.record,
            size=facts.size,
            sha256=sha256,
            content_type=content_type,
            modified=facts.mtime_ns / 1e9,
        )
        if sha256 != current.record.sha256:  # new bytes have not been scanned
            record = replace(record, scan_state=None, scan_signatures=None)
        # Only the file's columns: a conversion job running on it keeps its owner and lease.
        fresh = StoredRecord(record, facts.mtime_ns, facts.inode, facts.ctime_ns)
        records.update_file(scope, fresh)
        folders.forget_records()
    return record
