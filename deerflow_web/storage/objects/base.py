"""What every object store offers: bytes under a key, written atomically, read as a stream.

The upload records stay the source of truth (what a thread holds, names, sizes, sha256);
a store only keeps bytes. Its guarantees are the ones the upload service builds on:

- **Nothing partial is ever visible.** A writer's bytes appear under their key only when
  `commit` returns, all at once; `abort` (or leaving the `with` block by an exception)
  leaves nothing behind, and a writer whose process died is found by
  `list_stale_uploads` and removed with `abort_stale_upload`.
- **Replacing is atomic for readers.** A reader gets the old bytes or the new ones, never
  a mix: a rename on disk, a single PUT or CompleteMultipartUpload on S3.
- **The sha256 is of the bytes written.** A writer hashes as it writes; the S3 backend
  also has the server check each request's SHA-256, so what is stored is what was hashed.
- **Streaming, bounded memory.** A writer holds the part it fills and the few it has on
  their way (`storage.s3.parts_in_flight`, 3 of 8 MiB by default); readers yield
  chunks.

Listing (`list_keys`) is for sweeps and migration only: what a user sees is listed from
the records, never from the bucket.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterator
from typing import NamedTuple
from typing import Protocol

READ_CHUNK = 1024 * 1024  # one system call or socket read per megabyte


class ObjectInfo(NamedTuple):
    """What a store knows of one object. `sha256` is None where the store keeps no
    checksum of its own (the local disk; S3 objects written in several parts, whose
    metadata is fixed before the first byte): the records hold it."""

    key: str
    size: int
    sha256: str | None = None
    modified: float | None = None  # seconds since the epoch


class StaleUpload(NamedTuple):
    """A write that was started and never committed or aborted (its process died)."""

    key: str
    upload_id: str  # S3's UploadId; on disk, the staging file's key
    started: float  # seconds since the epoch


class ObjectWriter(Protocol):
    """One object being written; invisible until `commit`."""

    key: str
    size: int  # bytes written so far

    def write(self, data: bytes, *, hash_beside: bool = False) -> None:
        """Append `data`. With `hash_beside` the caller promises to leave `data`
        unchanged until its next call on this writer (see `StagingFile.write`)."""
        ...

    def commit(self) -> ObjectInfo:
        """Make the bytes visible under the key, replacing what was there; the info
        carries the sha256 of the bytes written."""
        ...

    def abort(self) -> None:
        """Drop what was written; safe to call twice, and after `commit` does nothing."""
        ...

    def __enter__(self) -> ObjectWriter: ...

    def __exit__(self, *exc: object) -> None: ...


class ObjectStream(Protocol):
    """The bytes of one object (or of a range of it), as chunks; close it when done."""

    key: str
    start: int  # offset of the first byte yielded
    length: int  # bytes this stream yields
    total_size: int  # the whole object's size

    def __iter__(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...

    def __enter__(self) -> ObjectStream: ...

    def __exit__(self, *exc: object) -> None: ...


class ObjectStore(Protocol):
    """File bytes keyed by `keys.check_key` keys (see the module docstring)."""

    name: str  # "local" or "s3", for logs and figures

    def open_writer(self, key: str) -> ObjectWriter:
        """Start writing `key`; nothing is visible until the writer's `commit`."""
        ...

    def open_read(self, key: str, start: int = 0, length: int | None = None) -> ObjectStream:
        """Stream the object from `start` for `length` bytes (to the end when None).
        A range past the end yields nothing.

        Raises:
            ObjectNotFound: Nothing is stored under `key`.
        """
        ...

    def head(self, key: str) -> ObjectInfo:
        """Size (and sha256 where stored) of one object.

        Raises:
            ObjectNotFound: Nothing is stored under `key`.
        """
        ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove the object; a missing one is fine."""
        ...

    def copy(self, source: str, dest: str) -> ObjectInfo:
        """Copy within the store (S3: server-side), replacing `dest` atomically.

        Raises:
            ObjectNotFound: Nothing is stored under `source`.
        """
        ...

    def rename(self, source: str, dest: str) -> ObjectInfo:
        """Move within the store: a rename on disk; on S3 a server-side copy, then the
        source deleted (between the two both keys hold the bytes, never neither).

        Raises:
            ObjectNotFound: Nothing is stored under `source`.
        """
        ...

    def list_keys(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every committed object whose key starts with `prefix`, in key order on S3 and
        in folder-walk order on disk. For sweeps and migration only."""
        ...

    def list_stale_uploads(self, prefix: str = "", older_than: float = 0.0) -> list[StaleUpload]:
        """Writes started at least `older_than` seconds ago and never finished.

        On disk a staging file still locked by a live process is never stale. S3 cannot
        tell a live upload of another instance from a dead one, so there the age is the
        whole rule: pick one longer than any upload may take.
        """
        ...

    def abort_stale_upload(self, upload: StaleUpload) -> None:
        """Remove what a stale write left behind; one already gone is fine."""
        ...

    def presigned_url(
        self,
        key: str,
        *,
        expires_seconds: int = 300,
        filename: str | None = None,
        content_type: str | None = None,
    ) -> str | None:
        """A short-lived URL that serves the object without credentials, or None when the
        store has none (local disk). `filename` makes it an attachment of that name;
        `content_type` is the type the response declares."""
        ...


def sweep_stale_uploads(
    store: ObjectStore,
    prefix: str = "",
    older_than: float = 0.0,
    keep: Callable[[], Collection[str]] | None = None,
) -> int:
    """Abort every stale upload under `prefix`; return how many went (the sweep after a
    killed process).

    `keep` names uploads (by `upload_id`) to spare whatever their age: those a live
    resumable upload is still filling, part by part, for as long as its own expiry
    (`uploads.resumable_expiry_hours`, moved on by each chunk) keeps it; asked after the
    listing, so an upload named meanwhile is spared too.
    """
    stale = store.list_stale_uploads(prefix, older_than)
    if keep is not None and stale:
        spared = set(keep())
        stale = [upload for upload in stale if upload.upload_id not in spared]
    for upload in stale:
        store.abort_stale_upload(upload)
    return len(stale)


class ReadWatcher(Protocol):
    """Sees each piece an `ObjectFile` hands out, and its closing (`KeptDownload`)."""

    def passed(self, position: int, piece: memoryview) -> None: ...

    def close(self) -> None: ...


class ObjectFile(io.RawIOBase):
    """One stored object as a read-only, seekable file: what `send_file` and werkzeug's
    `Range` handling expect, so an object is served exactly as a file on disk is.

    Nothing is fetched until the first read; a read after a `seek` elsewhere opens the
    object at that offset (on S3, a ranged GET), so a `Range` request sends only its bytes.
    `fileno` is unsupported, so no server tries a kernel `sendfile` on it.
    """

    def __init__(
        self, store: ObjectStore, key: str, size: int, *, watcher: ReadWatcher | None = None
    ) -> None:
        super().__init__()
        self.store = store
        self.key = key
        self.size = size
        self._watcher = watcher  # told of every piece read, where it starts, and the close
        self._position = 0
        self._stream: ObjectStream | None = None
        self._chunks: Iterator[bytes] | None = None
        self._pending = memoryview(b"")  # what the last chunk holds beyond the last read

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        position = base + offset
        if position < 0:
            raise ValueError("negative seek position")
        if position != self._position:
            self._drop_stream()
            self._position = position
        return position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        target = memoryview(buffer).cast("B")
        piece = self._take(len(target))
        target[: len(piece)] = piece
        return len(piece)

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all the rest when negative), cut from the chunk on hand."""
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(READ_CHUNK), b""))
        return bytes(self._take(size))

    def open_now(self) -> None:
        """Start fetching from the current position, so that a store out of reach fails
        here (a response's 503) rather than at the first read, once headers are sent.

        Raises:
            ObjectNotFound, ObjectStoreUnavailable: As `ObjectStore.open_read`.
        """
        if self._chunks is None and self._position < self.size:
            self._stream = self.store.open_read(self.key, self._position)
            self._chunks = iter(self._stream)

    def _take(self, size: int) -> memoryview:
        """Up to `size` bytes from the current position; empty at the end."""
        if size <= 0 or self._position >= self.size:
            return memoryview(b"")
        if not self._pending:
            self.open_now()
            assert self._chunks is not None
            self._pending = memoryview(next(self._chunks, b""))
        piece, self._pending = self._pending[:size], self._pending[size:]
        if self._watcher is not None:
            self._watcher.passed(self._position, piece)
        self._position += len(piece)
        return piece

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream, self._chunks, self._pending = None, None, memoryview(b"")

    def close(self) -> None:
        self._drop_stream()
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            watcher.close()
        super().close()
