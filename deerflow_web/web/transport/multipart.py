"""Stream a multipart/form-data body part by part, without spooling or copying it.

Werkzeug's `request.files` writes every file to a temporary file and `save()` copies it a
second time; even its sans-IO decoder copies each chunk three times on the way through.
Uploads are the hot path here, so this reader reads the request body chunk by chunk into
one reused buffer (see request_body.py), has the scanner (multipart_scanner.py, no I/O)
find the part delimiters in it in place and hands the file data on as memoryview slices
of that buffer: the upload service hashes them and writes them to the staging file with
no copy in Python. This module owns the I/O: the buffers, the turns given to other
greenlets, the body limit and what the hashing may rely on.

The buffer starts small and grows to a megabyte only for a client that keeps it full, and
only while fewer than `LARGE_BUFFERS` such buffers exist in the process: hundreds of slow
uploads then cost 64 KiB each instead of a megabyte each, while a fast upload still moves
in megabyte chunks (fewer writes and hash updates per megabyte). On gevent's loop, a fast
upload that is the only one of its process gets a second megabyte and reads into the two
in turn, so each chunk's hash can run on a native thread while the next is read.
"""

from __future__ import annotations

import re
import weakref
from collections import deque
from collections.abc import Iterator

from werkzeug.http import parse_options_header
from werkzeug.wrappers import Request

from deerflow_web.concurrency import Turn
from deerflow_web.concurrency import on_event_loop
from deerflow_web.errors import MalformedUpload
from deerflow_web.errors import MissingFilesField
from deerflow_web.errors import TotalTooLarge
from deerflow_web.models import IncomingFile
from deerflow_web.web.transport.multipart_scanner import END
from deerflow_web.web.transport.multipart_scanner import MAX_HEADER_BYTES
from deerflow_web.web.transport.multipart_scanner import NEED_DATA
from deerflow_web.web.transport.multipart_scanner import Data
from deerflow_web.web.transport.multipart_scanner import MultipartScanner
from deerflow_web.web.transport.multipart_scanner import PartStart
from deerflow_web.web.transport.request_body import CUT_OFF
from deerflow_web.web.transport.request_body import RequestBody
from deerflow_web.web.transport.request_body import WsgiBody
from deerflow_web.web.transport.request_body import request_body

READ_SIZE = 1024 * 1024  # a fast client's chunk
SMALL_READ_SIZE = 64 * 1024  # every upload's first chunk, and a slow client's for good
LARGE_BUFFERS = 16  # megabyte chunks alive at once per process
MAX_FIELD_BYTES = 64 * 1024  # small form fields such as `on_conflict`
# All text fields of one body together: the app reads two (`on_conflict`, the CSRF token),
# so this bounds the memory a body of many fields can take, whatever the upload limits.
MAX_FIELDS_TOTAL_BYTES = 256 * 1024
# What a body may hold beyond `max_total_size` of file data: part headers, delimiters and
# the small fields. Every byte of the body counts against the sum (see `upload_body_limit`).
FRAMING_ALLOWANCE = 1024 * 1024
_QUOTED_FILENAME = re.compile(r';\s*filename\s*=\s*"((?:[^"\\]|\\.)*)"', re.IGNORECASE)
# The shape every browser, curl and HTTP library sends, with nothing to unescape or decode:
# read directly, as the general parser would read it, at a fifth of its cost per part.
_PLAIN_DISPOSITION = re.compile(r'form-data; name="([^"\\]*)"(?:; filename="([^"\\]*)")?')
_ESCAPED = re.compile(r'\\(["\\])')


def part_disposition(disposition: str) -> tuple[str | None, str | None]:
    """A part's field name and, for a file, the client's filename (see `part_filename`)."""
    plain = _PLAIN_DISPOSITION.fullmatch(disposition)
    if plain is not None:
        return plain.group(1), plain.group(2)
    return parse_options_header(disposition)[1].get("name"), part_filename(disposition)


def part_filename(disposition: str) -> str | None:
    r"""The client's filename with its backslashes kept; None when the part is no file.

    Browsers send a backslash in a name as it is, and curl escapes it as `\\`; only `\"`
    and `\\` are escapes. Werkzeug's header parser drops every other backslash, which
    would turn `a\b.txt` into `ab.txt` instead of letting the name rules refuse it.
    """
    match = _QUOTED_FILENAME.search(disposition)
    if match is not None and "filename*" not in disposition.lower():
        return _ESCAPED.sub(r"\1", match.group(1))
    return parse_options_header(disposition)[1].get("filename")


def upload_body_limit(max_total_size: int, configured: int | None = None) -> int:
    """The most bytes an upload body may have: the file data limit plus the framing
    allowance, and never more than the app's configured `MAX_CONTENT_LENGTH`."""
    limit = max_total_size + FRAMING_ALLOWANCE
    return limit if configured is None else min(limit, configured)


class _Chunk(bytearray):
    """A read buffer that can say when the last view into it is gone."""

    __slots__ = ("__weakref__",)


class LargeBuffers:
    """At most `count` megabyte read buffers alive at once; a buffer's slot frees with it.

    The slot comes back when the buffer is garbage (the request is over and no view into
    it is left), so nothing has to remember to hand it back on an error path. Slots are
    tokens in a deque, whose append and pop are atomic: the finalizer may run inside
    `take` itself (a garbage collection there), where a lock would deadlock.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._slots: deque[None] = deque([None] * count)

    @property
    def free(self) -> int:
        """Slots not in use."""
        return len(self._slots)

    def take(self) -> bytearray | None:
        """A fresh megabyte buffer, or None while every slot is taken."""
        try:
            self._slots.pop()
        except IndexError:
            return None
        chunk = _Chunk(READ_SIZE)
        weakref.finalize(chunk, self._slots.append, None)
        return chunk


large_buffers = LargeBuffers(LARGE_BUFFERS)


class BodyReader:
    """Reads the request body in large chunks into reused buffers and feeds them to the
    scanner (multipart_scanner.py), which finds the delimiters between parts.

    Each chunk is read into one buffer that is reused for the whole request, and file data
    is handed out as the scanner's views into it: a piece is valid until the next read
    (or the one after it, see `piece_outlives_next_read`). The scanner copies the few bytes
    it carries over before it asks for more, so the next read may overwrite the buffer.

    Every byte read counts against `max_length`, whatever part it belongs to (file data,
    fields, part headers, parts that are skipped), so a body of endless small fields or
    headers is stopped as soon as it passes the limit, like one large file would be.
    """

    def __init__(self, body: RequestBody, boundary: bytes, max_length: int | None = None) -> None:
        self._body = body
        self._max_length = max_length
        self.bytes_read = 0
        self._scanner = MultipartScanner(boundary, MAX_HEADER_BYTES)
        self._chunk = bytearray(SMALL_READ_SIZE)
        self._wants_large = False
        self._spare: bytearray | None = None  # the other buffer, read into in turn
        self._lent = False  # whether a piece was handed out since `_chunk` was filled
        self._turn = Turn()

    def next_event(self) -> PartStart | Data | object:
        """The scanner's next event (never `NEED_DATA`: the body is read until there is one)."""
        scanner = self._scanner
        while (event := scanner.next_event()) is NEED_DATA:
            count = self._read_chunk()  # may move to another buffer: `_chunk` only after it
            scanner.feed(self._chunk, count)
        if type(event) is Data:
            self._lent = True  # (also for a piece the scanner copied: harmless)
        return event

    def read_data(self) -> Data:
        """The next piece of the current part's data, and whether the part ends with it."""
        return self.next_event()  # type: ignore[return-value] - a part's data follows its start

    def _read_chunk(self) -> int:
        """Read into the chunk buffer until it is full or the body ends; return the count.

        Full chunks keep the number of writes and hash updates per megabyte small however
        the server's reads happen to be cut. A small chunk filled by one read means the
        client sends faster than we read: the next chunk is a large one, if one is free.
        """
        if self._wants_large:
            self._wants_large = False
            self._take_large()
        elif self._spare is not None:
            if self._lent:
                self._chunk, self._spare = self._spare, self._chunk
            if large_buffers.free < large_buffers.count - 2:
                self._spare = None  # another fast upload came: see `_take_large`
        self._lent = False
        view = memoryview(self._chunk)
        count = 0
        while count < len(view) and (got := self._body.readinto(view[count:])):
            if count == 0 and got == len(view) == SMALL_READ_SIZE:
                self._wants_large = True
            count += got
        if not count:
            raise MalformedUpload(CUT_OFF)
        self.bytes_read += count
        if self._max_length is not None and self.bytes_read > self._max_length:
            raise TotalTooLarge()
        self._turn.step_aside()  # a fast client never makes a read wait
        return count

    def _take_large(self) -> None:
        """Move to a megabyte buffer, and to two of them when no other upload of this
        process has one (on gevent's loop, where their hashing can overlap the reads).

        The second is let go as soon as another upload of the process takes a megabyte
        buffer: with two fast uploads on the loop the cores are busy already, and hashing
        beside only added its hand-offs (eight concurrent uploads: 0.94x).
        """
        large = large_buffers.take()
        if large is None:
            return
        self._chunk = large
        if on_event_loop() and large_buffers.free == large_buffers.count - 1:
            self._spare = large_buffers.take()

    def piece_outlives_next_read(self) -> bool:
        """Whether the piece handed out last stays unchanged until the one after it has
        been handed out too.

        With two buffers read into in turn, a buffer that handed out a piece is left alone
        by the next read, which goes into the other one; the read after that may reuse it.
        """
        return self._spare is not None


class _PartStream:
    """The body of one part, read lazily from the shared body reader."""

    def __init__(self, body: BodyReader) -> None:
        self._body = body
        self.finished = False

    def read(self, size: int = -1) -> memoryview | bytes:
        """Return the next piece of the part (any length, valid until the next read), or
        b"" at its end."""
        while not self.finished:
            piece, self.finished = self._body.read_data()
            if piece:
                return piece
        return b""

    def drain(self) -> None:
        """Skip what the consumer did not read, so the next part can be found."""
        while self.read():
            pass


class MultipartReader:
    """Yields each `files` part as an `IncomingFile`; collects small text fields on the way.

    Fields sent before the files (such as `on_conflict`) are in `fields` by the time the
    first file is yielded; a `leading_fields` field sent after a file is refused rather than
    ignored. Each part's stream is valid until the next part is requested.
    """

    def __init__(
        self,
        body: RequestBody,
        boundary: bytes,
        file_field: str = "files",
        leading_fields: frozenset[str] = frozenset({"on_conflict"}),
        max_length: int | None = None,
    ) -> None:
        self._body = BodyReader(body, boundary, max_length)
        self._file_field = file_field
        self._leading_fields = leading_fields
        self.fields: dict[str, str] = {}
        self._fields_size = 0

    def __iter__(self) -> Iterator[IncomingFile]:
        seen_files = False
        while (event := self._body.next_event()) is not END:
            assert type(event) is PartStart  # the scanner's order (multipart_scanner.py)
            headers = event.headers
            disposition = headers.get("Content-Disposition")
            if disposition is None:
                raise MalformedUpload("A part of the upload has no Content-Disposition header")
            name, filename = part_disposition(disposition)
            part = _PartStream(self._body)
            if name == self._file_field and filename is not None:
                seen_files = True
                yield IncomingFile(filename, part, self._body.piece_outlives_next_read)
            elif name:
                if seen_files and name in self._leading_fields:
                    # The files before it are stored already, under the rule it would change.
                    raise MalformedUpload(f"The {name} field must come before the files")
                value = self._read_field(part)
                self._fields_size += len(name) + len(value)
                if self._fields_size > MAX_FIELDS_TOTAL_BYTES:
                    raise TotalTooLarge()  # fields count toward the body like files do
                self.fields[name] = value
            part.drain()
        if not seen_files:
            raise MissingFilesField()

    @staticmethod
    def _read_field(part: _PartStream) -> str:
        data = bytearray()
        while chunk := part.read():
            data += chunk
            if len(data) > MAX_FIELD_BYTES:
                raise MalformedUpload("A form field in the upload is too large")
        return data.decode("utf-8", "replace")


def multipart_reader(request: Request, max_length: int | None) -> MultipartReader:
    """The reader of an upload request's body, refused before reading when it cannot fit.

    `max_length` bounds the whole body (see `upload_body_limit`): a declared length above
    it is refused unread, and any body is stopped once it has sent more.
    """
    mimetype, options = parse_options_header(request.headers.get("Content-Type", ""))
    boundary = options.get("boundary", "").encode("latin-1")
    if mimetype != "multipart/form-data" or not boundary:
        raise MissingFilesField()
    length = request.content_length
    if length is None:  # chunked transfer encoding: Werkzeug knows how to end it
        return MultipartReader(WsgiBody(request.stream, None), boundary, max_length=max_length)
    if max_length is not None and length > max_length:
        raise TotalTooLarge()  # hopeless before the first byte
    return MultipartReader(request_body(request.environ, length), boundary, max_length=max_length)
