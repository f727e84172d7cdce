"""The response's header block leaves with the first piece of its body: one send for a
small answer of known length, the headers at once for a stream, order kept for a large
body, and nothing held past the response. Unit tests on a socket pair, and one against
`make run`'s real server."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from gevent import socket as gevent_socket

from deerflow_web.web.transport import server
from deerflow_web.web.transport.server import _SendfileSocket
from tests.support.live_server import LiveServer

pytestmark = pytest.mark.same_in_both_modes  # nothing here reads the mode

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/zip\r\nTransfer-Encoding: chunked\r\n\r\n"
)


@pytest.fixture
def pair() -> Iterator[tuple[_SendfileSocket, socket.socket, list[bytes]]]:
    """A response socket (as the worker makes it), its peer, and every send it made."""
    ours, peer = gevent_socket.socketpair()
    ours.__class__ = _SendfileSocket
    sends: list[bytes] = []
    original = gevent_socket.socket.sendall

    def counted(self, data, flags=0):  # noqa: ANN001, ANN202
        sends.append(bytes(data))
        return original(self, data, flags)

    gevent_socket.socket.sendall = counted  # type: ignore[method-assign]
    try:
        yield ours, peer, sends
    finally:
        gevent_socket.socket.sendall = original  # type: ignore[method-assign]
        server._HOLDING.discard(ours)
        server._HELD.pop(ours, None)
        ours.close()
        peer.close()


def received(peer: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += peer.recv(65536)
    return data


def test_a_small_answer_goes_in_one_send(pair) -> None:
    ours, peer, sends = pair
    server._HOLDING.add(ours)
    ours.sendall(HEAD)
    assert sends == []  # held for the body
    ours.sendall(b'{"ok":true}')
    assert sends == [HEAD + b'{"ok":true}']
    ours.send_held()  # the response ends: nothing left to send
    assert len(sends) == 1
    assert received(peer, len(HEAD) + 11) == HEAD + b'{"ok":true}'


def test_a_streamed_answer_sends_its_headers_at_once(pair) -> None:
    ours, peer, sends = pair
    server._HOLDING.add(ours)
    ours.sendall(STREAM_HEAD)
    assert sends == [STREAM_HEAD]
    ours.sendall(b"5\r\nhello\r\n")
    assert sends == [STREAM_HEAD, b"5\r\nhello\r\n"]
    assert received(peer, len(STREAM_HEAD) + 10) == STREAM_HEAD + b"5\r\nhello\r\n"


def test_a_large_body_follows_its_headers_in_order(pair) -> None:
    ours, peer, sends = pair
    body = b"x" * (server.COALESCE_MAX + 1)
    head = HEAD.replace(b"11", str(len(body)).encode())
    server._HOLDING.add(ours)
    ours.sendall(head)
    ours.sendall(body)
    assert sends == [head, body]  # not copied into one buffer
    assert received(peer, len(head) + len(body)) == head + body


def test_a_response_without_a_body_sends_its_headers_when_it_ends(pair) -> None:
    ours, peer, sends = pair
    head = HEAD.replace(b"200 OK", b"204 No Content").replace(b"11", b"0")
    server._HOLDING.add(ours)
    ours.sendall(head)
    assert sends == []
    ours.send_held()
    assert sends == [head]
    assert received(peer, len(head)) == head
    assert ours not in server._HELD and ours not in server._HOLDING


def test_only_the_header_block_is_held(pair) -> None:
    """Outside a response (a refusal sent before it, the next request's 100 Continue)
    every send goes at once."""
    ours, peer, sends = pair
    ours.sendall(HEAD + b"01234567890")
    assert sends == [HEAD + b"01234567890"]
    ours.send_held()
    assert len(sends) == 1


def test_a_file_sent_by_the_kernel_follows_its_held_headers(pair, tmp_path: Path) -> None:
    ours, peer, sends = pair
    file = tmp_path / "f.bin"
    file.write_bytes(b"0123456789a")
    server._HOLDING.add(ours)
    ours.sendall(HEAD)
    with open(file, "rb") as handle:
        assert ours.sendfile(handle) == 11
    assert sends == [HEAD]
    assert received(peer, len(HEAD) + 11) == HEAD + b"0123456789a"


def test_under_gunicorn_a_small_answer_arrives_whole(base_dir: Path, tmp_path: Path) -> None:
    """The client's first read holds the whole answer, headers and body, for a list and
    an upload; a keep-alive connection's second answer too."""
    body = b"hello"
    part = (
        b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="a.txt"\r\n'
        b"Content-Type: text/plain\r\n\r\n" + body + b"\r\n--XYZ--\r\n"
    )
    upload = (
        b"POST /api/threads/T/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary=XYZ\r\n"
        b"Content-Length: " + str(len(part)).encode() + b"\r\n\r\n" + part
    )
    listing = b"GET /api/threads/T/uploads/list HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    server = LiveServer(base_dir, single_user=True)  # `make run`'s server, one worker
    with server.start():
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as client:
            for request in (upload, listing):
                client.sendall(request)
                first = client.recv(1 << 20)
                head, _, rest = first.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                assert head.startswith(b"HTTP/1.1 20"), first
                assert len(rest) == length, first  # the body came with the headers
                assert b'"a.txt"' in rest
