"""Delete several uploads in one action, reporting each name's fate.

A person who selects an original and its companion `.md` should not see an error for the
companion: deleting the original already removed it (the cascade of SPEC D8).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field

from deerflow_web.errors import UploadError
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.storage.paths import Thread


@dataclass
class BulkDeleteResult:
    """Names removed (companions included) and names that could not be removed, with why."""

    deleted: list[str] = field(default_factory=list)
    failed: list[tuple[str, UploadError]] = field(default_factory=list)


def delete_uploads(
    service: UploadService, thread: Thread, filenames: Iterable[str]
) -> BulkDeleteResult:
    """Delete each named upload in turn; one failure does not stop the others."""
    result = BulkDeleteResult()
    thread = service.folders(thread)
    for name in dict.fromkeys(filenames):  # keep order, drop repeats
        if name in result.deleted:
            continue
        try:
            result.deleted.extend(service.delete_upload(thread, name))
        except UploadError as error:
            result.failed.append((name, error))
    return result
