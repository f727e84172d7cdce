"""Resumable uploads (tus 1.0.0, SPEC 8) on the S3 backend, where instances share no disk.

The protocol's rules are `resumable.ResumableUploadService`'s; what differs is where the
bytes and the offset live. On the local backend they are a staging file of one data dir,
and its `flock` is the one writer; here no instance's disk is shared, so each PATCH's
bytes go to the bucket as parts of one multipart upload, the offset and the parts are
database rows, and the one writer is the holder of a lease on the upload's row. Any
instance may take the next request, and any may finish the upload.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

from deerflow_web.errors import ChecksumMismatch
from deerflow_web.errors import InfectedFile
from deerflow_web.errors import InsufficientStorage
from deerflow_web.errors import MalformedUpload
from deerflow_web.errors import NameConflict
from deerflow_web.errors import ObjectNotFound
from deerflow_web.errors import ObjectStoreUnavailable
from deerflow_web.errors import OffsetMismatch
from deerflow_web.errors import PastUploadLength
from deerflow_web.errors import QuotaExceeded
from deerflow_web.errors import StorageFailure
from deerflow_web.errors import TooLargeToScan
from deerflow_web.errors import UnsafeFilename
from deerflow_web.errors import UploadBusy
from deerflow_web.models import ResumableUpload
from deerflow_web.services.uploads.intake import AcceptedUploads
from deerflow_web.services.uploads.intake import UploadIntake
from deerflow_web.services.uploads.resumable import CHECKSUM_ALGORITHMS
from deerflow_web.services.uploads.resumable import READ_SIZE
from deerflow_web.services.uploads.resumable import UPLOAD_ID
from deerflow_web.services.uploads.resumable import AppendOutcome
from deerflow_web.services.uploads.resumable import Checksum
from deerflow_web.services.uploads.resumable import ChunkSource
from deerflow_web.services.uploads.resumable import ResumableUploadService
from deerflow_web.services.uploads.resumable import fill_from
from deerflow_web.storage.digest import ContentDigest
from deerflow_web.storage.local import is_disk_full
from deerflow_web.storage.objects.keys import blob_key
from deerflow_web.storage.objects.keys import incoming_key
from deerflow_web.storage.objects.s3 import S3PartUploads
from deerflow_web.storage.objects.s3 import UploadedPart
from deerflow_web.storage.objects.working_copy import WorkingCopies
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.resumable import STAGING_PREFIX
from deerflow_web.storage.resumable import STAGING_SUFFIX
from deerflow_web.storage.resumable import DatabaseResumableStore
from deerflow_web.storage.resumable import ResumableStaging
from deerflow_web.storage.resumable import S3Progress
from deerflow_web.storage.resumable import SentPart
from deerflow_web.storage.resumable import staging_name

logger = logging.getLogger(__name__)

# How long a killed writer blocks its upload at most (`uploads.resumable_lease_seconds`).
DEFAULT_LEASE_SECONDS = 120.0
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
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        **options: Any,
    ) -> None:
        super().__init__(intake, store, **options)
        self.s3_store = store
        self.copies = copies
        self.parts = parts
        self.part_size = parts.store.part_size
        self.lease_seconds = lease_seconds
        self._renew_after = lease_seconds / 4  # a few tries before it runs out

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
            if upload.committed_name is not None:
                return self._retried_last_patch(upload, offset, content_length)
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
        return UPLOAD_ID.fullmatch(upload_id) is not None and self.store.get(upload_id) is not None

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
                    count, cut_off = fill_from(body, view)
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
                    if self._clock() - renewed > self._renew_after:
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
