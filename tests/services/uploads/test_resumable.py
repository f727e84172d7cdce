"""Resumable uploads at the service (services/uploads/resumable.py), without HTTP.

The tus routes are tested through the app in tests/web/api/test_tus.py; these call the
service the routes call, on a real data dir and database, with a clock the test moves.
"""

from __future__ import annotations

import base64
import hashlib
import io
from pathlib import Path

import pytest

from deerflow_web.errors import ChecksumMismatch
from deerflow_web.errors import FileTooLarge
from deerflow_web.errors import InvalidTusRequest
from deerflow_web.errors import MalformedUpload
from deerflow_web.errors import NameConflict
from deerflow_web.errors import OffsetMismatch
from deerflow_web.errors import PastUploadLength
from deerflow_web.errors import ResumableExpired
from deerflow_web.errors import ResumableNotFound
from deerflow_web.errors import UnsafeFilename
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.intake import UploadIntake
from deerflow_web.services.uploads.resumable import Checksum
from deerflow_web.services.uploads.resumable import ResumableUploadService
from deerflow_web.services.uploads.resumable import parse_metadata
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from deerflow_web.storage.paths import is_staging_name
from deerflow_web.storage.resumable import DatabaseResumableStore
from tests.helpers import uploads_dir

REF = ThreadRef.single_user("T")  # the flat layout: no accounts at the service level


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def meta(**values: str) -> str:
    return ",".join(f"{key} {b64(value)}" for key, value in values.items())


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class CutOff:
    """A body that sends `data` and then breaks, as a dropped connection does."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readinto(self, buffer: memoryview) -> int:
        count = self._data.readinto(buffer)
        if not count:
            raise MalformedUpload("The upload was cut off before the request body ended")
        return count


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(base_dir: Path, clock: Clock) -> ResumableUploadService:
    uploads = make_upload_service(base_dir)
    intake = UploadIntake(uploads, ConversionJobs(uploads, ConversionSettings()))
    store = DatabaseResumableStore(uploads.records.engine)
    return ResumableUploadService(intake, store, expiry_seconds=3600, clock=clock)


def start(service: ResumableUploadService, length: int, filename: str) -> str:
    """A new upload's id."""
    return service.create(REF, length, meta(filename=filename)).upload.upload_id


def send(service: ResumableUploadService, upload_id: str, offset: int, data: bytes, **kw):
    return service.append(
        REF, upload_id, offset=offset, body=io.BytesIO(data), content_length=len(data), **kw
    )


def folder(base_dir: Path) -> Path:
    return uploads_dir(base_dir, "T", None)


# ---- headers --------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ("sha1", "sha256"))
def test_a_checksum_header_is_parsed(algorithm: str) -> None:
    digest = hashlib.new(algorithm, b"abc").digest()
    assert Checksum.parse(f" {algorithm} {b64(digest)} ") == Checksum(algorithm, digest)


@pytest.mark.parametrize(
    "header",
    (
        "md5 " + b64(hashlib.md5(b"abc").digest()),  # not offered
        "SHA1 " + b64(hashlib.sha1(b"abc").digest()),  # names are lower case
        "sha1 not-base64!",
        "sha1 " + b64(b"short"),
        "sha256 " + b64(hashlib.sha1(b"abc").digest()),  # a sha1 under sha256's name
        "sha1",
        "",
    ),
)
def test_a_bad_checksum_header_is_refused(header: str) -> None:
    with pytest.raises(InvalidTusRequest):
        Checksum.parse(header)


def test_metadata_is_decoded() -> None:
    header = f"filename {b64('报告.pdf')}, on_conflict {b64('rename')},,empty"
    assert parse_metadata(header) == {"filename": "报告.pdf", "on_conflict": "rename", "empty": ""}
    assert parse_metadata("") == {}


@pytest.mark.parametrize(
    "header",
    (
        f"filename {b64('a')},filename {b64('b')}",  # repeated
        f"bad(key) {b64('a')}",
        "filename not-base64!",
        f"filename {b64(bytes([0xFF, 0xFE]))}",  # not UTF-8
    ),
)
def test_bad_metadata_is_refused(header: str) -> None:
    with pytest.raises(InvalidTusRequest):
        parse_metadata(header)


# ---- creating -----------------------------------------------------------------------------


def test_an_upload_in_two_chunks_ends_as_an_ordinary_upload(
    service: ResumableUploadService, base_dir: Path
) -> None:
    data = b"0123456789" * 1000
    created = service.create(REF, len(data), meta(filename="notes.txt"))
    upload_id = created.upload.upload_id
    assert created.accepted is None and service.status(REF, upload_id).offset == 0
    half = send(service, upload_id, 0, data[:4000])
    assert half.upload.offset == 4000 and half.accepted is None
    assert service.status(REF, upload_id).offset == 4000
    done = send(service, upload_id, 4000, data[4000:])
    saved = done.accepted.result.files[0].record
    assert saved.filename == "notes.txt" and saved.sha256 == hashlib.sha256(data).hexdigest()
    assert (folder(base_dir) / "notes.txt").read_bytes() == data
    assert not [
        name for name in (p.name for p in folder(base_dir).iterdir()) if is_staging_name(name)
    ]
    assert [r.filename for r in service.uploads.list_uploads(REF)] == ["notes.txt"]


def test_an_empty_file_is_committed_at_creation(
    service: ResumableUploadService, base_dir: Path
) -> None:
    created = service.create(REF, 0, meta(filename="empty.txt"))
    assert created.accepted.result.files[0].record.size == 0
    assert (folder(base_dir) / "empty.txt").read_bytes() == b""


@pytest.mark.parametrize(
    ("metadata", "error"),
    (
        (meta(on_conflict="rename"), InvalidTusRequest),  # no filename
        (meta(filename=""), InvalidTusRequest),
        (meta(filename=".."), UnsafeFilename),
        (meta(filename="a\x00b"), UnsafeFilename),
        (meta(filename=".upload-abc.part"), UnsafeFilename),  # a staging file's name
        ("filename", InvalidTusRequest),  # an empty name
    ),
)
def test_bad_creations_leave_nothing(
    service: ResumableUploadService, base_dir: Path, metadata: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        service.create(REF, 10, metadata)
    assert not folder(base_dir).exists() or list(folder(base_dir).iterdir()) == []


def test_a_file_over_the_limit_is_refused_before_a_byte(service: ResumableUploadService) -> None:
    with pytest.raises(FileTooLarge):
        service.create(REF, service.max_size + 1, meta(filename="big.bin"))


def test_reject_refuses_a_taken_name_at_creation(service: ResumableUploadService) -> None:
    service.uploads.save_uploads(REF, [IncomingFile("taken.txt", io.BytesIO(b"x"))])
    with pytest.raises(NameConflict):
        service.create(REF, 3, meta(filename="taken.txt", on_conflict="reject"))


def test_a_bad_thread_id_is_refused(service: ResumableUploadService) -> None:
    with pytest.raises(ValueError):
        service.create(ThreadRef.single_user("../x"), 3, meta(filename="a.txt"))


# ---- appending ----------------------------------------------------------------------------


def test_a_chunk_at_the_wrong_offset_is_refused(service: ResumableUploadService) -> None:
    upload_id = start(service, 10, "a.bin")
    with pytest.raises(OffsetMismatch):
        send(service, upload_id, 3, b"abc")
    assert service.status(REF, upload_id).offset == 0


def test_a_chunk_past_the_declared_length_is_refused(service: ResumableUploadService) -> None:
    upload_id = start(service, 4, "a.bin")
    with pytest.raises(PastUploadLength):
        send(service, upload_id, 0, b"too long")
    with pytest.raises(PastUploadLength):  # a chunked body that does not say its length
        service.append(REF, upload_id, offset=0, body=io.BytesIO(b"too long"), content_length=None)
    assert service.status(REF, upload_id).offset == 0


def test_a_checksummed_chunk_is_kept_only_when_it_matches(service: ResumableUploadService) -> None:
    upload_id = start(service, 6, "a.bin")
    wrong = Checksum("sha1", hashlib.sha1(b"other").digest())
    with pytest.raises(ChecksumMismatch):
        send(service, upload_id, 0, b"abc", checksum=wrong)
    assert service.status(REF, upload_id).offset == 0
    right = Checksum("sha256", hashlib.sha256(b"abc").digest())
    assert send(service, upload_id, 0, b"abc", checksum=right).upload.offset == 3


def test_a_cut_off_chunk_keeps_what_arrived(service: ResumableUploadService) -> None:
    upload_id = start(service, 10, "a.bin")
    with pytest.raises(MalformedUpload):
        service.append(REF, upload_id, offset=0, body=CutOff(b"abcd"), content_length=10)
    assert service.status(REF, upload_id).offset == 4
    assert send(service, upload_id, 4, b"efghij").accepted is not None


def test_a_retry_of_the_last_chunk_after_the_commit_is_answered(
    service: ResumableUploadService, base_dir: Path
) -> None:
    upload_id = start(service, 3, "a.bin")
    send(service, upload_id, 0, b"abc")
    again = service.append(REF, upload_id, offset=3, body=io.BytesIO(b""), content_length=0)
    assert again.upload.offset == 3
    assert again.accepted is None  # answered, not committed twice
    with pytest.raises(OffsetMismatch):
        send(service, upload_id, 0, b"abc")
    with pytest.raises(PastUploadLength):  # a "retry" that brings bytes
        send(service, upload_id, 3, b"d")
    assert (folder(base_dir) / "a.bin").read_bytes() == b"abc"


def test_uploads_are_per_thread_and_per_user(service: ResumableUploadService) -> None:
    upload_id = start(service, 3, "a.bin")
    with pytest.raises(ResumableNotFound):
        service.status(ThreadRef.single_user("other-thread"), upload_id)
    with pytest.raises(ResumableNotFound):
        service.status(ThreadRef("T", "someone-else"), upload_id)
    with pytest.raises(ResumableNotFound):
        service.status(REF, "0" * 32)


# ---- ending -------------------------------------------------------------------------------


@pytest.mark.parametrize("length", (10, 3))
def test_terminate_drops_the_upload_and_only_unfinished_bytes(
    service: ResumableUploadService, base_dir: Path, length: int
) -> None:
    upload_id = start(service, length, "a.bin")
    send(service, upload_id, 0, b"abc")
    service.terminate(REF, upload_id)
    with pytest.raises(ResumableNotFound):
        service.status(REF, upload_id)
    left = {path.name: path.read_bytes() for path in folder(base_dir).iterdir()}
    assert left == ({} if length > 3 else {"a.bin": b"abc"})  # a committed file stays


def test_expired_uploads_are_swept(
    service: ResumableUploadService, base_dir: Path, clock: Clock
) -> None:
    upload_id = start(service, 10, "a.bin")
    send(service, upload_id, 0, b"abc")
    assert service.sweep_expired() == 0
    clock.now += 3601
    with pytest.raises((ResumableExpired, ResumableNotFound)):
        send(service, upload_id, 3, b"def")
    assert service.sweep_expired() in (0, 1)
    assert list(folder(base_dir).iterdir()) == []
    with pytest.raises(ResumableNotFound):
        service.status(REF, upload_id)


def test_the_start_up_sweep_keeps_only_staging_files_on_record(
    service: ResumableUploadService, base_dir: Path
) -> None:
    upload = service.create(REF, 10, meta(filename="a.bin")).upload
    assert service.is_live_staging(upload.staging_path)
    assert not service.is_live_staging(folder(base_dir) / ".upload-stray.part")
