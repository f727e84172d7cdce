"""Domain errors in the reader's language, for the HTML pages and the pages' scripts.

The domain errors carry English sentences written for API clients; a person using the
pages in Chinese should read the same facts in Chinese. Flash messages and error pages use
these sentences, and so does the JSON API when the caller is one of our own pages' scripts
(they send `X-DeerFlow-Page`, see web/errors.py), since those show `detail` to a person.
Unknown errors keep their text.
"""

from __future__ import annotations

from collections.abc import Callable

from flask_babel import gettext as _

from deerflow_web.errors import ArtifactChanged
from deerflow_web.errors import ArtifactNotFound
from deerflow_web.errors import ConversionError
from deerflow_web.errors import ConversionOverQuota
from deerflow_web.errors import ConversionQueueFull
from deerflow_web.errors import ConversionTimedOut
from deerflow_web.errors import ConversionUserLimit
from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import FileTooLarge
from deerflow_web.errors import InsufficientStorage
from deerflow_web.errors import InvalidInput
from deerflow_web.errors import InvalidPath
from deerflow_web.errors import InvalidThreadId
from deerflow_web.errors import MalformedUpload
from deerflow_web.errors import NameConflict
from deerflow_web.errors import NoFilesProvided
from deerflow_web.errors import NotAFile
from deerflow_web.errors import NotConvertible
from deerflow_web.errors import ObjectStoreUnavailable
from deerflow_web.errors import PathTraversal
from deerflow_web.errors import QuotaExceeded
from deerflow_web.errors import RequestTimedOut
from deerflow_web.errors import ScannerUnavailable
from deerflow_web.errors import ShareLinkNotFound
from deerflow_web.errors import ShareLinkRateLimited
from deerflow_web.errors import StorageFailure
from deerflow_web.errors import ThreadNotFound
from deerflow_web.errors import TooLargeToScan
from deerflow_web.errors import TooManyFiles
from deerflow_web.errors import TotalTooLarge
from deerflow_web.errors import TrashEntryNotFound
from deerflow_web.errors import UnsafeFilename
from deerflow_web.errors import UnsafeFolder
from deerflow_web.errors import UploadNotFound
from deerflow_web.errors import VersionNotFound
from deerflow_web.models import UploadLimits
from deerflow_web.services.files.sizes import human_size


def describe_error(error: DeerFlowError, limits: UploadLimits) -> str:
    """A sentence for a flash message: what went wrong and, where known, the limit."""
    if isinstance(error, NameConflict):
        return _("A file named “%(name)s” already exists. Nothing was changed.", name=error.name)
    if isinstance(error, TooManyFiles):
        return _("Too many files: at most %(count)d per upload.", count=limits.max_files)
    if isinstance(error, FileTooLarge):
        return _(
            "“%(name)s” is larger than %(limit)s, the limit per file. Nothing was uploaded.",
            name=error.name,
            limit=human_size(limits.max_file_size),
        )
    if isinstance(error, TotalTooLarge):
        return _(
            "The files together are larger than %(limit)s. Nothing was uploaded.",
            limit=human_size(limits.max_total_size),
        )
    if isinstance(error, ScannerUnavailable):
        return _(
            "Virus scanning is unavailable right now. Nothing was uploaded; try again shortly."
        )
    if isinstance(error, TooLargeToScan):
        return _(
            "“%(name)s” is larger than the virus scanner accepts. Nothing was uploaded.",
            name=error.filename,
        )
    if isinstance(error, NoFilesProvided):
        return _("Choose at least one file.")
    if isinstance(error, UploadNotFound):
        return _("“%(name)s” was not found. It may have been deleted already.", name=error.name)
    if isinstance(error, InsufficientStorage):
        return _("Not enough disk space. Nothing was uploaded.")
    if isinstance(error, InvalidThreadId):
        return _("Thread ids use 1-64 letters, digits, hyphens or underscores.")
    if isinstance(error, ConversionQueueFull) and not isinstance(error, ConversionUserLimit):
        return _(
            "The conversion queue is full. Try again in %(seconds)d seconds.",
            seconds=error.retry_after,
        )
    return _describe_more(error)


def _describe_more(error: DeerFlowError) -> str:
    """The rest of the errors a person can meet on a page or through a page's script."""
    if isinstance(error, ConversionOverQuota):
        error = error.refusal
    if isinstance(error, QuotaExceeded):
        return _(
            "Storage quota exceeded: %(used)s of %(quota)s used, this upload needs "
            "%(needed)s. Nothing was saved; delete some files first.",
            used=human_size(error.used),
            quota=human_size(error.quota),
            needed=human_size(error.needed),
        )
    if isinstance(error, ConversionUserLimit):
        return _(
            "You already have the most conversions one person may have running. Try again "
            "in %(seconds)d seconds.",
            seconds=error.retry_after,
        )
    if isinstance(error, ShareLinkRateLimited):
        return _(
            "Too many attempts from your address. Try again in %(seconds)d seconds.",
            seconds=error.retry_after,
        )
    if isinstance(error, UnsafeFolder):
        return _(
            "The thread's folder is not safe to use (%(detail)s). Tell the administrator.",
            detail=str(error),
        )
    for kind, sentence in _SENTENCES:
        if isinstance(error, kind):
            return sentence()
    if isinstance(error, InvalidInput):
        return _("Some of what was sent is not valid: %(detail)s", detail=str(error))
    return str(error)


# Checked in order: a subclass before its base.
_SENTENCES: tuple[tuple[type[DeerFlowError], Callable[[], str]], ...] = (
    (UnsafeFilename, lambda: _("That file name cannot be used. Choose another name.")),
    (InvalidPath, lambda: _("That name or path is not valid.")),
    (
        VersionNotFound,
        lambda: _("That version does not exist any more. It may have been restored or removed."),
    ),
    (
        TrashEntryNotFound,
        lambda: _("That file is not in the trash any more. It may have been restored or expired."),
    ),
    (PathTraversal, lambda: _("That path leads outside the thread, so it was refused.")),
    (ArtifactNotFound, lambda: _("That file does not exist. It may have been moved or deleted.")),
    (NotAFile, lambda: _("That is a folder, not a file.")),
    (ArtifactChanged, lambda: _("The file changed since you opened it. Reload and try again.")),
    (
        NotConvertible,
        lambda: _("Only PDF, Word, PowerPoint and Excel files can be converted to Markdown."),
    ),
    (
        ConversionTimedOut,
        lambda: _("Converting took too long and was stopped. The document may be too large."),
    ),
    (
        ConversionError,
        lambda: _(
            "The document could not be converted to Markdown. It may be damaged or protected."
        ),
    ),
    (ThreadNotFound, lambda: _("That thread does not exist, or it is not yours.")),
    (
        ShareLinkNotFound,
        lambda: _(
            "This share link does not work: it may have expired or been revoked, "
            "or it was copied wrongly."
        ),
    ),
    (MalformedUpload, lambda: _("The upload was cut off or damaged. Try again.")),
    (RequestTimedOut, lambda: _("The upload took too long and was stopped. Try again.")),
    (
        ObjectStoreUnavailable,
        lambda: _(
            "File storage cannot be reached right now. Nothing was changed; try again shortly."
        ),
    ),
    (
        StorageFailure,
        lambda: _(
            "The server could not store this. Try again, and tell the administrator "
            "if it keeps happening."
        ),
    ),
)
