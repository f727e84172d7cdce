"""Domain errors, written for the person who will read them.

Each class names a failure a user can understand; `web/errors.py` maps the classes to HTTP
status codes and the agent tools turn them into tool messages. No HTTP codes live here.
"""

from __future__ import annotations


class DeerFlowError(Exception):
    """Base class for failures whose message is safe to show to the user."""


class ConfigError(DeerFlowError):
    """The configuration cannot be used; start-up must stop."""


class InvalidInput(DeerFlowError, ValueError):
    """A request input that fails validation; `location` names it as (where, name...)."""

    kind = "value_error"

    def __init__(self, message: str, location: tuple[str, ...], value: object = None) -> None:
        super().__init__(message)
        self.location = location
        self.value = value


class InvalidThreadId(InvalidInput):
    """A thread id outside SPEC 1.4's alphabet or length."""

    def __init__(self, thread_id: object) -> None:
        super().__init__(
            "Invalid thread_id: expected 1-64 ASCII letters, digits, hyphens, or underscores",
            ("path", "thread_id"),
            thread_id,
        )
        self.thread_id = thread_id


class InvalidUserId(DeerFlowError, ValueError):
    """A user id that cannot be used as a directory name."""

    def __init__(self, user_id: object) -> None:
        super().__init__(
            f"Invalid user_id {user_id!r}: only alphanumeric characters, hyphens, "
            "and underscores are allowed."
        )


class UploadError(DeerFlowError):
    """Base class for upload failures the user can understand and fix."""


class NoFilesProvided(UploadError):
    """The request carried a `files` field with no file in it."""

    def __init__(self) -> None:
        super().__init__("No files provided")


class MissingFilesField(InvalidInput):
    """The multipart body has no `files` part at all."""

    kind = "missing"

    def __init__(self) -> None:
        super().__init__("Field required", ("body", "files"))


class InvalidOption(DeerFlowError):
    """A request option with a value outside its documented choices."""


class MalformedUpload(UploadError):
    """The request body is not a complete multipart/form-data body."""


class RequestTimedOut(UploadError):
    """The client sent nothing for longer than `server.idle_timeout_seconds`, or sent its
    body slower than the server's minimum rate (`message` then says which)."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or "The client sent nothing for too long; the request was dropped")


class TooManyFiles(UploadError):
    """More file parts than `uploads.max_files`."""

    def __init__(self, max_files: int) -> None:
        super().__init__(f"Too many files: maximum is {max_files}")


class FileTooLarge(UploadError):
    """One part is larger than `uploads.max_file_size`."""

    def __init__(self, name: str) -> None:
        super().__init__(f"File too large: {name}")
        self.name = name


class TotalTooLarge(UploadError):
    """All parts together are larger than `uploads.max_total_size`."""

    def __init__(self) -> None:
        super().__init__("Total upload size too large")


class InsufficientStorage(UploadError):
    """The disk filled up while writing; nothing of the request was kept."""

    def __init__(self, name: str) -> None:
        super().__init__(f"Not enough disk space to store {name}; nothing was saved")


class UnsafeFilename(UploadError):
    """A name that cannot be stored safely (traversal, backslash, too long, reserved)."""


class NameConflict(UploadError):
    """A file with that name exists and the client asked not to replace it."""

    def __init__(self, name: str) -> None:
        super().__init__(f"A file named {name} already exists")
        self.name = name


class ScannerUnavailable(UploadError):
    """The virus scanner could not answer; nothing was stored (fail-closed)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            "Virus scanning is unavailable right now, so the upload was refused and nothing "
            "was stored; try again shortly"
        )
        self.retry_after = retry_after


class TooLargeToScan(UploadError):
    """The file is larger than the virus scanner accepts; it was not stored."""

    def __init__(self, filename: str) -> None:
        super().__init__(
            f"{filename} is larger than the virus scanner accepts, so it was not stored"
        )
        self.filename = filename


class InfectedFile(UploadError):
    """The virus scanner found something in the file; it was not stored."""

    def __init__(self, filename: str, signature: str) -> None:
        super().__init__(f"{filename} was refused: the virus scanner found {signature}")
        self.filename = filename
        self.signature = signature


class QuotaExceeded(UploadError):
    """A write would take the owner's stored bytes over their quota (`quotas.*`, or the
    admin's override); nothing of it was kept. The numbers are bytes; `sentence` is the
    message with them written the way every page writes sizes (services/quotas/policy.py)."""

    def __init__(self, sentence: str, used: int, quota: int, needed: int) -> None:
        super().__init__(sentence)
        self.used = used
        self.quota = quota
        self.needed = needed


class InvalidQuota(DeerFlowError):
    """A quota that is not a whole number of bytes between 0 (unlimited) and the largest
    one accepted."""


class InvalidPath(UploadError):
    """A path that points outside the folder it must stay in."""

    def __init__(self, message: str = "Invalid path") -> None:
        super().__init__(message)


class UploadNotFound(UploadError):
    """The named upload does not exist (or is not a regular file)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"File not found: {name}")
        self.name = name


class VersionNotFound(UploadError):
    """The file has no version of that id (in this thread, for this user)."""

    def __init__(self, name: str, version_id: str) -> None:
        super().__init__(f"No version {version_id} of {name}")


class TrashEntryNotFound(UploadError):
    """The thread's trash holds nothing of that id (or it expired)."""

    def __init__(self, trash_id: str) -> None:
        super().__init__(f"Nothing in the trash has the id {trash_id}")


class ArtifactError(DeerFlowError):
    """Base class for failures resolving a virtual path (SPEC 1.9, 2.5)."""


class ArtifactPrefixError(ArtifactError):
    """The virtual path does not start with /mnt/user-data."""

    def __init__(self) -> None:
        super().__init__("Path must start with /mnt/user-data")


class PathTraversal(ArtifactError):
    """The resolved path escapes the thread's user-data folder."""

    def __init__(self) -> None:
        super().__init__("Access denied: path traversal detected")


class UnsafeFolder(DeerFlowError):
    """A folder between the data dir and a thread's files is a link or not a folder.

    An agent with a local sandbox can replace `uploads/` (or any folder above it) with a
    symlink; following it would list, write, rename or delete files outside the thread.
    """

    def __init__(self, relative: str) -> None:
        super().__init__(
            f"Access denied: {relative} is a symbolic link or not a folder, "
            "and links are never followed"
        )
        self.relative = relative


class ArtifactNotFound(ArtifactError):
    """The virtual path resolves to nothing."""

    def __init__(self, path: str) -> None:
        super().__init__(f"Artifact not found: {path}")


class NotAFile(ArtifactError):
    """The virtual path resolves to a directory or a special file."""

    def __init__(self, path: str) -> None:
        super().__init__(f"Path is not a file: {path}")


class ArtifactNotEditable(ArtifactError):
    """An edit the route refuses as asked: a path outside outputs/, or a malformed body."""


class ArtifactEditUnsupported(ArtifactError):
    """The file or the new content is not UTF-8 text that may be edited (a skill archive,
    a symlink, binary or non-UTF-8 bytes)."""


class ArtifactEditTooLarge(ArtifactError):
    """The file, or the content that would replace it, is over the edit limit."""

    def __init__(self) -> None:
        super().__init__("Artifact is too large to edit")


class ArtifactChanged(ArtifactError):
    """The file is not the one the editor opened: its SHA-256 differs from the expected one."""

    def __init__(self) -> None:
        super().__init__("Artifact changed since it was opened")


class ConversionError(DeerFlowError):
    """A document could not be converted to Markdown; the original is untouched."""


class NotConvertible(ConversionError):
    """The file type is not one conversion reads (documents, and images by OCR)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"{name} cannot be converted: only .pdf, .doc, .docx, .ppt, .pptx, .xls and "
            ".xlsx documents and .png, .jpg, .jpeg, .webp, .tif, .tiff, .bmp and .gif images "
            "are converted to Markdown"
        )


class NotScannedYet(ConversionError):
    """Virus scanning is on and the file is not (yet) scanned clean: it is not converted."""

    def __init__(self, filename: str, reason: str) -> None:
        super().__init__(f"{filename} cannot be converted yet: {reason}")
        self.filename = filename


class ConversionOverQuota(ConversionError):
    """The Markdown a conversion made would take its owner over their storage quota; it
    was not kept, and the original is untouched."""

    def __init__(self, filename: str, refusal: QuotaExceeded) -> None:
        super().__init__(f"{filename} was not converted: {refusal}")
        self.filename = filename
        self.refusal = refusal


class ConversionTimedOut(ConversionError):
    """The converter ran past its time limit and was stopped."""


class ConversionQueueFull(DeerFlowError):
    """Too many conversions are waiting; the request was not queued and may be retried.

    Not a `ConversionError`: nothing is wrong with the document, so its record keeps its
    state and the caller is told when to come back (`retry_after`, in seconds).
    """

    def __init__(self, queued: int, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"The conversion queue is full ({queued} waiting); try again in {retry_after} s"
        )


class ConversionUserLimit(ConversionQueueFull):
    """One user already has `conversion.max_per_user` conversions queued or running here,
    so one person cannot take every converter; the request was not queued."""

    def __init__(self, active: int, retry_after: int) -> None:
        self.retry_after = retry_after
        DeerFlowError.__init__(
            self,
            f"You already have {active} conversions queued or running, the most one user may "
            f"have (conversion.max_per_user); try again in {retry_after} s, once one has "
            "finished",
        )


class ArchiveError(DeerFlowError):
    """An archive (.zip, .tar, .tar.gz) or one of its members cannot be used as asked."""


class NotAnArchive(ArchiveError):
    """The file is not an archive this app reads."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is not an archive: only .zip, .tar, .tar.gz and .tgz are read")


class ArchiveRefused(ArchiveError):
    """The whole archive is refused (a bomb, too many members, unreadable); nothing of it
    was read or written. `reason` is the named rule, the message adds the archive."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name} is refused: {reason}")
        self.reason = reason


class ArchiveMemberRefused(ArchiveError):
    """One member is refused by a named rule (leaves the archive, a link, encrypted...)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(reason)
        self.member = name
        self.reason = reason


class ArchiveMemberNotFound(ArchiveError):
    """The archive holds no member of that name."""

    def __init__(self, archive: str, member: str) -> None:
        super().__init__(f"{archive} has no member {member!r}")


class StorageFailure(DeerFlowError):
    """An unexpected I/O error; the operation was rolled back and may be retried."""


class ObjectStoreUnavailable(DeerFlowError):
    """The object store (S3) cannot be reached or refused to answer for now; nothing was
    changed and the request may be retried (`retry_after`, in seconds)."""

    def __init__(self, detail: str = "", retry_after: int = 5) -> None:
        super().__init__(
            "File storage is unavailable right now; nothing was changed; try again shortly"
        )
        self.detail = detail  # the client library's reason, for the log only
        self.retry_after = retry_after


class ObjectNotFound(DeerFlowError):
    """No object is stored under the key (a record whose bytes are gone, or a bad key)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"No stored file at {key}")
        self.key = key


class InvalidObjectKey(DeerFlowError, ValueError):
    """An object key that is empty, absolute, or leaves its prefix (`..`, empty parts)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"Invalid storage key {key!r}")
        self.key = key


class ThreadNotFound(DeerFlowError):
    """The caller has no thread of that id (ids are per user: another's is not theirs)."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"Thread {thread_id} not found")
        self.thread_id = thread_id


class AuthError(DeerFlowError):
    """An account failure with one of DeerFlow's machine-readable codes (SPEC 7.2).

    The web layer answers `{"detail": {"code": ..., "message": ...}}` for these, as
    DeerFlow's frontend expects, instead of the plain sentence other errors carry.
    """

    code = "not_authenticated"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class NotAuthenticated(AuthError):
    """No valid session or API token came with the request."""

    code = "not_authenticated"

    def __init__(self, message: str = "Authentication required") -> None:
        super().__init__(message)


class InvalidCredentials(AuthError):
    """Wrong email or password (the two are never told apart)."""

    code = "invalid_credentials"

    def __init__(self, message: str = "Incorrect email or password") -> None:
        super().__init__(message)


class TokenInvalid(AuthError):
    """An API token that is unknown, revoked or belongs to a disabled account."""

    code = "token_invalid"

    def __init__(self, message: str = "Invalid token") -> None:
        super().__init__(message)


class TokenExpired(AuthError):
    """An API token past its expiry date."""

    code = "token_expired"

    def __init__(self, message: str = "Token has expired") -> None:
        super().__init__(message)


class EmailTaken(AuthError):
    """Another account already uses this email."""

    code = "email_already_exists"

    def __init__(self, message: str = "Email already registered") -> None:
        super().__init__(message)


class AlreadyInitialized(AuthError):
    """The first admin exists; set-up cannot run again."""

    code = "system_already_initialized"

    def __init__(self, message: str = "System already initialized") -> None:
        super().__init__(message)


class RegistrationDisabled(AuthError):
    """Self-registration is off (`auth.registration_enabled`)."""

    code = "registration_disabled"

    def __init__(self, message: str = "Registration is disabled") -> None:
        super().__init__(message)


class UserNotFound(AuthError):
    """No account with that id or email."""

    code = "user_not_found"

    def __init__(self, message: str = "User not found") -> None:
        super().__init__(message)


class WeakPassword(DeerFlowError):
    """A password too short or on the common-password list."""


class InvalidEmail(DeerFlowError):
    """An email address that is not one."""


class WrongPassword(AuthError):
    """The current password given to change it is wrong (400 with DeerFlow's code)."""

    code = "invalid_credentials"

    def __init__(self, message: str = "Current password is incorrect") -> None:
        super().__init__(message)


class PermissionDenied(DeerFlowError):
    """The account lacks the role the action needs (admin endpoints)."""


class SelfDisable(DeerFlowError):
    """An admin asked to disable their own account: nobody would be left to enable it."""

    def __init__(self) -> None:
        super().__init__("An admin cannot disable their own account")


class SelfReset(DeerFlowError):
    """An admin asked to reset their own password: it would revoke the very tokens and
    session they act with; they change it themselves instead."""

    def __init__(self) -> None:
        super().__init__(
            "An admin cannot reset their own password; change it with "
            "POST /api/v1/auth/change-password or on the account page"
        )


class TokenNotFound(DeerFlowError):
    """No API token with that id among the caller's tokens."""

    def __init__(self) -> None:
        super().__init__("Token not found")


class LockedOut(DeerFlowError):
    """Too many failed logins from this address, or for this account from this address;
    or an account being guessed at from everywhere is slowed down (SPEC 7.5)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__("Too many login attempts. Try again later.")  # DeerFlow's words
        self.retry_after = retry_after


class FileAccessError(DeerFlowError):
    """A file request the model can correct (missing, binary, outside, malformed); the
    agent tools hand its message back to the model instead of failing the run."""


class ResumableError(UploadError):
    """Base class for refusals of the resumable (tus) upload protocol (SPEC 8)."""


class TusVersionMissing(ResumableError):
    """The request does not say it speaks tus 1.0.0."""

    def __init__(self) -> None:
        super().__init__("Tus-Resumable: 1.0.0 is required")


class InvalidTusRequest(ResumableError):
    """A tus header is missing or malformed."""


class UnsupportedChunkType(ResumableError):
    """A PATCH whose body is not `application/offset+octet-stream`."""

    def __init__(self) -> None:
        super().__init__("Content-Type must be application/offset+octet-stream")


class OffsetMismatch(ResumableError):
    """The client's Upload-Offset is not where the upload stands."""

    def __init__(self, expected: int, given: int) -> None:
        super().__init__(f"Upload-Offset is {given}, but the upload is at {expected}")
        self.expected = expected


class UploadBusy(ResumableError):
    """Another request is writing to the same upload right now."""

    def __init__(self) -> None:
        super().__init__("Another request is writing to this upload; try again shortly")


class ChecksumMismatch(ResumableError):
    """The chunk's bytes do not match its Upload-Checksum; the chunk was discarded."""

    def __init__(self, algorithm: str) -> None:
        super().__init__(f"The {algorithm} checksum of the chunk does not match; it was discarded")


class PastUploadLength(ResumableError):
    """A chunk would take the upload past its declared Upload-Length."""

    def __init__(self, length: int) -> None:
        super().__init__(f"The chunk goes past Upload-Length ({length} bytes); it was discarded")


class ResumableNotFound(ResumableError):
    """No such upload in progress: unknown, finished, terminated or someone else's."""

    def __init__(self) -> None:
        super().__init__("Upload not found")


class PendingUploadsCap(ResumableError):
    """A user's unfinished resumable uploads would go over a cap (count or declared bytes):
    hidden staging space is bounded per user. Finish or terminate one first."""

    def __init__(self, setting: str, cap: int, what: str) -> None:
        super().__init__(
            f"Too many unfinished resumable uploads: {what}, over the cap of {cap} "
            f"(uploads.{setting}); finish or cancel one first"
        )
        self.setting = setting


class ResumableExpired(ResumableError):
    """The upload was not finished before its expiry and has been removed."""

    def __init__(self) -> None:
        super().__init__("Upload expired")


class ImageNotUsable(FileAccessError):
    """A file that cannot be shown to a vision model as a picture: not a raster image,
    an SVG (active content, never decoded), too many pixels to decode safely, or damaged."""


class ShareLinkNotFound(DeerFlowError):
    """No live link has that secret (unknown, expired and revoked answer alike)."""

    def __init__(self) -> None:
        super().__init__("Share link not found")


class ShareLinkRateLimited(DeerFlowError):
    """Too many requests to share links from one address; try again after `retry_after`."""

    def __init__(self, retry_after: int) -> None:
        super().__init__("Too many requests. Try again later.")
        self.retry_after = retry_after
