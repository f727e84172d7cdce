"""The body of an upload request, read into a buffer the caller owns and reuses.

Uploads are the hot path. gunicorn's `wsgi.input` passes every byte through two BytesIO
buffers and hands out a new bytes object per read: three copies in Python and a fresh
megabyte of memory for the kernel to fault in on every read, as much CPU as finding the
multipart delimiters and a tenth of what a whole upload costs. For a body of known length
under gunicorn, `GunicornBody` receives straight from the connection's socket into the
caller's buffer instead. Every other case (another server, the test client, chunked
transfer encoding) goes through `wsgi.input` as WSGI defines it.
"""

from __future__ import annotations

import socket
from typing import BinaryIO
from typing import Protocol

from gunicorn.http.body import Body
from gunicorn.http.body import LengthReader

from deerflow_web.errors import MalformedUpload
from deerflow_web.errors import RequestTimedOut

CUT_OFF = "The upload was cut off before the request body ended"


class BodyTooSlow(TimeoutError):
    """The server's worker cut a request whose body came too slowly (web/transport/server.py).

    A `TimeoutError`, as the idle timeout's is, so every reader that stops at one stops at
    this too; its message says what was too slow.
    """


def timed_out(error: BaseException) -> RequestTimedOut:
    """The 408 for a read that the connection's idle timeout or minimum rate stopped."""
    return RequestTimedOut(str(error) if isinstance(error, BodyTooSlow) else None)


class RequestBody(Protocol):
    def readinto(self, buffer: memoryview) -> int:
        """Fill the start of `buffer`; return the count, 0 only once the body has ended."""


class WsgiBody:
    """`wsgi.input`, or Werkzeug's stream for a chunked body, as a `RequestBody`.

    With a Content-Length, reading stops there: WSGI servers need not mark the end of
    the input, and a server that does not could block on a keep-alive connection.
    """

    def __init__(self, stream: BinaryIO, length: int | None) -> None:
        self._stream = stream
        self._remaining = length

    def readinto(self, buffer: memoryview) -> int:
        wanted = len(buffer) if self._remaining is None else min(len(buffer), self._remaining)
        if wanted == 0:
            return 0
        try:
            data = self._stream.read(wanted)
        except TimeoutError as error:  # the server's idle timeout or minimum body rate
            raise timed_out(error) from error
        if not data:
            if self._remaining is None:
                return 0  # the stream knows where a chunked body ends
            raise MalformedUpload(CUT_OFF)
        buffer[: len(data)] = data
        if self._remaining is not None:
            self._remaining -= len(data)
        return len(data)


class GunicornBody:
    """A gunicorn request body of known length, received straight into the caller's buffer.

    What gunicorn read ahead while parsing the headers comes first. The count of body bytes
    not yet read stays in gunicorn's own reader, so whatever the app leaves unread (after
    an early 413, say) is still skipped before the next request on a keep-alive connection,
    and a pipelined request that arrived with the headers stays where gunicorn looks for it.
    """

    def __init__(self, body: Body, sock: socket.socket) -> None:
        self._reader: LengthReader = body.reader
        self._sock = sock
        unreader = self._reader.unreader
        ahead = unreader.take_buffered()
        mine = ahead[: self._reader.length]
        if len(ahead) > len(mine):
            unreader.unread(ahead[len(mine) :])
        self._reader.length -= len(mine)  # from now on: what is still in the socket
        self._ahead = memoryview(mine)

    def readinto(self, buffer: memoryview) -> int:
        if self._ahead:
            count = min(len(buffer), len(self._ahead))
            buffer[:count] = self._ahead[:count]
            self._ahead = self._ahead[count:]
            return count
        wanted = min(len(buffer), self._reader.length)
        if wanted == 0:
            return 0
        try:
            count = self._sock.recv_into(buffer[:wanted])
        except TimeoutError as error:  # the server's idle timeout or minimum body rate
            raise timed_out(error) from error
        if count == 0:
            raise MalformedUpload(CUT_OFF)
        self._reader.length -= count
        return count


def request_body(environ: dict, length: int) -> RequestBody:
    """The fastest reader for a body of `length` bytes.

    gunicorn's own reader is bypassed only while nothing has read from it yet, so the bytes
    it counts and the bytes it holds stay in step.
    """
    wsgi_input = environ["wsgi.input"]
    sock = environ.get("gunicorn.socket")
    if (
        sock is not None
        and isinstance(wsgi_input, Body)
        and isinstance(wsgi_input.reader, LengthReader)
        and wsgi_input.reader.length == length
        and not wsgi_input.buf.tell()
    ):
        return GunicornBody(wsgi_input, sock)
    return WsgiBody(wsgi_input, length)
