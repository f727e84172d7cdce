"""Resumable uploads (tus 1.0.0, SPEC 8): create, append, inspect, terminate, expire.

A resumable upload is one file sent in as many requests as the connection needs. Its state
lives in the database and its bytes in a staging file, so whichever server process gets the
next request carries on. The bytes on disk are the truth about the offset: after a request
was cut off (or its server killed) the next request finds the file's size and continues
from there, except for a checksummed chunk that never got compared, which is cut off again.
When the last byte arrives the file goes through `UploadService.commit_staged`, the commit
every multipart upload goes through, so both kinds of upload end in the same file and record.

On the S3 backend (`S3ResumableUploadService`) instances share no disk: the bytes go to the
bucket part by part and the offset is the database's, so a request may land on any
instance.
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
from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import ObjectStoreUnavailable
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
from deerflow_web.storage.objects.keys import blob_key
from deerflow_web.storage.objects.keys import incoming_key
from deerflow_web.storage.objects.s3 import S3ObjectStore
from deerflow_web.storage.objects.s3 import S3PartUploads
from deerflow_web.storage.objects.s3 import UploadedPart
from deerflow_web.storage.objects.working_copy import WorkingCopies
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.paths import ref_of
from deerflow_web.storage.records import RecordsTransaction
from deerflow_web.storage.resumable import STAGING_PREFIX
from deerflow_web.storage.resumable import STAGING_SUFFIX
from deerflow_web.storage.resumable import DatabaseResumableStore
from deerflow_web.storage.resumable import PendingCaps
from deerflow_web.storage.resumable import ResumableStaging
from deerflow_web.storage.resumable import ResumableStore
from deerflow_web.storage.resumable import S3Progress
from deerflow_web.storage.resumable import SentPart
from deerflow_web.storage.resumable import staging_name

logger = logging.getLogger(__name__)

READ_SIZE = 1024 * 1024
CHECKSUM_ALGORITHMS: dict[str, Callable[[], Any]] = {
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
}
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
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
        if isinstance(staging, ResumableUpload):  # committed: a retry of the last PATCH
            if offset != staging.length:
                raise OffsetMismatch(staging.length, offset)
            if content_length:
                raise PastUploadLength(staging.length)
            return AppendOutcome(staging)
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

    def _find(self, thread: Thread, upload_id: str) -> ResumableUpload:
        upload = self.store.get(upload_id) if _UPLOAD_ID.fullmatch(upload_id) else None
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
                count, cut_off = _fill(body, view)
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


LEASE_SECONDS = 120.0  # how long a killed writer blocks its upload at most
_RENEW_AFTER = LEASE_SECONDS / 4
_REFUSED_AT_COMMIT = (NameConflict, UnsafeFilename, InfectedFile, TooLargeToScan, QuotaExceeded)


class S3ResumableUploadService(ResumableUploadService):
    """tus on the S3 backend (`storage.backend: s3`), where instances share no disk.

    Each PATCH's bytes go to the bucket as parts of one multipart upload at the upload's
    incoming key (`keys.incoming_key`); what follows the last full part (S3 takes parts of
    at least 5 MiB but the last; ours are the store's `part_size`) is kept as an object of
    its own, the tail, named by the offset it ends at, so a failed PATCH never destroys the
    one before, and the next PATCH, on whichever instance it lands, sends it first. The
    multipart upload's id, the parts sent and the tail are the upload's rows
    (`DatabaseResumableStore.advance`), stored once the bucket has the bytes: the offset
    is theirs, never a file's size. The one writer is the holder of the row's lease.

    The last PATCH sends the last part and completes the upload (an upload smaller than a
    part is its tail), the bytes become the thread's blob (`WorkingCopies.adopt`, a copy
    inside the bucket) and go through the commit as a local working copy: the staging file
    of the instance that saw every byte, else the finished object read back while hashed.
    """

    def __init__(
        self,
        intake: UploadIntake,
        store: DatabaseResumableStore,
        copies: WorkingCopies,
        parts: S3PartUploads,
        *,
        lease_seconds: float = LEASE_SECONDS,
        **options: Any,
    ) -> None:
        super().__init__(intake, store, **options)
        self.s3_store = store
        self.copies = copies
        self.parts = parts
        self.part_size = parts.store.part_size
        self.lease_seconds = lease_seconds

    # -- the protocol ----------------------------------------------------------------

    def status(self, thread: Thread, upload_id: str) -> ResumableUpload:
        """Where the upload stands, as stored (HEAD); an upload whose every byte arrived
        but whose commit failed is committed now (see the base class)."""
        upload = self._find(thread, upload_id)
        if upload.committed_name is not None or upload.offset < upload.length:
            return upload
        owner = self._lease(upload)
        if owner is None:
            return upload  # another request is finishing it
        try:
            upload = self._find(thread, upload_id)
            if upload.committed_name is None:
                self._finish(upload, owner)
            return upload
        finally:
            self.s3_store.release_lease(upload_id, owner)

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
        """Send one chunk (PATCH) to the bucket at `offset`; complete and commit the file
        when it is the last. Errors as the base class's."""
        upload = self._find(thread, upload_id)
        if upload.committed_name is None:
            owner = self._lease(upload)
            if owner is None:
                raise UploadBusy()
        else:
            owner = None
        try:
            if owner is not None:
                upload = self._find(thread, upload_id)  # as it stands under the lease
            if upload.committed_name is not None:  # a retry of the last PATCH
                if offset != upload.length:
                    raise OffsetMismatch(upload.length, offset)
                if content_length:
                    raise PastUploadLength(upload.length)
                return AppendOutcome(upload)
            assert owner is not None
            if offset != upload.offset:
                raise OffsetMismatch(upload.offset, offset)
            if content_length is not None and offset + content_length > upload.length:
                raise PastUploadLength(upload.length)
            end = self._receive_parts(upload, owner, body, checksum)
            upload = replace(upload, offset=end)
            if end < upload.length:
                return AppendOutcome(upload)
            return AppendOutcome(upload, self._finish(upload, owner))
        finally:
            if owner is not None:
                self.s3_store.release_lease(upload_id, owner)

    def terminate(self, thread: Thread, upload_id: str) -> None:
        """Drop the upload (DELETE): its multipart upload aborted, its tail deleted.

        Raises:
            ResumableNotFound, ResumableExpired, UploadBusy.
        """
        upload = self._find(thread, upload_id)
        if upload.committed_name is not None:
            self.store.remove(upload_id)  # its file is an upload now: it stays
            return
        owner = self._lease(upload)
        if owner is None:
            raise UploadBusy()
        try:
            self._end(upload)
        finally:
            self.s3_store.release_lease(upload_id, owner)

    def sweep_expired(self) -> int:
        """Remove every expired upload no request is writing to, bucket state and all."""
        removed = 0
        for upload in self.store.expired(self._clock()):
            if upload.committed_name is not None:
                self.store.remove(upload.upload_id)
                removed += 1
                continue
            owner = self._lease(upload)
            if owner is None:
                continue  # a request is writing right now; the next sweep takes it
            try:
                self._end(upload)
            except ObjectStoreUnavailable:
                logger.warning("the bucket is unavailable: %s expires later", upload.upload_id)
                continue
            finally:
                self.s3_store.release_lease(upload.upload_id, owner)
            removed += 1
        if removed:
            logger.info("removed %d expired resumable upload(s)", removed)
        return removed

    def is_live_staging(self, path: Path) -> bool:
        """Whether a staging file is an upload's still on record; instances' data dirs
        differ, so the upload is found by the id in the name, not by the stored path."""
        upload_id = path.name.removeprefix(STAGING_PREFIX).removesuffix(STAGING_SUFFIX)
        return _UPLOAD_ID.fullmatch(upload_id) is not None and self.store.get(upload_id) is not None

    # -- the lease -------------------------------------------------------------------

    def _lease(self, upload: ResumableUpload) -> str | None:
        """Take the upload for this request; None while another holds it."""
        owner = secrets.token_hex(16)
        now = self._clock()
        taken = self.s3_store.take_lease(upload.upload_id, owner, now, now + self.lease_seconds)
        return owner if taken else None

    def _keep_lease(self, upload: ResumableUpload, owner: str) -> None:
        if not self.s3_store.renew_lease(
            upload.upload_id, owner, self._clock() + self.lease_seconds
        ):
            raise UploadBusy()  # it ran out and another request took it: send nothing more

    # -- the bytes -------------------------------------------------------------------

    def _scope(self, upload: ResumableUpload) -> str:
        return self.uploads.folders(upload.ref).scope

    def _incoming(self, upload: ResumableUpload) -> str:
        return incoming_key(self._scope(upload), upload.upload_id)

    def _tail_key(self, upload: ResumableUpload, end: int) -> str:
        return incoming_key(self._scope(upload), f"{upload.upload_id}.{end}")

    def _local_path(self, upload: ResumableUpload) -> Path:
        """This instance's staging file of the upload (the stored path is the creator's)."""
        return self.uploads.folders(upload.ref).uploads_dir() / staging_name(upload.upload_id)

    def _open_local(self, upload: ResumableUpload, start: int) -> ResumableStaging | None:
        """This instance's staging file, holding exactly the first `start` bytes; None
        when it cannot (this instance did not see them all)."""
        path = self._local_path(upload)
        try:
            if start == 0:
                path.unlink(missing_ok=True)
                folders = self.uploads.folders(upload.ref)
                folders.make_dirs(path.parent)
                return ResumableStaging.create(path)
            staging = ResumableStaging.acquire(path)
        except OSError:
            return None
        if staging is None:
            return None
        if staging.size() < start:
            staging.close()
            return None
        staging.truncate(start)
        return staging

    def _read_object(self, key: str) -> bytearray:
        data = bytearray()
        with self.copies.store.open_read(key) as stream:
            for chunk in stream:
                data += chunk
        return data

    def _receive_parts(
        self,
        upload: ResumableUpload,
        owner: str,
        body: ChunkSource,
        checksum: Checksum | None,
    ) -> int:
        """Stream the body, behind the tail, to the bucket in parts; store where it ends.

        A chunk with a checksum is kept only whole and matching; one cut off without is
        kept as far as it came. Anything else (the bucket out of reach, the lease lost)
        leaves the upload as it was: the parts sent meanwhile carry numbers the next try
        sends again, which replaces them.
        """
        start = upload.offset
        progress = self.s3_store.s3_progress(upload.upload_id)
        incoming = self._incoming(upload)
        digest = CHECKSUM_ALGORITHMS[checksum.algorithm]() if checksum else None
        running = self._digests.take(upload.upload_id, start)
        local = self._open_local(upload, start) if running is not None else None
        if local is None:
            running = None
        pending = bytearray()
        if progress.tail_key is not None:
            pending = self._read_object(progress.tail_key)
        if progress.parts_size + len(pending) != start:
            if local is not None:
                local.close()
            raise StorageFailure(f"The stored parts of {upload.filename} do not add up")
        s3_upload_id = progress.s3_upload_id
        sent: list[SentPart] = []
        number = len(progress.parts) + 1
        buffer = bytearray(READ_SIZE)
        view = memoryview(buffer)
        position = kept = start
        renewed = self._clock()
        try:
            try:
                while True:
                    count, cut_off = _fill(body, view)
                    if position + count > upload.length:
                        raise PastUploadLength(upload.length)
                    piece = view[:count]
                    if local is not None:
                        local.write_at(piece, position)
                    pending += piece
                    position += count
                    if digest is not None:
                        digest.update(piece)
                    if running is not None:
                        running.digest.update(piece)
                    if self._clock() - renewed > _RENEW_AFTER:
                        self._keep_lease(upload, owner)
                        renewed = self._clock()
                    while len(pending) >= self.part_size:
                        if s3_upload_id is None:
                            s3_upload_id = self.parts.start(incoming)
                            if not self.s3_store.set_s3_upload_id(
                                upload.upload_id, owner, s3_upload_id
                            ):
                                self.parts.abort(incoming, s3_upload_id)
                                raise UploadBusy()
                        self._keep_lease(upload, owner)
                        renewed = self._clock()
                        part = self.parts.send(
                            incoming, s3_upload_id, number, pending[: self.part_size]
                        )
                        sent.append(SentPart(*part))
                        number += 1
                        del pending[: self.part_size]
                    if cut_off is not None:
                        raise cut_off
                    if count < len(view):
                        break
                if checksum is not None and digest is not None:
                    if digest.digest() != checksum.digest:
                        raise ChecksumMismatch(checksum.algorithm)
            except MalformedUpload:
                if digest is not None or position == start:
                    raise
                self._store_progress(upload, owner, progress, position, sent, pending, s3_upload_id)
                kept = position
                raise
            if position > start:
                self._store_progress(upload, owner, progress, position, sent, pending, s3_upload_id)
        except BaseException as error:
            if local is not None:
                local.truncate(kept)  # also drops a partly written piece
                local.close()
                local = None
            if isinstance(error, OSError):
                raise StorageFailure(f"Failed to upload {upload.filename}: {error}") from error
            raise
        finally:
            if local is not None:
                local.close()
        if running is not None:
            running.offset = position
            self._digests.put(upload.upload_id, running)
        return position

    def _store_progress(
        self,
        upload: ResumableUpload,
        owner: str,
        progress: S3Progress,
        position: int,
        sent: list[SentPart],
        pending: bytearray,
        s3_upload_id: str | None,
    ) -> None:
        """The new tail into the bucket, then the parts, tail and offset into the row;
        the old tail goes once nothing names it."""
        tail_key = self._tail_key(upload, position) if pending else None
        if tail_key is not None:
            self.parts.put(tail_key, pending)
        stored = self.s3_store.advance(
            upload.upload_id,
            owner,
            offset=position,
            parts=sent,
            tail_key=tail_key,
            expires_at=self._clock() + self.expiry_seconds,
            s3_upload_id=s3_upload_id,
        )
        if not stored:
            if tail_key is not None:
                self._delete_quietly(tail_key)
            raise UploadBusy()
        if progress.tail_key is not None and progress.tail_key != tail_key:
            self._delete_quietly(progress.tail_key)

    def _delete_quietly(self, key: str) -> None:
        try:
            self.copies.store.delete(key)
        except (ObjectStoreUnavailable, StorageFailure):
            logger.warning("could not delete %s; the upload's end removes it", key)

    # -- the end ---------------------------------------------------------------------

    def _assemble(self, upload: ResumableUpload, owner: str, progress: S3Progress) -> str:
        """Make one object of the upload's parts and tail; its key, stored as the tail."""
        if progress.s3_upload_id is None:
            if progress.tail_key is None:
                raise StorageFailure(f"The stored bytes of {upload.filename} are missing")
            return progress.tail_key  # smaller than one part: the tail is the whole
        incoming = self._incoming(upload)
        parts = [UploadedPart(p.number, p.etag, p.checksum_sha256, p.size) for p in progress.parts]
        if progress.tail_key is not None:
            tail = self._read_object(progress.tail_key)
            parts.append(self.parts.send(incoming, progress.s3_upload_id, len(parts) + 1, tail))
        try:
            self.parts.complete(incoming, progress.s3_upload_id, parts)
        except StorageFailure:
            # A request that completed it and died before storing so left the object.
            if not self._holds(incoming, upload.length):
                raise
        if not self.s3_store.advance(
            upload.upload_id,
            owner,
            offset=upload.length,
            parts=[],
            tail_key=incoming,
            clear_parts=True,
        ):
            raise UploadBusy()
        if progress.tail_key is not None:
            self._delete_quietly(progress.tail_key)
        return incoming

    def _holds(self, key: str, size: int) -> bool:
        try:
            return self.copies.store.head(key).size == size
        except ObjectNotFound:
            return False

    def _finish(self, upload: ResumableUpload, owner: str) -> AcceptedUploads:
        """Every byte is in the bucket: one object, the thread's blob, then the commit.

        A refusal at the commit ends the upload (its bytes in the bucket too); a failure
        keeps it, the blob named in its row: the next PATCH or HEAD, on any instance,
        commits it from there.
        """
        progress = self.s3_store.s3_progress(upload.upload_id)
        scope = self._scope(upload)
        running = self._digests.take(upload.upload_id, upload.length)
        local = self._open_local(upload, upload.length) if running is not None else None
        try:
            if progress.sha256 is None:
                key = self._assemble(upload, owner, progress)
                if local is not None and running is not None:
                    sha256, content_type = running.digest.result(upload.filename)
                else:
                    local, sha256, content_type = self._read_back(upload, key)
                self.copies.adopt(scope, key, sha256)
                if not self.s3_store.advance(
                    upload.upload_id,
                    owner,
                    offset=upload.length,
                    parts=[],
                    tail_key=None,
                    clear_parts=True,
                    sha256=sha256,
                ):
                    raise UploadBusy()
                self._delete_incoming(upload)
            else:
                sha256 = progress.sha256
                if local is not None and running is not None:
                    content_type = running.digest.result(upload.filename)[1]
                else:
                    local, read, content_type = self._read_back(upload, blob_key(scope, sha256))
                    if read != sha256:
                        raise StorageFailure(f"The stored bytes of {upload.filename} changed")
            try:
                return self._commit_file(upload, local, sha256, content_type)
            except _REFUSED_AT_COMMIT:
                local.discard()
                self._end(upload)
                raise
        finally:
            if local is not None:
                local.close()

    def _read_back(self, upload: ResumableUpload, key: str) -> tuple[ResumableStaging, str, str]:
        """The object at `key` into this instance's staging file while hashing it: the
        working copy the commit needs, from an instance that did not see every byte."""
        local = self._open_local(upload, 0)
        if local is None:
            raise StorageFailure(f"{upload.filename} cannot be staged here")
        digest = ContentDigest()
        position = 0
        try:
            with self.copies.store.open_read(key) as stream:
                for chunk in stream:
                    local.write_at(memoryview(chunk), position)
                    digest.update(chunk)
                    position += len(chunk)
            if position != upload.length:
                raise StorageFailure(f"The stored bytes of {upload.filename} are incomplete")
        except ObjectNotFound as error:
            local.discard()
            raise StorageFailure(f"The stored bytes of {upload.filename} are missing") from error
        except OSError as error:
            local.discard()
            if is_disk_full(error):
                raise InsufficientStorage(upload.filename) from error
            raise StorageFailure(f"Failed to stage {upload.filename}: {error}") from error
        except BaseException:
            local.discard()
            raise
        sha256, content_type = digest.result(upload.filename)
        return local, sha256, content_type

    def _end(self, upload: ResumableUpload) -> None:
        """The upload gone for good: its multipart upload aborted, its incoming objects
        deleted, then its rows (a bucket out of reach leaves them for the next sweep)."""
        progress = self.s3_store.s3_progress(upload.upload_id)
        if progress.s3_upload_id is not None:
            self.parts.abort(self._incoming(upload), progress.s3_upload_id)
        self._delete_incoming(upload)
        self.store.remove(upload.upload_id)
        self._local_path(upload).unlink(missing_ok=True)

    def _delete_incoming(self, upload: ResumableUpload) -> None:
        """Every object under the upload's incoming key: the whole, the tails (also those
        a killed request left)."""
        store = self.copies.store
        for info in list(store.list_keys(self._incoming(upload))):
            store.delete(info.key)


def _fill(body: ChunkSource, view: memoryview) -> tuple[int, MalformedUpload | None]:
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
) -> ResumableUploadService:
    """Build the service over the upload service's data dir and database."""
    store = DatabaseResumableStore(intake.uploads.records.engine)
    caps = PendingCaps(max_pending, max_pending_bytes)
    copies = intake.uploads.paths.copies
    if copies is not None and isinstance(copies.store, S3ObjectStore):
        return S3ResumableUploadService(
            intake,
            store,
            copies,
            copies.store.part_uploads(),
            expiry_seconds=expiry_hours * 3600,
            caps=caps,
        )
    return ResumableUploadService(intake, store, expiry_seconds=expiry_hours * 3600, caps=caps)
