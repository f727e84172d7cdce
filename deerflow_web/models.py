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


CONVERTIBLE_EXTENSIONS = frozenset({".pdf", ".ppt", ".pptx", ".xls", ".xlsx", ".doc", ".docx"})


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
    with a warning instead of stopping the server (SPEC 1.8).
    """
    raw = section.get(key)
    if raw is None and alias is not None:
        raw = section.get(alias)
    if raw is None:
        return default
    try:
        value = type(default)(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = type(default)(0)
    if isinstance(raw, bool) or value <= 0:
        logger.warning(
            "%s.%s=%r is not a positive number; using %s", section_name, key, raw, default
        )
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
        """Whether markitdown can turn this file into a Markdown companion."""
        return self.extension.lower() in CONVERTIBLE_EXTENSIONS


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
