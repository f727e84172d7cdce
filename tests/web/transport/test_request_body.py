"""Reading an upload's body: straight from gunicorn's socket, or through wsgi.input.

gunicorn's own reader objects are used as gunicorn builds them for a request with a
Content-Length; a socket pair stands in for the client's connection.
"""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Iterator

import pytest
from gunicorn.http.body import Body
from gunicorn.http.body import ChunkedReader
from gunicorn.http.body import LengthReader
from gunicorn.http.unreader import SocketUnreader

from deerflow_web.errors import MalformedUpload
from deerflow_web.web.transport.request_body import GunicornBody
from deerflow_web.web.transport.request_body import WsgiBody
from deerflow_web.web.transport.request_body import request_body

BODY = os.urandom(50_000)
NEXT_REQUEST = b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    server, client = socket.socketpair()
    server.settimeout(5)
    with server, client:
        yield server, client


def gunicorn_environ(server: socket.socket, read_ahead: bytes, length: int) -> dict:
    """The environ gunicorn gives the app once it has read `read_ahead` past the headers."""
    unreader = SocketUnreader(server)
    unreader.unread(read_ahead)
    return {"wsgi.input": Body(LengthReader(unreader, length)), "gunicorn.socket": server}


def read_all(body, size: int = 4096) -> bytes:
    buffer = memoryview(bytearray(size))
    out = bytearray()
    while count := body.readinto(buffer):
        out += buffer[:count]
    return bytes(out)


def test_read_ahead_then_socket_gives_the_whole_body(connection) -> None:
    server, client = connection
    client.sendall(BODY[5000:] + NEXT_REQUEST)
    environ = gunicorn_environ(server, BODY[:5000], len(BODY))
    body = request_body(environ, len(BODY))
    assert isinstance(body, GunicornBody)
    assert read_all(body) == BODY
    assert body.readinto(memoryview(bytearray(10))) == 0
    assert environ["wsgi.input"].read(1024) == b""  # gunicorn has nothing left to skip
    assert server.recv(1024) == NEXT_REQUEST  # and the next request was not touched


def test_pipelined_request_in_the_read_ahead_stays_with_gunicorn(connection) -> None:
    server, _ = connection
    environ = gunicorn_environ(server, BODY + NEXT_REQUEST, len(BODY))
    assert read_all(request_body(environ, len(BODY))) == BODY
    assert environ["wsgi.input"].read(1024) == b""
    assert environ["wsgi.input"].reader.unreader.read() == NEXT_REQUEST


def test_what_the_app_leaves_unread_is_what_gunicorn_skips(connection) -> None:
    """After an early error response gunicorn drains exactly the rest of the body."""
    server, client = connection
    client.sendall(BODY[3000:] + NEXT_REQUEST)
    environ = gunicorn_environ(server, BODY[:3000], len(BODY))
    body = request_body(environ, len(BODY))
    buffer = memoryview(bytearray(8000))
    first = bytes(buffer[: body.readinto(buffer)])
    second = bytes(buffer[: body.readinto(buffer)])
    assert first + second == BODY[: len(first) + len(second)]
    drained = b"".join(iter(lambda: environ["wsgi.input"].read(1024), b""))
    assert first + second + drained == BODY
    assert server.recv(1024) == NEXT_REQUEST


def test_a_client_gone_before_the_end_is_a_malformed_upload(connection) -> None:
    server, client = connection
    client.sendall(BODY[1000:20_000])
    client.shutdown(socket.SHUT_WR)
    body = request_body(gunicorn_environ(server, BODY[:1000], len(BODY)), len(BODY))
    with pytest.raises(MalformedUpload, match="cut off"):
        read_all(body)


def test_a_body_gunicorn_already_read_from_stays_with_gunicorn(connection) -> None:
    server, client = connection
    client.sendall(BODY[5000:])
    environ = gunicorn_environ(server, BODY[:5000], len(BODY))
    start = environ["wsgi.input"].read(100)  # gunicorn now holds bytes read past these
    body = request_body(environ, len(BODY) - len(start))
    assert isinstance(body, WsgiBody)
    assert start + read_all(body) == BODY


def test_chunked_and_foreign_inputs_go_through_wsgi_input(connection) -> None:
    server, _ = connection
    chunked = {"wsgi.input": Body(ChunkedReader(None, SocketUnreader(server)))}
    assert isinstance(request_body({**chunked, "gunicorn.socket": server}, 10), WsgiBody)
    plain = request_body({"wsgi.input": io.BytesIO(BODY + b"trailing")}, len(BODY))
    assert isinstance(plain, WsgiBody)
    assert read_all(plain, 7777) == BODY  # stops at Content-Length


def test_wsgi_input_that_ends_early_is_a_malformed_upload() -> None:
    body = WsgiBody(io.BytesIO(BODY[:100]), len(BODY))
    with pytest.raises(MalformedUpload, match="cut off"):
        read_all(body)


def test_a_chunked_body_ends_where_its_stream_ends() -> None:
    assert read_all(WsgiBody(io.BytesIO(BODY), None)) == BODY
