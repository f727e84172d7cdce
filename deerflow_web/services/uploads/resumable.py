"""Resumable uploads (tus 1.0.0, SPEC 8): create, append, inspect, terminate, expire.

A resumable upload is one file sent in as many requests as the connection needs. Its state
lives in the database and its bytes in a staging file, so whichever server process gets the
next request carries on. The bytes on disk are the truth about the offset: after a request
was cut off (or its server killed) the next request finds the file's size and continues
from there, except for a checksummed chunk that never got compared, which is cut off again.
When the last byte arrives the file goes through `UploadService.commit_staged`, the commit
every multipart upload goes through, so both kinds of upload end in the same file and record.

On the S3 backend instances share no disk: there the bytes go to the bucket part by part
and the offset is the database's, so a request may land on any instance
(`resumable_s3.S3ResumableUploadService`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Protocol

from deerflow_web.errors import ChecksumMismatch
from deerflow_web.errors import FileTooLarge
from deerflow_web.errors import InfectedFile
from deerflow_web.errors import InsufficientStorage
from deerflow_web.errors import InvalidTusRequest
from deerflow_web.errors import MalformedUpload
from deerflow_web.errors import NameConflict
from deerflow_web.errors import OffsetMismatch
from deerflow_web.errors import PastUploadLength
from deerflow_web.errors import QuotaExceeded
from deerflow_web.errors import ResumableExpired
from deerflow_web.errors import ResumableNotFound
from deerflow_web.errors import StorageFailure
from deerflow_web.errors import TooLargeToScan
from deerflow_web.errors import UnsafeFilename
from deerflow_web.errors import UploadBusy
from deerflow_web.models import OnConflict
from deerflow_web.models import ResumableUpload
from deerflow_web.services.uploads.intake import AcceptedUploads
from deerflow_web.services.uploads.intake import UploadIntake
from deerflow_web.services.uploads.service import SavedFile
from deerflow_web.storage.digest import ContentDigest
from deerflow_web.storage.digest import hash_and_sniff
from deerflow_web.storage.filenames import normalize_filename
from deerflow_web.storage.local import is_disk_full
from deerflow_web.storage.objects.s3 import S3ObjectStore
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.paths import ref_of
from deerflow_web.storage.records import RecordsTransaction
from deerflow_web.storage.resumable import DatabaseResumableStore
from deerflow_web.storage.resumable import PendingCaps
from deerflow_web.storage.resumable import ResumableStaging
from deerflow_web.storage.resumable import ResumableStore
from deerflow_web.storage.resumable import staging_name

logger = logging.getLogger(__name__)

READ_SIZE = 1024 * 1024
CHECKSUM_ALGORITHMS: dict[str, Callable[[], Any]] = {
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
}
UPLOAD_ID = re.compile(r"[0-9a-f]{32}")  # the shape of every upload id (`secrets.token_hex(16)`)
_METADATA_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class ChunkSource(Protocol):
    """A request body read into the caller's buffer (see web/transport/request_body.py)."""

    def readinto(self, buffer: memoryview) -> int:
        """Fill the start of `buffer`; return the count, 0 only once the body has ended."""


@dataclass(frozen=True)
class Checksum:
    """A chunk's `Upload-Checksum`: the algorithm and the digest the client computed."""

    algorithm: str
    digest: bytes

    @classmethod
    def parse(cls, header: str) -> Checksum:
        """`sha1 <base64>` or `sha256 <base64>`.

        Raises:
            InvalidTusRequest: An unsupported algorithm or an undecodable digest.
        """
        algorithm, _, encoded = header.strip().partition(" ")
        if algorithm not in CHECKSUM_ALGORITHMS:
            raise InvalidTusRequest(
                f"Unsupported checksum algorithm {algorithm!r}: use one of sha1, sha256"
            )
        try:
            digest = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            digest = b""
        if len(digest) != CHECKSUM_ALGORITHMS[algorithm]().digest_size:
            raise InvalidTusRequest(f"Upload-Checksum is not a base64 {algorithm} digest")
        return cls(algorithm, digest)


def parse_metadata(header: str) -> dict[str, str]:
    """Decode `Upload-Metadata`: comma-separated `key base64value` pairs (tus creation).

    Raises:
        InvalidTusRequest: A malformed pair, a repeated key or a value that is not UTF-8.
    """
    metadata: dict[str, str] = {}
    for pair in header.split(","):
        pair = pair.strip()
        if not pair:
            continue
        key, _, encoded = pair.partition(" ")
        if not _METADATA_KEY.fullmatch(key) or key in metadata:
            raise InvalidTusRequest(f"Upload-Metadata has a bad or repeated key {key!r}")
        try:
            metadata[key] = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise InvalidTusRequest(
                f"Upload-Metadata value of {key!r} is not base64 UTF-8"
            ) from None
    return metadata


@dataclass
class _RunningDigest:
    """The SHA-256 and first bytes of an upload's first `offset` bytes, as one process saw
    them go by; spares reading the whole file again at the commit."""

    offset: int
    digest: ContentDigest


class _DigestCache:
    """Running digests of the uploads this process is receiving.

    Only a shortcut: an entry is used when its offset is exactly where the next chunk
    starts (bytes before a confirmed offset never change), and whenever it cannot be used
    the commit hashes the file from disk. A client keeps its connection, and so its
    process, between chunks, so the shortcut usually holds.
    """

    def __init__(self, size: int = 32) -> None:
        self._entries: OrderedDict[str, _RunningDigest] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def take(self, upload_id: str, offset: int) -> _RunningDigest | None:
        with self._lock:
            entry = self._entries.pop(upload_id, None)
        if offset == 0:
            return _RunningDigest(0, ContentDigest())
        return entry if entry is not None and entry.offset == offset else None

    def put(self, upload_id: str, entry: _RunningDigest) -> None:
        with self._lock:
            self._entries[upload_id] = entry
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def drop(self, upload_id: str) -> None:
        with self._lock:
            self._entries.pop(upload_id, None)


@dataclass(frozen=True)
class AppendOutcome:
    """Where an upload stands after a PATCH, and the committed file once it is complete."""

    upload: ResumableUpload
    accepted: AcceptedUploads | None = None


class ResumableUploadService:
    """The tus protocol's rules over the upload service and a `ResumableStore`."""

    def __init__(
        self,
        intake: UploadIntake,
        store: ResumableStore,
        *,
        expiry_seconds: float = 24 * 3600,
        caps: PendingCaps | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.intake = intake
        self.uploads = intake.uploads
        self.store = store
        self.expiry_seconds = expiry_seconds
        self.caps = caps
        self._clock = clock
        self._digests = _DigestCache()

    @property
    def max_size(self) -> int:
        """The largest upload accepted (`Tus-Max-Size`): the per-file limit."""
        return self.uploads.limits.max_file_size

    def create(self, thread: Thread, length: int, metadata_header: str) -> AppendOutcome:
        """Start an upload of `length` bytes; refuse at once what the commit would refuse.

        An empty file has nothing left to send, so it is committed here.

        Raises:
            InvalidTusRequest: No `filename` in the metadata, or malformed metadata.
            UnsafeFilename: A name the upload rules refuse.
            FileTooLarge: `length` is over `uploads.max_file_size`.
            NameConflict: `on_conflict=reject` and the name is taken.
            PendingUploadsCap: The user's unfinished uploads would go over
                `uploads.resumable_max_pending` or `uploads.resumable_max_pending_bytes`
                (counted in the database, across processes); nothing is kept.
            QuotaExceeded: `length` would take the owner over their storage quota (the
                declared length is reserved against it until the upload ends); nothing
                is kept.
        """
        self.sweep_expired()
        metadata = parse_metadata(metadata_header)
        raw_name = metadata.get("filename") or metadata.get("name")
        if not raw_name:
            raise InvalidTusRequest("Upload-Metadata must include a filename")
        name = normalize_filename(raw_name)
        if is_staging_name(name):
            raise UnsafeFilename(f"{name} is reserved for uploads in progress")
        on_conflict = OnConflict.named(metadata.get("on_conflict"), OnConflict.REPLACE)
        if length > self.max_size:
            raise FileTooLarge(name)
        folders = self.uploads.folders(thread)
        folder = folders.uploads_dir()
        if on_conflict is OnConflict.REJECT and (folder / name).exists():
            raise NameConflict(name)
        folders.make_dirs(folder)
        upload_id = secrets.token_hex(16)
        now = self._clock()
        upload = ResumableUpload(
            upload_id=upload_id,
            thread_id=folders.ref.thread_id,
            user_id=folders.ref.owner,
            filename=name,
            on_conflict=on_conflict.value,
            metadata=metadata_header,
            length=length,
            offset=0,
            created_at=now,
            expires_at=now + self.expiry_seconds,
            staging_path=folder / staging_name(upload_id),
        )
        # The row exists before the lock goes: a start-up sweep that finds the file
        # unlocked also finds the row, and keeps the file.
        staging = ResumableStaging.create(upload.staging_path)
        try:
            self.store.add(
                upload,
                self.caps,
                self.uploads.quotas,
                thread_row=self.uploads.paths.copies is not None,
            )
            if length == 0:
                return AppendOutcome(upload, self._complete(upload, staging))
        except BaseException:
            staging.discard()
            self.store.remove(upload_id)
            raise
        finally:
            staging.close()
        return AppendOutcome(upload)

    def status(self, thread: Thread, upload_id: str) -> ResumableUpload:
        """Where the upload stands (HEAD): the bytes on disk, or, while another request is
        writing, the offset that request started from.

        The full offset is reported only for a committed upload: an upload whose every
        byte arrived but whose commit failed (the database out of reach, a full disk) is
        committed now, so a client that retries after the 503 finishes.

        Raises:
            ResumableNotFound, ResumableExpired, NameConflict (the pending commit was
            refused), or the commit's failure again.
        """
        upload = self._find(thread, upload_id)
        if upload.committed_name is not None:
            return upload
        staging = self._acquire(upload)
        if isinstance(staging, ResumableUpload) or staging is None:
            return staging or upload
        try:
            upload = self._recover(upload, staging)
            if upload.offset == upload.length:
                self._complete(upload, staging)
            return upload
        finally:
            staging.close()

    def append(
        self,
        thread: Thread,
        upload_id: str,
        *,
        offset: int,
        body: ChunkSource,
        content_length: int | None,
        checksum: Checksum | None = None,
    ) -> AppendOutcome:
        """Write one chunk (PATCH) at `offset`; commit the file when it is complete.

        A cut-off chunk without a checksum keeps the bytes that arrived; a chunk with one
        is kept only whole and matching, else the file is cut back to where it started.

        Raises:
            ResumableNotFound, ResumableExpired: No such upload (any more).
            UploadBusy: Another request is writing to it.
            OffsetMismatch: `offset` is not where the upload stands.
            PastUploadLength: The chunk would end after `Upload-Length`.
            ChecksumMismatch: The chunk does not match `checksum`.
            NameConflict: The finished file was refused by `on_conflict=reject`.
        """
        upload = self._find(thread, upload_id)
        staging = self._acquire(upload) if upload.committed_name is None else upload
        if staging is None:
            raise UploadBusy()
        if isinstance(staging, ResumableUpload):  # committed
            return self._retried_last_patch(staging, offset, content_length)
        try:
            upload = self._recover(upload, staging)
            if offset != upload.offset:
                raise OffsetMismatch(upload.offset, offset)
            if content_length is not None and offset + content_length > upload.length:
                raise PastUploadLength(upload.length)
            end = self._receive(upload, staging, body, checksum)
            upload = replace(upload, offset=end)
            if end < upload.length:
                return AppendOutcome(upload)
            return AppendOutcome(upload, self._complete(upload, staging))
        finally:
            staging.close()

    def terminate(self, thread: Thread, upload_id: str) -> None:
        """Drop the upload and its bytes (DELETE); later requests find nothing.

        Raises:
            ResumableNotFound, ResumableExpired, UploadBusy.
        """
        upload = self._find(thread, upload_id)
        staging = self._acquire(upload) if upload.committed_name is None else upload
        if staging is None:
            raise UploadBusy()
        self.store.remove(upload.upload_id)
        if isinstance(staging, ResumableStaging):
            staging.discard()  # a committed upload's file is an upload now: it stays

    def sweep_expired(self) -> int:
        """Remove every expired upload that no request is writing to; return the count."""
        removed = 0
        for upload in self.store.expired(self._clock()):
            try:
                staging = ResumableStaging.acquire(upload.staging_path)
            except FileNotFoundError:
                staging = None
            except OSError:
                logger.warning("cannot open %s to expire it", upload.staging_path, exc_info=True)
                continue
            else:
                if staging is None:
                    continue  # a request is writing right now; the next sweep takes it
            self.store.remove(upload.upload_id)
            if staging is not None:
                staging.discard()
            removed += 1
        if removed:
            logger.info("removed %d expired resumable upload(s)", removed)
        return removed

    def is_live_staging(self, path: Path) -> bool:
        """Whether a staging file belongs to an upload still on record (start-up sweep)."""
        return self.store.has_staging(path)

    @staticmethod
    def _retried_last_patch(
        committed: ResumableUpload, offset: int, content_length: int | None
    ) -> AppendOutcome:
        """A PATCH on an upload already committed can only be a retry of the last one (its
        answer lost on the way): at the full length and without a body it is answered as
        before; anything else is refused, never written.

        Raises:
            OffsetMismatch: `offset` is not the upload's length.
            PastUploadLength: The retry brings bytes.
        """
        if offset != committed.length:
            raise OffsetMismatch(committed.length, offset)
        if content_length:
            raise PastUploadLength(committed.length)
        return AppendOutcome(committed)

    def _find(self, thread: Thread, upload_id: str) -> ResumableUpload:
        upload = self.store.get(upload_id) if UPLOAD_ID.fullmatch(upload_id) else None
        if upload is None or upload.ref != ref_of(thread):
            raise ResumableNotFound()
        if upload.expires_at <= self._clock():
            self.sweep_expired()
            raise ResumableExpired()
        return upload

    def _acquire(self, upload: ResumableUpload) -> ResumableStaging | ResumableUpload | None:
        """The staging file, locked; None while another request holds it; the upload as
        stored now when another request committed it meanwhile.

        Raises:
            ResumableNotFound: The staging file is gone and the upload was not committed.
        """
        try:
            return ResumableStaging.acquire(upload.staging_path)
        except FileNotFoundError:
            # Removed behind our back, or committed by another request just now: only the
            # first is forgotten (one conditional DELETE, so a commit landing meanwhile
            # keeps its row).
            self.store.remove(upload.upload_id, only_pending=True)
            current = self.store.get(upload.upload_id)
            if current is not None and current.committed_name is not None:
                return current
            raise ResumableNotFound() from None

    def _recover(self, upload: ResumableUpload, staging: ResumableStaging) -> ResumableUpload:
        """Make the stored offset agree with the bytes on disk (held lock only)."""
        size = staging.size()
        if upload.pending_from is not None:
            offset = upload.pending_from  # a checksummed chunk that was never verified
        else:
            offset = min(size, upload.length)
        if size != offset:
            staging.truncate(offset)
        if offset != upload.offset or upload.pending_from is not None:
            self.store.update(upload.upload_id, offset=offset, pending_from=None)
        return replace(upload, offset=offset, pending_from=None)

    def _receive(
        self,
        upload: ResumableUpload,
        staging: ResumableStaging,
        body: ChunkSource,
        checksum: Checksum | None,
    ) -> int:
        """Stream the body to the staging file; return the new offset, stored."""
        start = upload.offset
        digest = CHECKSUM_ALGORITHMS[checksum.algorithm]() if checksum else None
        expected = checksum.digest if checksum else b""
        if checksum is not None:
            self.store.update(upload.upload_id, offset=start, pending_from=start)
        running = self._digests.take(upload.upload_id, start)
        buffer = bytearray(READ_SIZE)
        view = memoryview(buffer)
        position = start
        try:
            while True:
                count, cut_off = fill_from(body, view)
                if position + count > upload.length:
                    raise PastUploadLength(upload.length)
                piece = view[:count]
                staging.write_at(piece, position)
                position += count
                if digest is not None:
                    digest.update(piece)
                if running is not None:
                    running.digest.update(piece)
                if cut_off is not None:
                    raise cut_off
                if count < len(view):
                    break
            if checksum is not None and digest.digest() != expected:
                raise ChecksumMismatch(checksum.algorithm)
        except BaseException as error:
            # The running digest may have seen bytes that are now cut off again.
            keep = start if digest is not None or isinstance(error, PastUploadLength) else position
            staging.truncate(keep)  # also drops a partly written piece
            self.store.update(upload.upload_id, offset=keep, pending_from=None)
            if isinstance(error, OSError):
                if is_disk_full(error):
                    raise InsufficientStorage(upload.filename) from error
                raise StorageFailure(f"Failed to upload {upload.filename}: {error}") from error
            raise
        self.store.update(
            upload.upload_id,
            offset=position,
            pending_from=None,
            expires_at=self._clock() + self.expiry_seconds,
        )
        if running is not None:
            running.offset = position
            self._digests.put(upload.upload_id, running)
        return position

    def _complete(self, upload: ResumableUpload, staging: ResumableStaging) -> AcceptedUploads:
        """Commit the finished file like a multipart part; the upload is marked committed
        in the commit's own transaction (kept until expiry, so a retry learns so).

        A refusal (`reject` and the name taken now, a link at the destination, a quota
        lowered meanwhile) ends the upload and its bytes. A failure (the database out of
        reach, a full disk) keeps both, the staging file back at its name: the next PATCH
        or HEAD at the full offset commits it.
        """
        running = self._digests.take(upload.upload_id, upload.length)
        if running is not None and upload.length > 0:
            sha256, content_type = running.digest.result(upload.filename)
        else:
            sha256, content_type = hash_and_sniff(staging.path)
        try:
            return self._commit_file(upload, staging, sha256, content_type)
        except (NameConflict, UnsafeFilename, InfectedFile, TooLargeToScan, QuotaExceeded):
            staging.discard()
            self.store.remove(upload.upload_id)
            raise

    def _commit_file(
        self, upload: ResumableUpload, staging: ResumableStaging, sha256: str, content_type: str
    ) -> AcceptedUploads:
        """The finished bytes in `staging` through the commit every upload goes through."""
        staging.make_readable()

        def mark_committed(txn: RecordsTransaction, saved: list[SavedFile]) -> None:
            self.store.mark_committed(upload.upload_id, saved[0].record.filename, txn.connection)

        return self.intake.accept_staged(
            upload.ref,
            upload.filename,
            staging,
            sha256=sha256,
            content_type=content_type,
            on_conflict=OnConflict(upload.on_conflict),
            then=mark_committed,
            reserved=upload.length,  # held for it since its creation
        )


def fill_from(body: ChunkSource, view: memoryview) -> tuple[int, MalformedUpload | None]:
    """Read until the buffer is full or the body ends: few large writes, however the
    server's reads happen to be cut. A body cut off midway returns what did arrive, with
    the error to raise once that is on disk."""
    count = 0
    try:
        while count < len(view) and (got := body.readinto(view[count:])):
            count += got
    except MalformedUpload as error:
        return count, error
    except (ConnectionError, TimeoutError) as error:
        return count, MalformedUpload(f"The connection was lost mid-chunk: {error}")
    return count, None


def make_resumable_service(
    intake: UploadIntake,
    *,
    expiry_hours: float = 24.0,
    max_pending: int | None = None,
    max_pending_bytes: int | None = None,
    lease_seconds: float = 120.0,
) -> ResumableUploadService:
    """Build the service over the upload service's data dir and database; `lease_seconds`
    is the S3 flavour's writer lease (`uploads.resumable_lease_seconds`)."""
    store = DatabaseResumableStore(intake.uploads.records.engine)
    caps = PendingCaps(max_pending, max_pending_bytes)
    copies = intake.uploads.paths.copies
    if copies is not None and isinstance(copies.store, S3ObjectStore):
        # Imported here: the S3 flavour builds on this module's service.
        from deerflow_web.services.uploads.resumable_s3 import S3ResumableUploadService

        return S3ResumableUploadService(
            intake,
            store,
            copies,
            copies.store.part_uploads(),
            lease_seconds=lease_seconds,
            expiry_seconds=expiry_hours * 3600,
            caps=caps,
        )
    return ResumableUploadService(intake, store, expiry_seconds=expiry_hours * 3600, caps=caps)
