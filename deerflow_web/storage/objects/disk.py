"""The local backend: objects are files of the data dir, at their keys (`keys.py`).

The same mechanics as every other write of the app (storage/local.py): bytes go to a
hidden, locked staging file beside their destination and are renamed into place, so a
reader sees the old file or the new one and a killed writer leaves only a staging file,
which no live process holds (the lock says so) and the sweep removes. No folder on the
way is ever a link (`ThreadPaths` walks every level without following one), and a
destination that is a link, a folder or a hard-linked file is never written through.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from deerflow_web.errors import InsufficientStorage
from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import UnsafeFilename
from deerflow_web.errors import UnsafeFolder
from deerflow_web.storage.local import StagingFile
from deerflow_web.storage.local import is_abandoned
from deerflow_web.storage.local import is_disk_full
from deerflow_web.storage.local import is_safe_destination
from deerflow_web.storage.objects.base import READ_CHUNK
from deerflow_web.storage.objects.base import ObjectInfo
from deerflow_web.storage.objects.base import StaleUpload
from deerflow_web.storage.objects.keys import check_key
from deerflow_web.storage.objects.keys import check_prefix
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.resumable import STAGING_PREFIX as TUS_STAGING_PREFIX

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class DiskObjectStore:
    """Objects as files under one data dir (today's layout, today's atomic rename)."""

    name = "local"

    def __init__(self, base_dir: str | os.PathLike[str]) -> None:
        self.paths = ThreadPaths(base_dir)
        self.base_dir = self.paths.base_dir

    def path_of(self, key: str) -> Path:
        """Where `key` lives on disk (its folders not checked: see `_checked`)."""
        return self.base_dir / check_key(key)

    def _checked(self, key: str) -> Path:
        """The file of `key` once every folder above it is a real folder, not a link."""
        path = self.path_of(key)
        self.paths.checked(path.parent)
        return path

    def open_writer(self, key: str) -> DiskWriter:
        path = self.path_of(key)
        self.paths.make_dirs(path.parent)
        return DiskWriter(self, key, path)

    def open_read(self, key: str, start: int = 0, length: int | None = None) -> DiskStream:
        path = self._checked(key)
        try:
            fd = os.open(path, _READ_FLAGS)
        except (FileNotFoundError, NotADirectoryError) as error:
            raise ObjectNotFound(key) from error
        except OSError as error:  # ELOOP: the key is a link, which is never followed
            raise ObjectNotFound(key) from error
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise ObjectNotFound(key)
        return DiskStream(key, fd, info.st_size, start, length)

    def head(self, key: str) -> ObjectInfo:
        path = self._checked(key)
        try:
            info = path.lstat()
        except (FileNotFoundError, NotADirectoryError) as error:
            raise ObjectNotFound(key) from error
        if not stat.S_ISREG(info.st_mode):
            raise ObjectNotFound(key)
        return ObjectInfo(key, info.st_size, None, info.st_mtime)

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except ObjectNotFound:
            return False
        return True

    def delete(self, key: str) -> None:
        try:
            path = self._checked(key)
        except UnsafeFolder:
            return  # nothing of the store's lies behind a link
        try:
            if not stat.S_ISDIR(path.lstat().st_mode):
                path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            pass

    def copy(self, source: str, dest: str) -> ObjectInfo:
        check_key(source), check_key(dest)
        with self.open_read(source) as stream, self.open_writer(dest) as writer:
            for chunk in stream:
                writer.write(chunk)
            return writer.commit()

    def rename(self, source: str, dest: str) -> ObjectInfo:
        check_key(source), check_key(dest)
        self.head(source)  # a regular file, not a link
        old = self._checked(source)
        new = self.path_of(dest)
        self.paths.make_dirs(new.parent)
        if not is_safe_destination(new):
            raise UnsafeFilename(f"{dest} cannot be replaced: it is a link or a folder")
        os.replace(old, new)
        return self.head(dest)

    def _walk(self, prefix: str) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """(key, entry) of every regular file under `prefix`, never through a link."""
        check_prefix(prefix)
        folder = prefix if prefix.endswith("/") or not prefix else prefix.rpartition("/")[0]
        start = self.base_dir / folder if folder else self.base_dir
        try:
            self.paths.checked(start)
        except UnsafeFolder:
            return
        pending = [start]
        while pending:
            current = pending.pop()
            try:
                with os.scandir(current) as found:
                    entries = sorted(found, key=lambda e: e.name, reverse=True)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                key = Path(entry.path).relative_to(self.base_dir).as_posix()
                if entry.is_dir(follow_symlinks=False):
                    if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                        pending.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False) and key.startswith(prefix):
                    yield key, entry

    def list_keys(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Committed files under `prefix` (staging files left out). The data dir also
        holds the app's own files (the database, the secret key): a sweep or a migration
        lists the thread layouts, `users/` and `threads/`, not the empty prefix."""
        for key, entry in self._walk(prefix):
            if is_staging_name(entry.name):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we looked
            yield ObjectInfo(key, info.st_size, None, info.st_mtime)

    def list_stale_uploads(self, prefix: str = "", older_than: float = 0.0) -> list[StaleUpload]:
        """Staging files no live process holds, older than `older_than` seconds; the
        staging files of resumable (tus) uploads wait unlocked between their requests and
        have their own expiry, so they are left to it."""
        deadline = time.time() - older_than
        stale = []
        for key, entry in self._walk(prefix):
            if not is_staging_name(entry.name) or entry.name.startswith(TUS_STAGING_PREFIX):
                continue
            try:
                modified = entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            if modified <= deadline and is_abandoned(entry.path):
                stale.append(StaleUpload(key, key, modified))
        return stale

    def abort_stale_upload(self, upload: StaleUpload) -> None:
        path = self._checked(upload.upload_id)
        if not is_staging_name(path.name):
            raise UnsafeFilename(f"{upload.upload_id} is not a staging file")
        if is_abandoned(str(path)):
            path.unlink(missing_ok=True)

    def presigned_url(
        self,
        key: str,
        *,
        expires_seconds: int = 300,
        filename: str | None = None,
        content_type: str | None = None,
    ) -> str | None:
        """None: a file on disk is served by the app itself."""
        check_key(key)
        return None


class DiskWriter:
    """A staging file beside the destination, renamed into place by `commit`."""

    def __init__(self, store: DiskObjectStore, key: str, dest: Path) -> None:
        self.key = key
        self._store = store
        self._dest = dest
        self._staging = StagingFile(dest.parent)
        self._done = False

    @property
    def size(self) -> int:
        return self._staging.size

    def write(self, data: bytes, *, hash_beside: bool = False) -> None:
        try:
            self._staging.write(data, hash_beside=hash_beside)
        except OSError as error:
            if is_disk_full(error):
                raise InsufficientStorage(self._dest.name) from error
            raise

    def commit(self) -> ObjectInfo:
        if self._done:
            raise RuntimeError(f"{self.key}: already committed or aborted")
        try:
            sha256, _ = self._staging.finish(self._dest.name)
            # Writing took a while: a link planted meanwhile is refused, not followed.
            self._store.paths.checked(self._dest.parent)
            if not is_safe_destination(self._dest):
                raise UnsafeFilename(f"{self.key} cannot be replaced: it is a link or a folder")
            os.replace(self._staging.path, self._dest)
        except BaseException:
            self.abort()
            raise
        self._staging.close()
        self._done = True
        info = self._dest.lstat()
        return ObjectInfo(self.key, info.st_size, sha256, info.st_mtime)

    def abort(self) -> None:
        if not self._done:
            self._staging.discard()
            self._done = True

    def __enter__(self) -> DiskWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


class DiskStream:
    """An open file read from `start` for `length` bytes, in `READ_CHUNK` pieces."""

    def __init__(self, key: str, fd: int, size: int, start: int, length: int | None) -> None:
        if start < 0 or (length is not None and length < 0):
            os.close(fd)
            raise ValueError("a range starts at 0 or later and has a length of 0 or more")
        self.key = key
        self.total_size = size
        self.start = min(start, size)
        end = size if length is None else min(size, self.start + length)
        self.length = end - self.start
        self._fd = fd

    def __iter__(self) -> Iterator[bytes]:
        offset, left = self.start, self.length
        try:
            while left > 0 and self._fd >= 0:
                chunk = os.pread(self._fd, min(READ_CHUNK, left), offset)
                if not chunk:
                    return  # truncated behind the app's back
                offset += len(chunk)
                left -= len(chunk)
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DiskStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
