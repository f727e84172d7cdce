"""The multipart/form-data framing: bytes in, events out, no I/O (RFC 2046, RFC 7578).

The shape of Werkzeug's `sansio.multipart` decoder: the caller feeds the body as it
arrives and asks for events until `NEED_DATA`. Unlike that decoder it never copies file
data: a `Data` event is a memoryview into the bytes fed last, valid as long as the caller
leaves them unchanged, so the reader (multipart.py) hands it to the hasher and the disk as
it is. Only what a delimiter might still complete (fewer bytes than a delimiter has) and a
part's small header block are carried from one feed to the next, copied when the scanner
answers `NEED_DATA`: from then on it holds no reference to what was fed, and the caller
may read into that buffer again.

Events, in order: for each part a `PartStart` with its headers, then `Data` pieces until
one with `last` set (an empty part has a single empty one), and `END` at the closing
delimiter. Whatever comes before the first delimiter (the preamble) or after the closing
one (the epilogue) is never reported.
"""

from __future__ import annotations

from typing import NamedTuple

from werkzeug.datastructures import Headers

from deerflow_web.errors import MalformedUpload

MAX_HEADER_BYTES = 16 * 1024
HEADER_TOO_LARGE = "A part header of the upload is too large"
HEADER_MALFORMED = "A part header of the upload is malformed"


class PartStart(NamedTuple):
    """A part begins; its data follows as `Data` events."""

    headers: Headers


class Data(NamedTuple):
    """A piece of the current part's data (a view into the bytes fed last)."""

    data: memoryview
    last: bool  # the part ends with this piece


class _Signal:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Signal("NEED_DATA")  # feed the next bytes of the body, then ask again
END = _Signal("END")  # the closing delimiter: the body is complete

Event = PartStart | Data | _Signal

_PREAMBLE, _AFTER_DELIMITER, _PADDING, _HEADERS, _BEGIN_DATA, _DATA, _DONE = range(7)


def parse_part_headers(raw: bytes) -> Headers:
    """The header lines of one part (`Name: value`, CRLF between them)."""
    headers = Headers()
    for line in raw.decode("utf-8", "replace").split("\r\n"):
        key, colon, value = line.partition(":")
        if not colon:
            raise MalformedUpload(HEADER_MALFORMED)
        headers.add(key.strip(), value.strip())
    return headers


class MultipartScanner:
    """Finds the delimiters of one body with boundary `boundary` (see the module)."""

    def __init__(self, boundary: bytes, max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        self._delimiter = b"\r\n--" + boundary
        self._max_header_bytes = max_header_bytes
        self._state = _PREAMBLE
        # The body may start with the delimiter itself; a virtual CRLF makes that uniform.
        self._buffer: bytes | bytearray = b"\r\n"
        self._position = 0
        self._end = 2
        # The bytes left of the previous feed, when the new one is checked at the seam.
        self._seam: bytes | None = None
        self._headers: Headers | None = None  # of the part whose data begins next

    def feed(self, buffer: bytes | bytearray, length: int | None = None) -> None:
        """The next `length` bytes of the body (all of `buffer` by default), after a
        `NEED_DATA`. Pieces of them are handed out as they are: leave them unchanged
        until the scanner answers `NEED_DATA` again (or as long as the pieces are used)."""
        length = len(buffer) if length is None else length
        if not length:
            return
        rest = self._buffer[self._position : self._end]
        scanning = self._state in (_PREAMBLE, _DATA)
        if rest and scanning and length >= len(self._delimiter):
            # Those few bytes either begin a delimiter that the new bytes complete, or are
            # data: checking the seam decides which, without copying the new bytes onto
            # them (that copy cost as much as the delimiter search itself).
            self._seam = bytes(rest)
            self._buffer, self._end = buffer, length
        elif rest:
            self._buffer = rest + memoryview(buffer)[:length]
            self._end = len(self._buffer)
        else:
            self._buffer, self._end = buffer, length
        self._position = 0

    def next_event(self) -> Event:
        """The next event, or `NEED_DATA` when the bytes fed so far say no more."""
        while True:
            state = self._state
            if state == _DATA or state == _PREAMBLE:
                piece = self._scan()
                if piece is None:
                    return self._need_data()
                if state == _DATA:
                    if piece.last:
                        self._state = _AFTER_DELIMITER
                    return piece
                if piece.last:  # the preamble is over
                    self._state = _AFTER_DELIMITER
            elif state == _AFTER_DELIMITER:
                if self._end - self._position < 2:
                    return self._need_data()
                if self._buffer[self._position : self._position + 2] == b"--":
                    self._state = _DONE
                    return END
                self._state = _PADDING
            elif state == _PADDING:  # optional whitespace after a delimiter, then CRLF
                if self._take_until(b"\r\n", 0) is None:
                    return self._need_data()
                self._state = _HEADERS
            elif state == _HEADERS:
                # The blank line's CRLF stays: it may double as the delimiter's (below).
                raw = self._take_until(b"\r\n\r\n", 2)
                if raw is None:
                    return self._need_data()
                self._headers = parse_part_headers(raw)
                self._state = _BEGIN_DATA
            elif state == _BEGIN_DATA:
                # Werkzeug's own client writes an empty part as its headers' blank line
                # followed by `--boundary`: that CRLF is then the delimiter's too.
                if self._end - self._position < len(self._delimiter):
                    return self._need_data()
                if not self._buffer.startswith(self._delimiter, self._position, self._end):
                    self._position += 2
                self._state = _DATA
                headers, self._headers = self._headers, None
                return PartStart(headers)
            else:
                return END

    def _need_data(self) -> _Signal:
        """Keep a copy of what is left, so the caller may reuse its buffer."""
        self._buffer = bytes(self._buffer[self._position : self._end])
        self._position, self._end = 0, len(self._buffer)
        return NEED_DATA

    def _scan(self) -> Data | None:
        """The next piece of data before the next delimiter, or None to read on."""
        delimiter = self._delimiter
        if self._seam is not None:
            seam, self._seam = self._seam, None
            at = (seam + self._buffer[: len(delimiter)]).find(delimiter)
            if 0 <= at < len(seam):
                self._position = at + len(delimiter) - len(seam)
                return Data(memoryview(seam)[:at], True)
            return Data(memoryview(seam), False)
        buffer, position, end = self._buffer, self._position, self._end
        at = buffer.find(delimiter, position, end)
        if at >= 0:
            self._position = at + len(delimiter)
            return Data(memoryview(buffer)[position:at], True)
        safe = end - len(delimiter) + 1  # the last bytes might begin a delimiter
        if safe > position:
            self._position = safe
            return Data(memoryview(buffer)[position:safe], False)
        return None

    def _take_until(self, marker: bytes, keep: int) -> bytes | None:
        """The bytes before `marker`, stepping past the marker but for its last `keep`
        bytes; None to read on. A header block longer than allowed is refused, whether
        it came in one feed or in many."""
        at = self._buffer.find(marker, self._position, self._end)
        if (at if at >= 0 else self._end) - self._position > self._max_header_bytes:
            raise MalformedUpload(HEADER_TOO_LARGE)  # however the bytes were cut
        if at < 0:
            return None
        found = bytes(self._buffer[self._position : at])
        self._position = at + len(marker) - keep
        return found
