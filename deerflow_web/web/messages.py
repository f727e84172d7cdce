"""Domain errors in the reader's language, for flash messages on the HTML pages.

The domain errors carry English sentences written for API clients; a person using the
pages in Chinese should read the same facts in Chinese. Unknown errors keep their text.
"""

from __future__ import annotations

from flask_babel import gettext as _

from deerflow_web.errors import ConversionQueueFull
from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import FileTooLarge
from deerflow_web.errors import InsufficientStorage
from deerflow_web.errors import InvalidThreadId
from deerflow_web.errors import NameConflict
from deerflow_web.errors import NoFilesProvided
from deerflow_web.errors import ScannerUnavailable
from deerflow_web.errors import TooLargeToScan
from deerflow_web.errors import TooManyFiles
from deerflow_web.errors import TotalTooLarge
from deerflow_web.errors import UploadNotFound
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
    if isinstance(error, ConversionQueueFull):
        return _(
            "The conversion queue is full. Try again in %(seconds)d seconds.",
            seconds=error.retry_after,
        )
    return str(error)
