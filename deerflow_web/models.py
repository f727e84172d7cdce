"""Plain values shared by storage, services, the web layer and the agent side.

Standard library only: importing this module must never pull in Flask or LangChain.
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from typing import TypeVar

from deerflow_web.errors import InvalidOption
from deerflow_web.errors import InvalidThreadId
from deerflow_web.errors import InvalidUserId

logger = logging.getLogger(__name__)

VIRTUAL_PATH_PREFIX = "/mnt/user-data"
VIRTUAL_UPLOADS_DIR = f"{VIRTUAL_PATH_PREFIX}/uploads"

THREAD_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
USER_ID_RE = re.compile(r"[A-Za-z0-9_-]+")

# The owner of every thread when accounts are off: the flat layout `threads/{id}` (SPEC D1),
# and the key the `threads` table gives single-user rows. Not a user id (those are never
# empty), so no user of the per-user layout can be taken for it, nor it for one.
SINGLE_USER = ""


def validate_thread_id(thread_id: object) -> str:
    """Return the id unchanged, or raise InvalidThreadId (SPEC 1.4)."""
    if not isinstance(thread_id, str) or THREAD_ID_RE.fullmatch(thread_id) is None:
        raise InvalidThreadId(thread_id)
    return thread_id


def validate_user_id(user_id: object) -> str:
    """Return the id unchanged, or raise InvalidUserId (SPEC 1.5)."""
    if not isinstance(user_id, str) or USER_ID_RE.fullmatch(user_id) is None:
        raise InvalidUserId(user_id)
    return user_id


@dataclass(frozen=True)
class ThreadRef:
    """One thread of one owner, validated once when made: what every service acts on.

    The owner is a user id, or `SINGLE_USER` with accounts off; there is no "no user"
    that silently means the flat layout, so forgetting the owner fails where the
    handle is made instead of reaching another folder.

    Raises:
        InvalidThreadId, InvalidUserId: At construction.
    """

    thread_id: str
    user_id: str

    def __post_init__(self) -> None:
        validate_thread_id(self.thread_id)
        if self.user_id != SINGLE_USER:
            validate_user_id(self.user_id)

    @classmethod
    def single_user(cls, thread_id: str) -> ThreadRef:
        """A thread of the single-user mode (accounts off): the flat layout."""
        return cls(thread_id, SINGLE_USER)

    @property
    def is_single_user(self) -> bool:
        """Whether the thread lives in the flat layout of the single-user mode."""
        return self.user_id == SINGLE_USER

    @property
    def owner(self) -> str | None:
        """The user id, None in the single-user mode (for messages and the DeerFlow API)."""
        return None if self.is_single_user else self.user_id


DOCUMENT_EXTENSIONS = frozenset({".pdf", ".ppt", ".pptx", ".xls", ".xlsx", ".doc", ".docx"})
# Images whose text is read by OCR (conversion/ocr.py): they convert like documents.
OCR_IMAGE_EXTENSIONS = frozenset(
    {".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".bmp", ".gif"}
)
CONVERTIBLE_EXTENSIONS = DOCUMENT_EXTENSIONS | OCR_IMAGE_EXTENSIONS


# Archives whose members agents read by path (`uploads/a.zip/q3/x.docx`) and that can be
# extracted; the longest suffix first, so `.tar.gz` is not taken for `.gz`.
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".zip", ".tar")


def archive_suffix(name: str) -> str | None:
    """The archive suffix a name ends with (case-insensitive), or None."""
    lowered = name.lower()
    return next((suffix for suffix in ARCHIVE_SUFFIXES if lowered.endswith(suffix)), None)


def is_archive_name(name: str) -> bool:
    """Whether the name claims an archive format this app reads."""
    suffix = archive_suffix(name)
    return suffix is not None and len(name) > len(suffix)


class Area(enum.StrEnum):
    """The three folders of a thread's user-data, as agents see them under /mnt/user-data."""

    UPLOADS = "uploads"
    WORKSPACE = "workspace"
    OUTPUTS = "outputs"


class OnConflict(enum.StrEnum):
    """What an upload does when its name already exists on disk (SPEC D13)."""

    REPLACE = "replace"
    RENAME = "rename"
    REJECT = "reject"

    @classmethod
    def named(cls, value: str | None, default: OnConflict) -> OnConflict:
        """The choice a request field names, `default` when it names none."""
        try:
            return cls(value or default)
        except ValueError:
            choices = ", ".join(option.value for option in cls)
            raise InvalidOption(f"on_conflict must be one of: {choices}") from None


class RecordSource(enum.StrEnum):
    """How a file came to be in the uploads folder; decides what a delete may cascade to."""

    UPLOAD = "upload"
    CONVERSION = "conversion"
    DISK = "disk"  # found on disk, put there behind the app's back


class ConversionState(enum.StrEnum):
    """Life cycle of one conversion job, stored in the upload record."""

    QUEUED = "queued"
    CONVERTING = "converting"
    DONE = "done"
    FAILED = "failed"


class ScanState(enum.StrEnum):
    """What the virus scanner said about a stored file (`services/scanning`).

    A record without a state (None) holds bytes no scan has judged: stored while scanning
    was off, found on disk, or changed there behind the app's back. It is usable while
    scanning is off, and waits for its scan while it is on (held back from the agent, and
    shown as "Scan pending"), until a rescan gives it a state. That is what `PENDING` would
    say; no path writes it, because whether such a file waits depends on the scanning
    setting when it is read, not when it was stored.
    """

    CLEAN = "clean"
    INFECTED = "infected"  # never stored by an upload; a rescan quarantines such a file
    UNSCANNED = "unscanned"  # stored while the scanner was out (`on_unavailable`)
    PENDING = "pending"  # reserved (in the API's enum): not written, see above


@dataclass(frozen=True)
class ScanVerdict:
    """One scan's outcome: the state to record, the signature version it was made with,
    and what was found (INFECTED) or why the file went unscanned (UNSCANNED)."""

    state: ScanState
    signatures: str | None = None
    found: str | None = None
    reason: str | None = None


# A job in these states is still running (or waiting to); pages poll until none is left.
ACTIVE_CONVERSION_STATES: frozenset[ConversionState] = frozenset(
    {ConversionState.QUEUED, ConversionState.CONVERTING}
)


def _never() -> bool:
    return False


@dataclass(frozen=True)
class IncomingFile:
    """One file of a request: the client's name and a readable binary stream.

    A piece read from `stream` may change at the next read. While `piece_outlives_next_read()`
    is true, the piece read last stays unchanged until the read after the next one, so work
    on it (hashing) may overlap the next read.
    """

    filename: str
    stream: BinaryIO
    piece_outlives_next_read: Callable[[], bool] = _never


def suffix_of(name: str) -> str:
    """`PurePosixPath(name).suffix` for a bare name, without building a path object.

    Listings call this for every file; pathlib's parsing was a tenth of a listing's time.
    """
    dot = name.rfind(".")
    return name[dot:] if 0 < dot < len(name) - 1 else ""


Number = TypeVar("Number", int, float)


def positive_setting(
    section: Mapping[str, object],
    key: str,
    default: Number,
    *,
    alias: str | None = None,
    section_name: str = "uploads",
) -> Number:
    """`section[key]` (else `section[alias]`) as a positive number of `default`'s type.

    `"15"` is accepted; anything not positive, or not a number, falls back to the default
    with a warning instead of stopping the server (SPEC 1.8). So does a fraction where a
    whole number is wanted (`2.5` items): cut to 2 without a word, it would be a setting
    the operator never wrote.
    """
    raw = section.get(key)
    if raw is None and alias is not None:
        raw = section.get(alias)
    if raw is None:
        return default
    whole = isinstance(default, int)
    try:
        value = type(default)(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = type(default)(0)
    if whole and isinstance(raw, float) and not raw.is_integer():
        value = 0
    if isinstance(raw, bool) or value <= 0:
        kind = "positive whole number" if whole else "positive number"
        logger.warning("%s.%s=%r is not a %s; using %s", section_name, key, raw, kind, default)
        return default
    return value


@dataclass(frozen=True)
class UploadLimits:
    """The `uploads.*` limits of SPEC 1.8; a size equal to a limit is accepted."""

    max_files: int = 10
    max_file_size: int = 50 * 1024 * 1024
    max_total_size: int = 100 * 1024 * 1024

    @classmethod
    def from_mapping(cls, uploads: Mapping[str, object]) -> UploadLimits:
        """Read `uploads.*` from config; bad values fall back to defaults with a warning."""
        return cls(
            max_files=positive_setting(uploads, "max_files", cls.max_files, alias="max_file_count"),
            max_file_size=positive_setting(
                uploads, "max_file_size", cls.max_file_size, alias="max_single_file_size"
            ),
            max_total_size=positive_setting(uploads, "max_total_size", cls.max_total_size),
        )

    def as_dict(self) -> dict[str, int]:
        """Return the body of GET /uploads/limits."""
        return {
            "max_files": self.max_files,
            "max_file_size": self.max_file_size,
            "max_total_size": self.max_total_size,
        }


@dataclass(frozen=True)
class ImageLimits:
    """How pictures are prepared for a vision model (`agent.image_*` settings).

    Attributes:
        max_edge: The longest edge, in pixels, of a picture as sent; larger ones shrink
            (1568 is what most vision models take without scaling again).
        max_images: Pictures of one message sent as image blocks; the rest are only named.
        max_pixels: Pictures with more pixels than this are refused before decoding
            (8000 x 5000; decoded as RGBA that is 160 MB).
    """

    max_edge: int = 1568
    max_images: int = 5
    max_pixels: int = 40_000_000

    @classmethod
    def from_mapping(cls, agent: Mapping[str, object]) -> ImageLimits:
        """Read the `agent.*` image keys; bad values fall back with a warning."""
        return cls(
            max_edge=positive_setting(agent, "image_max_edge", cls.max_edge, section_name="agent"),
            max_images=positive_setting(
                agent, "max_images_per_message", cls.max_images, section_name="agent"
            ),
            max_pixels=positive_setting(
                agent, "image_max_pixels", cls.max_pixels, section_name="agent"
            ),
        )


@dataclass(frozen=True)
class UploadRecord:
    """One row of a thread's `uploads` record set (SPEC D10): the metadata of one stored file.

    The directory holds the bytes; this record is the single source of truth for what the
    app knows about them. `converted_from` marks a conversion companion; the original's
    companion is found through that link, so the relation is stored once. A companion's
    `source_sha256` is the original's content it was made from: when the original's bytes
    change (even behind the app's back), the companion no longer describes them.
    """

    filename: str
    size: int
    sha256: str
    content_type: str
    uploaded_at: float
    modified: float
    source: RecordSource = RecordSource.UPLOAD
    original_filename: str | None = None
    converted_from: str | None = None
    conversion_state: ConversionState | None = None
    conversion_error: str | None = None
    source_sha256: str | None = None
    scan_state: ScanState | None = None
    scan_signatures: str | None = None  # the scanner's signature database version

    @property
    def extension(self) -> str:
        """The suffix as stored, case kept; "" for `.env` or `README` (pathlib's rule)."""
        return suffix_of(self.filename)

    @property
    def virtual_path(self) -> str:
        """The path agents use to read the file."""
        return f"{VIRTUAL_UPLOADS_DIR}/{self.filename}"

    @property
    def convertible(self) -> bool:
        """Whether conversion can turn this file into a Markdown companion (markitdown for
        documents, OCR for images)."""
        return self.extension.lower() in CONVERTIBLE_EXTENSIONS

    @property
    def archive(self) -> bool:
        """Whether this is an archive whose members can be read and extracted."""
        return is_archive_name(self.filename)


@dataclass(frozen=True)
class ResumableUpload:
    """One unfinished resumable (tus) upload: where it goes and how far it has got.

    `offset` is the count of bytes confirmed on disk; `pending_from` is set while a
    checksummed chunk is being written after it, so a request killed before the checksum
    was compared leaves bytes that are cut off again instead of trusted.
    """

    upload_id: str
    thread_id: str
    user_id: str | None
    filename: str
    on_conflict: str
    metadata: str  # the client's Upload-Metadata header, returned as it came
    length: int
    offset: int
    created_at: float
    expires_at: float
    staging_path: Path
    pending_from: int | None = None
    committed_name: str | None = None  # stored under this name: the upload is complete

    @property
    def ref(self) -> ThreadRef:
        """The thread it goes to (a stored row keeps no user id in the single-user mode)."""
        return ThreadRef(self.thread_id, self.user_id or SINGLE_USER)
