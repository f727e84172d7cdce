"""Stream a multipart/form-data body part by part, without spooling it anywhere.

Werkzeug's `request.files` writes every file to a temporary file and `save()` copies it a
second time. Here Werkzeug's sans-IO decoder is fed the raw request stream in large
chunks, and each `files` part is handed to the upload service as a readable stream the
moment its headers arrive: its bytes go straight into the staging file, and a limit
crossed in the middle stops the reading there.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

from werkzeug.exceptions import ClientDisconnected
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.sansio.multipart import NEED_DATA
from werkzeug.sansio.multipart import Data
from werkzeug.sansio.multipart import Epilogue
from werkzeug.sansio.multipart import Event
from werkzeug.sansio.multipart import Field
from werkzeug.sansio.multipart import File
from werkzeug.sansio.multipart import MultipartDecoder
from werkzeug.sansio.multipart import Preamble

from deerflow_web.errors import MalformedUpload
from deerflow_web.errors import MissingFilesField
from deerflow_web.models import IncomingFile

READ_SIZE = 1024 * 1024
MAX_FIELD_BYTES = 64 * 1024  # small form fields such as `on_conflict`
_QUOTED_FILENAME = re.compile(r';\s*filename\s*=\s*"((?:[^"\\]|\\.)*)"', re.IGNORECASE)
_ESCAPED = re.compile(r'\\(["\\])')


def part_filename(event: File) -> str:
    r"""The client's filename with its backslashes kept.

    Browsers send a backslash in a name as it is, and curl escapes it as `\\`; only `\"`
    and `\\` are escapes. Werkzeug's header parser drops every other backslash, which
    would turn `a\b.txt` into `ab.txt` instead of letting the name rules refuse it.
    """
    header = event.headers.get("Content-Disposition", "")
    match = _QUOTED_FILENAME.search(header)
    if match is None or "filename*" in header.lower():
        return event.filename or ""
    return _ESCAPED.sub(r"\1", match.group(1))


class _PartStream:
    """The body of one part, read lazily from the shared decoder."""

    def __init__(self, reader: MultipartReader) -> None:
        self._reader = reader
        self.finished = False

    def read(self, size: int = -1) -> bytes:
        """Return the next piece of the part (any length), or b"" at its end."""
        while not self.finished:
            event = self._reader.next_event()
            if not isinstance(event, Data):
                raise MalformedUpload("The multipart body is malformed")
            self.finished = not event.more_data
            if event.data:
                return event.data
        return b""

    def drain(self) -> None:
        """Skip what the consumer did not read, so the next part can be found."""
        while self.read():
            pass


class MultipartReader:
    """Yields each `files` part as an `IncomingFile`; collects small text fields on the way.

    Fields sent before the files (such as `on_conflict`) are in `fields` by the time the
    first file is yielded.
    """

    def __init__(self, stream: BinaryIO, boundary: bytes, file_field: str = "files") -> None:
        self._stream = stream
        # The decoder's memory limit counts file data in its buffer too: keep it above
        # one read so that only an oversized text field trips it.
        self._decoder = MultipartDecoder(boundary, max_form_memory_size=READ_SIZE + MAX_FIELD_BYTES)
        self._file_field = file_field
        self.fields: dict[str, str] = {}

    def next_event(self) -> Event:
        """The next decoder event, reading more of the body when the decoder needs it."""
        try:
            while (event := self._decoder.next_event()) is NEED_DATA:
                chunk = self._stream.read(READ_SIZE)
                self._decoder.receive_data(chunk or None)
        except ClientDisconnected as error:
            raise MalformedUpload("The upload was cut off before the request body ended") from error
        except RequestEntityTooLarge as error:
            raise MalformedUpload("A form field in the upload is too large") from error
        except ValueError as error:
            raise MalformedUpload(
                "The request body is not a complete multipart/form-data body"
            ) from error
        return event

    def __iter__(self) -> Iterator[IncomingFile]:
        seen_files = False
        while not isinstance(event := self.next_event(), Epilogue):
            if isinstance(event, Preamble):
                continue
            part = _PartStream(self)
            if isinstance(event, File) and event.name == self._file_field:
                seen_files = True
                yield IncomingFile(part_filename(event), part)
            elif isinstance(event, Field) and event.name:
                self.fields[event.name] = self._read_field(part)
            part.drain()
        if not seen_files:
            raise MissingFilesField()

    @staticmethod
    def _read_field(part: _PartStream) -> str:
        data = b""
        while chunk := part.read():
            data += chunk
            if len(data) > MAX_FIELD_BYTES:
                raise MalformedUpload("A form field in the upload is too large")
        return data.decode("utf-8", "replace")
