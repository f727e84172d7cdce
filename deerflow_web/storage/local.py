"""Byte-level work inside a thread's uploads folder: staging, atomic commit, scans, sweeps.

Nothing here knows about requests or limits. Files are written to a hidden staging file in
the same folder and renamed into place, so a reader never sees half a file and a link at
the destination is never written through (SPEC 2.1.3-2.1.5).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import stat
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import NamedTuple

from deerflow_web.concurrency import start_beside
from deerflow_web.storage.digest import ContentDigest
from deerflow_web.storage.paths import STAGING_PREFIX
from deerflow_web.storage.paths import STAGING_SUFFIX
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.paths import storage_modes

logger = logging.getLogger(__name__)

# Smaller pieces (a slow client's chunks are 64 KiB) are hashed in place: only megabyte
# chunks were measured to gain from a hand-off to a thread.
HASH_BESIDE_MIN = 256 * 1024


def staging_path(folder: Path) -> Path:
    """A fresh hidden name in `folder` that listings skip and start-up sweeps remove."""
    return folder / f"{STAGING_PREFIX}{secrets.token_hex(8)}{STAGING_SUFFIX}"


@dataclass
class AtomicCommit:
    """Files renamed into place, recorded so a failure can put every one of them back: the
    commit of a request's files (or of a rename) is all or nothing.

    `undo` moves each file back to the name it came from (a staging file stays staged, so
    a resumable upload can be committed again) and puts the replaced file back.
    """

    renamed: list[tuple[Path, Path, Path | None]] = field(default_factory=list)
    set_aside: list[Path] = field(default_factory=list)

    def rename(self, source: Path, dest: Path) -> None:
        backup = None
        if os.path.lexists(dest):
            # A hard link keeps the old bytes reachable without a moment where `dest`
            # is missing; it lives only until the commit has succeeded.
            backup = staging_path(dest.parent)
            os.link(dest, backup)
        try:
            os.replace(source, dest)
        except BaseException:
            if backup is not None:
                backup.unlink(missing_ok=True)
            raise
        self.renamed.append((source, dest, backup))

    def remove(self, path: Path) -> None:
        """Take `path` out of its name now and delete it once the commit has succeeded
        (`forget_backups`); `undo` puts it back."""
        aside = staging_path(path.parent)
        os.replace(path, aside)
        self.renamed.append((path, aside, None))
        self.set_aside.append(aside)

    def undo(self) -> None:
        for source, dest, backup in reversed(self.renamed):
            try:
                os.replace(dest, source)
                if backup is not None:
                    os.replace(backup, dest)
            except OSError:
                logger.exception("could not roll back %s", dest)
        self.renamed.clear()
        self.set_aside.clear()

    def forget_backups(self) -> None:
        for path in [backup for _, _, backup in self.renamed if backup] + self.set_aside:
            path.unlink(missing_ok=True)


def is_safe_destination(path: Path) -> bool:
    """Whether `path` may be replaced: absent, or a regular file with a single link.

    Symlinks (dangling ones too), directories, FIFOs, devices and hard-linked files are
    never replaced, so an upload can never write through to something outside the folder.
    """
    try:
        info = path.lstat()
    except FileNotFoundError:
        return True
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


def is_disk_full(error: OSError) -> bool:
    """ENOSPC or EDQUOT: the write failed for lack of space, not because of a bug."""
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


class StagingFile:
    """A staging file being written; hashes and sniffs the bytes as they pass through.

    The SHA-256 and the content type come from the one pass that writes the file, so a
    large upload is never read a second time. The file stays open and locked until it is
    committed or discarded: the lock is how a start-up sweep in another process tells a
    live upload from one a killed server left behind.
    """

    def __init__(self, folder: Path) -> None:
        self.path = staging_path(folder)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._digest = ContentDigest()
        self.size = 0
        self._hashing: Callable[[], None] | None = None

    def write(self, data: bytes, *, hash_beside: bool = False) -> None:
        """Append one chunk, hashing it on the way.

        With `hash_beside` the caller promises to leave `data` unchanged until its next call
        on this file, and a large chunk is hashed on a native thread (`start_beside`) while
        this call writes it and the caller reads the next one: a lone fast upload then
        hashes on the core gevent's loop leaves idle (bench/README.md). One hash is in
        flight at most, so the chunks are hashed in order. Without the promise (or under
        threads) the chunk is hashed in place.
        """
        self._wait_for_hash()
        if hash_beside and len(data) >= HASH_BESIDE_MIN:
            # Started before the write, so the write runs beside it too: started after
            # it, the hash overlapped less and the upload measured 0.95-0.99x, not 1.2x.
            self._hashing = start_beside(self._digest.hash.update, data)
            self._digest.keep_head(data)
        else:
            self._digest.update(data)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self.size += len(data)

    def _wait_for_hash(self) -> None:
        if self._hashing is not None:
            hashing, self._hashing = self._hashing, None
            hashing()

    def finish(self, filename: str) -> tuple[str, str]:
        """Give the file the data dir's file mode; return (sha256, content type)."""
        self._wait_for_hash()
        os.fchmod(self._fd, storage_modes().file)
        return self._digest.result(filename)

    def close(self) -> None:
        """Release the file once it has been renamed into place; safe to call twice."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        """Close and delete; safe to call twice."""
        self._wait_for_hash()  # the caller may reuse the chunk once this returns
        self.close()
        self.path.unlink(missing_ok=True)


def is_abandoned(path: str) -> bool:
    """Whether no live process holds the staging file's lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


class FileFacts(NamedTuple):
    """What a scan learns about a regular file without reading it (a tuple: scans are hot).

    `ctime_ns` is the one a writer cannot set back: `cp -p`, `touch -d` and `os.utime`
    restore an mtime, but every write (and that restore itself) moves the ctime.
    """

    size: int
    mtime_ns: int
    inode: int
    ctime_ns: int


def facts_of(info: os.stat_result) -> FileFacts:
    """The identity used to notice a file that changed behind the app's back."""
    return FileFacts(info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)


def is_foreign_link(info: os.stat_result, known_inode: int | None) -> bool:
    """Whether a file is hard-linked (more than one name) and not the file the records know.

    A hard link in `uploads/` may name any file of the same file system (an agent with a
    local sandbox can make one); its bytes belong elsewhere, so it is not listed, served
    or read unless it is the very file that was uploaded under that name.
    """
    return info.st_nlink > 1 and info.st_ino != known_inode


def scan_regular_files(
    folder: Path, known: Mapping[str, int] | None = None
) -> dict[str, FileFacts]:
    """Regular files directly in `folder`: no symlinks, no subfolders, no staging files,
    and no foreign hard links (`known` maps the recorded names to their inodes).

    A missing folder is an empty one; nothing is created.
    """
    known = known or {}
    found: dict[str, FileFacts] = {}
    try:
        entries = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return found
    with entries:
        for entry in entries:
            if is_staging_name(entry.name) or not entry.is_file(follow_symlinks=False):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we looked
            if is_foreign_link(info, known.get(entry.name)):
                continue
            found[entry.name] = facts_of(info)
    return found


def sweep_staging_files(
    upload_dirs: Iterable[Path], keep: Callable[[Path], bool] = lambda _: False
) -> int:
    """Remove staging files a killed upload left behind; return how many went (SPEC 1.7).

    `keep` spares the staging files of resumable uploads, which wait unlocked between
    their requests; it is asked only about files no live process holds.
    """
    removed = 0
    for folder in upload_dirs:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not is_staging_name(entry.name) or not entry.is_file(follow_symlinks=False):
                continue
            if not is_abandoned(entry.path) or keep(Path(entry.path)):
                continue  # an upload in progress in another process, or a resumable one
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                logger.warning("could not remove stale staging file %s", entry.path, exc_info=True)
    if removed:
        logger.info("removed %d stale upload staging file(s)", removed)
    return removed
