"""A small clamd client over the standard library's sockets (gevent-safe: blocking calls
run on native threads, never on the event loop).

One connection per command, with the `z` (NUL-terminated) form of each command. INSTREAM
takes the file as length-prefixed chunks while it arrives, so the scan needs no second pass
over the bytes; clamd answers once the zero-length chunk that ends the stream has arrived.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from deerflow_web.concurrency import off_loop
from deerflow_web.concurrency import on_event_loop
from deerflow_web.concurrency import start_beside

REPLY_LIMIT = 64 * 1024
_END_OF_STREAM = struct.pack(">I", 0)


class ClamdError(Exception):
    """clamd could not be reached, timed out, or answered with an error."""


class StreamTooLarge(ClamdError):
    """The stream went over clamd's `StreamMaxLength`: the file was not scanned."""


@dataclass(frozen=True)
class ClamdAddress:
    """Where clamd listens: a unix socket path, or a TCP host and port."""

    path: str | None = None
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, value: str) -> ClamdAddress:
        """`/run/clamav/clamd.ctl`, `unix:/path`, `host:port` or `tcp://host:port`.

        Raises:
            ValueError: Neither a path nor a host with a port.
        """
        text = value.strip()
        if text.startswith("unix:"):
            text = text.removeprefix("unix:").removeprefix("//")
            return cls(path=text)
        if text.startswith("/"):
            return cls(path=text)
        text = text.removeprefix("tcp://")
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r} is neither a socket path nor host:port")
        return cls(host=host.strip("[]"), port=int(port))

    def __str__(self) -> str:
        return self.path if self.path is not None else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class StreamReply:
    """clamd's answer to one stream: `found` names the signature, None when clean."""

    found: str | None


def _socket_class() -> type[socket.socket]:
    """The standard library's own socket, even where gevent has patched the module.

    A stream's chunks are sent from a native thread (`Beside`), where a gevent socket
    cannot be used; the waits on the event loop's side go through `off_loop`.
    """
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("socket"):
        return monkey.get_original("socket", "socket")
    return socket.socket


class Beside:
    """At most one chunk in flight to clamd, sent on a native thread while the upload reads
    and writes the next one (gevent's thread pool under `make run`, a small pool of threads
    otherwise)."""

    _pool: ThreadPoolExecutor | None = None
    _pool_lock = threading.Lock()

    @classmethod
    def start(cls, function: Callable[[], None]) -> Callable[[], None]:
        """Start `function`; return the wait for it."""
        if on_event_loop():
            return start_beside(function)
        with cls._pool_lock:
            if cls._pool is None:
                cls._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="clamd")
        return cls._pool.submit(function).result


class ClamdClient:
    """Commands to one clamd; every socket operation bounded by `timeout` seconds."""

    def __init__(self, address: ClamdAddress, timeout: float) -> None:
        self.address = address
        self.timeout = timeout

    def connect(self) -> socket.socket:
        """A connection to clamd.

        Raises:
            ClamdError: Refused, missing socket, or no answer within the timeout.
        """
        make = _socket_class()
        if self.address.path is not None:
            sock = make(socket.AF_UNIX, socket.SOCK_STREAM)
            target: object = self.address.path
        else:
            family = socket.AF_INET6 if ":" in (self.address.host or "") else socket.AF_INET
            sock = make(family, socket.SOCK_STREAM)
            target = (self.address.host, self.address.port)
        sock.settimeout(self.timeout)
        try:
            off_loop(sock.connect, target)
        except OSError as error:
            sock.close()
            raise ClamdError(f"cannot reach clamd at {self.address}: {error}") from error
        return sock

    def command(self, name: str) -> str:
        """Send a command without a payload (`PING`, `VERSION`, `RELOAD`); its reply."""
        sock = self.connect()
        try:
            return off_loop(_command, sock, name)
        except OSError as error:
            raise ClamdError(f"clamd at {self.address} failed on {name}: {error}") from error
        finally:
            sock.close()

    def ping(self) -> None:
        """Raise `ClamdError` unless clamd answers PONG."""
        reply = self.command("PING")
        if reply != "PONG":
            raise ClamdError(f"clamd answered {reply!r} to PING")

    def version(self) -> tuple[str, str]:
        """The engine and the signature database version (`ClamAV 1.4.6/27500/...`).

        Without a versioned database (only .hdb/.ndb files), the engine stands for both.
        """
        reply = self.command("VERSION")
        engine, _, rest = reply.partition("/")
        signatures = rest.partition("/")[0]
        return engine, signatures or engine

    def instream(self) -> InstreamScan:
        """Start scanning a stream; feed it, then `finish` for the verdict."""
        sock = self.connect()
        try:
            off_loop(sock.sendall, b"zINSTREAM\0")
        except OSError as error:
            sock.close()
            raise ClamdError(f"clamd at {self.address} failed on INSTREAM: {error}") from error
        return InstreamScan(sock, str(self.address))


class InstreamScan:
    """One INSTREAM command in progress.

    Each chunk is sent on a native thread (`Beside`) while the upload reads and writes the
    next one; one chunk at most is in flight, so chunks arrive in order. `send` never
    raises: a failure is kept and reported by `finish`, so an upload goes on reading its
    body (and its limits apply) whatever the scanner does; clamd's own reply, when it cut
    the stream short (over `StreamMaxLength`), is read then.
    """

    def __init__(self, sock: socket.socket, address: str) -> None:
        self._sock: socket.socket | None = sock
        self._address = address
        self._failure: OSError | None = None
        self._in_flight: Callable[[], None] | None = None
        self.sent = 0

    def send(self, data: bytes | memoryview) -> None:
        """Send one chunk to clamd (an empty chunk is skipped: it would end the stream).

        The caller may reuse its buffer at once: anything but `bytes` is copied.
        """
        self._wait()
        sock = self._sock
        if sock is None or self._failure is not None or not len(data):
            return
        chunk = data if isinstance(data, bytes) else bytes(data)

        def send_chunk() -> None:
            try:
                sock.sendall(struct.pack(">I", len(chunk)))
                sock.sendall(chunk)
                self.sent += len(chunk)
            except OSError as error:
                self._failure = error  # clamd may have answered already: `finish` reads it

        self._in_flight = Beside.start(send_chunk)

    def _wait(self) -> None:
        waiting, self._in_flight = self._in_flight, None
        if waiting is not None:
            waiting()

    def finish(self) -> StreamReply:
        """End the stream and wait for clamd's verdict.

        Raises:
            StreamTooLarge: Over clamd's `StreamMaxLength`.
            ClamdError: A lost connection, a timeout, or any other error reply.
        """
        self._wait()
        sock = self._sock
        if sock is None:
            raise ClamdError("the scan was already finished")
        try:
            try:
                reply = off_loop(_end_and_read, sock, self._failure is None)
            except OSError as error:
                raise ClamdError(
                    f"clamd at {self._address} failed: {self._failure or error}"
                ) from error
        finally:
            self.close()
        return parse_stream_reply(reply)

    def close(self) -> None:
        """Drop the connection (an abandoned upload); safe to call twice."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # a chunk still in flight fails now
            except OSError:
                pass
            self._wait()
            sock.close()


def _command(sock: socket.socket, name: str) -> str:
    sock.sendall(b"z" + name.encode("ascii") + b"\0")
    return _read_reply(sock)


def _end_and_read(sock: socket.socket, send_end: bool) -> str:
    """Send the end of the stream (unless sending already failed), then read the reply."""
    if send_end:
        try:
            sock.sendall(_END_OF_STREAM)
        except OSError:
            pass  # clamd cut the stream short: its reply says why
    return _read_reply(sock)


def parse_stream_reply(reply: str) -> StreamReply:
    """`stream: OK`, `stream: <name> FOUND`, or an error (`... ERROR`).

    Raises:
        StreamTooLarge, ClamdError: As `InstreamScan.finish`.
    """
    if reply.endswith("ERROR"):
        if "size limit exceeded" in reply:
            raise StreamTooLarge(reply.removesuffix("ERROR").strip())
        raise ClamdError(f"clamd answered {reply!r}")
    body = reply.removeprefix("stream:").strip()
    if body == "OK":
        return StreamReply(None)
    if body.endswith(" FOUND"):
        return StreamReply(body.removesuffix(" FOUND").strip() or "unknown")
    raise ClamdError(f"clamd answered {reply!r}")


def _read_reply(sock: socket.socket) -> str:
    """Read up to clamd's NUL terminator (or the end of the connection)."""
    data = bytearray()
    while b"\0" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            if not data:
                raise ConnectionResetError("clamd closed the connection without an answer")
            break
        data += chunk
        if len(data) > REPLY_LIMIT:
            raise ConnectionError("clamd's answer is too long")
    return bytes(data).split(b"\0", 1)[0].decode("utf-8", "replace").strip()
