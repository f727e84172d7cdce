"""The gunicorn worker `make run` uses: gevent, with an idle timeout and a cooperative sendfile.

Slow clients are the common case for a shared service (home and mobile uplinks): with a
thread per connection, sixteen uploads at 100 KB/s occupied every thread of gunicorn's
gthread worker and everybody else queued behind them. A gevent worker holds a connection
in a greenlet of a few kilobytes, so hundreds of slow uploads and downloads cost memory,
not threads. gunicorn's stock gevent worker gives up two things this app relies on, and
this subclass puts them back:

- **sendfile.** gevent's sockets refuse `os.sendfile` (it would block the whole process on
  a full socket buffer) and copy downloads through Python in 8 KiB pieces, at less than
  half the speed. `_SendfileSocket` calls `os.sendfile` on the non-blocking socket and
  waits for it to drain through gevent's loop, so a download is copied by the kernel and
  a reader that stops reading only parks its own greenlet. For a reader that drains its
  buffer at once, waiting until the kernel reports room (a third of the buffer free) let
  the buffer run low between refills: it made 40% more reads and got 0.90x gthread's
  speed. Such a reader's download retries after each turn of the loop instead, as a
  blocking sendfile would, and waits again once the reader falls behind.
- **an idle timeout.** Every connection gets `server.idle_timeout_seconds` as its socket
  timeout: an upload that stops sending, a download nobody reads and a request whose
  headers never end are all dropped once nothing moved for that long. (Headers also stay
  under gunicorn's `--keep-alive` limit, which applies to the first request as well.)
- **a minimum body rate** (`server.min_body_rate_*`, as nginx's `client_body_timeout` and
  Apache's `mod_reqtimeout` bound what the idle timeout cannot: a body sent a byte every
  few seconds is never silent). `_Pace` watches each request's body: after a grace period
  it must have brought `min_body_rate_bytes` per second over the last window, else the
  read raises `BodyTooSlow`, the app answers 408 and the connection is closed. The routes
  reached before signing in (views marked `public`: sign-in, setup, registration) get
  a deadline for headers and body together and a small body (`server.unauthenticated_*`):
  a larger one is refused with 413 before a byte of it is read.
- **a cap per client address** (`server.max_connections_per_address`): one address may
  hold that many of a worker's connections; the next is answered 429 and closed at once,
  so one client cannot fill the worker's pool. Behind `server.trusted_proxies` every
  connection comes from a proxy, so the cap counts the requests of each forwarded client
  instead.
- **prompt accepts.** gunicorn accepts one connection per turn of the loop when several
  workers share the socket; `_AcceptingServer` takes a batch once the loop is busy, so a
  new client does not queue behind a burst of slow ones.

The app itself never imports gevent; `deerflow_web.concurrency` finds out at run time
whether it runs in greenlets and moves CPU-bound work off the event loop then.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from urllib.parse import unquote

import gevent
from gevent import socket as gevent_socket
from gevent.server import StreamServer
from gunicorn.errors import AppImportError
from gunicorn.http.body import ChunkedReader
from gunicorn.workers import ggevent
from gunicorn.workers.ggevent import GeventWorker
from werkzeug.exceptions import HTTPException
from werkzeug.routing import MapAdapter

from deerflow_web.settings import ConnectionLimits
from deerflow_web.settings import Settings
from deerflow_web.web.transport.request_body import BodyTooSlow

logger = logging.getLogger(__name__)

SENDFILE_MAX = 16 * 1024 * 1024  # per call: the kernel stops at a full socket buffer anyway
# A reader that frees room this soon after its buffer filled reads at local speed (one at
# 100 KB/s takes seconds); its download retries for this many turns of the loop before it
# waits for room again.
FAST_DRAIN_SECONDS = 0.005
EAGER_TURNS = 64
ACCEPT_BATCH = 64  # connections taken from the listen queue per turn of a busy loop
BUSY_CONNECTIONS = 32  # from this many open connections on, a worker's loop counts as busy
PACE_SLOTS = 10  # the rate window is kept as this many slots of bytes received
REFUSAL_DRAIN_SECONDS = 1.0  # a refused client's request is read (and dropped) this long
REFUSAL_LOG_SECONDS = 60.0  # refusals of one address are logged once per this period
COALESCE_MAX = 64 * 1024  # a first body piece up to this size goes out with the headers
_CONTENT_LENGTH = b"\r\ncontent-length:"


class _Pace:
    """How fast the body of a connection's current request arrives; cuts it when too slow.

    The window is kept as `PACE_SLOTS` slots of received bytes, so a fast upload's
    thousands of reads cost one addition each. While a body is being read, every wait for
    data is cut into steps of one slot, so a client that sends nothing (or a byte now and
    then) is caught within a slot of falling below the rate, not at the idle timeout.
    """

    __slots__ = (
        "_limits",
        "_idle_timeout",
        "_slot_seconds",
        "_slots",
        "_slot_number",
        "_started",
        "_deadline",
        "_label",
        "_request",
        "received",
        "request_began",
        "watching",
    )

    def __init__(self, limits: ConnectionLimits, idle_timeout: float) -> None:
        self._limits = limits
        self._idle_timeout = idle_timeout
        self._slot_seconds = limits.min_body_rate_window_seconds / PACE_SLOTS
        self._slots = [0] * PACE_SLOTS
        self._slot_number = 0
        self._started = 0.0
        self._deadline: float | None = None
        self._label = ""
        self._request: object = None
        self.received = 0
        self.request_began: float | None = None  # first byte of the request's headers
        self.watching = False

    def begin(self, request: object, label: str, deadline_seconds: float | None) -> None:
        """Watch the body of `request` from now on (its headers have been read)."""
        now = time.monotonic()
        self._slots = [0] * PACE_SLOTS
        self._slot_number = 0
        self._started = now
        began = self.request_began if self.request_began is not None else now
        self._deadline = None if deadline_seconds is None else began + deadline_seconds
        self._label = label
        self._request = request
        self.received = 0
        self.watching = self._deadline is not None or self._limits.min_body_rate_bytes > 0

    def end(self) -> None:
        """The request is answered; the next one's headers are gunicorn's to time."""
        self.watching = False
        self.request_began = None
        self._request = None

    def receive(self, sock: gevent_socket.socket, read, args: tuple):  # noqa: ANN001, ANN201
        """`read(*args)` on `sock`, waiting at most a slot at a time and checking the pace."""
        idle_until = time.monotonic() + self._idle_timeout
        try:
            while True:
                now = time.monotonic()
                step = min(idle_until - now, self._slot_seconds)
                if self._deadline is not None:
                    step = min(step, self._deadline - now)
                sock.settimeout(max(step, 0.001))
                try:
                    result = read(*args)
                except TimeoutError:
                    now = time.monotonic()
                    self.check(now)
                    if now >= idle_until:
                        raise
                    continue
                now = time.monotonic()
                self.record(now, result if isinstance(result, int) else len(result))
                self.check(now)
                return result
        finally:
            sock.settimeout(self._idle_timeout)

    def record(self, now: float, count: int) -> None:
        self._advance(now)
        self._slots[self._slot_number % PACE_SLOTS] += count
        self.received += count

    def _advance(self, now: float) -> None:
        """Empty the slots that left the window since the last read."""
        number = int((now - self._started) / self._slot_seconds)
        for passed in range(self._slot_number + 1, min(number, self._slot_number + PACE_SLOTS) + 1):
            self._slots[passed % PACE_SLOTS] = 0
        self._slot_number = max(number, self._slot_number)

    def check(self, now: float) -> None:
        """Raise `BodyTooSlow` when the deadline passed or the window's rate is too low."""
        elapsed = now - self._started
        if self._deadline is not None and now >= self._deadline:
            self._cut(
                f"The request took longer than {self._limits.unauthenticated_request_seconds:g} s"
                "; it was dropped",
                elapsed,
            )
        rate = self._limits.min_body_rate_bytes
        if not rate or elapsed < self._limits.min_body_rate_grace_seconds:
            return
        self._advance(now)
        # The window: the slots still in it, the current one only as far as it has run.
        span = min(elapsed, (PACE_SLOTS - 1) * self._slot_seconds + elapsed % self._slot_seconds)
        if sum(self._slots) < rate * span:
            self._cut(
                f"The request body arrived slower than {rate} bytes per second; it was dropped",
                elapsed,
            )

    def _cut(self, message: str, elapsed: float) -> None:
        logger.warning(
            "cut %s: %d bytes in %.1f s: %s", self._label, self.received, elapsed, message
        )
        if self._request is not None:
            self._request.must_close = True  # type: ignore[attr-defined]  # no keep-alive after it
        self.watching = False
        raise BodyTooSlow(message)


# The pace of each open connection of this worker process, by its socket.
_PACES: dict[gevent_socket.socket, _Pace] = {}
# Responses whose header block is still to come (`Worker.handle_request`), and the header
# blocks kept for the first piece of their body (`_SendfileSocket.sendall`).
_HOLDING: set[gevent_socket.socket] = set()
_HELD: dict[gevent_socket.socket, bytes] = {}


class _SendfileSocket(gevent_socket.socket):
    """A gevent socket whose `sendfile` is the kernel's, waiting cooperatively when full,
    whose reads of a request body keep to the connection's `_Pace`, and whose response
    header block leaves with the first piece of the body.

    gunicorn sends a response's headers and then its body, two sends: a small answer
    (an upload's JSON, a list) then reaches the client in two packets, and the client is
    woken for the headers alone, to wait again for the body. On a busy machine that
    second turn was a tenth of a small upload's time in the server. So the header block
    of a response with a Content-Length is held (never longer than until its first body
    piece, its file, or its end) and goes out in the same send as the body when that
    piece is small. A streamed response's headers go at once, as before.
    """

    __slots__ = ()

    def sendall(self, data, flags=0):  # noqa: ANN001, ANN201
        if self in _HOLDING:  # the response's header block
            _HOLDING.discard(self)
            head = bytes(data)
            if _CONTENT_LENGTH in head.lower():  # a body of known length: it follows now
                _HELD[self] = head
                return None
            data = head  # a stream (chunked, a zip): its headers must not wait for it
        held = _HELD.pop(self, None)
        if held is not None:
            if len(data) <= COALESCE_MAX:
                data = held + bytes(data)
            else:
                super().sendall(held, flags)
        return super().sendall(data, flags)

    def send_held(self) -> None:
        """Send a held header block now (a response without a body, or one ending)."""
        _HOLDING.discard(self)
        held = _HELD.pop(self, None)
        if held is not None:
            super().sendall(held)

    def recv(self, *args):  # noqa: ANN002, ANN201
        pace = _PACES.get(self)
        if pace is not None and pace.watching:
            return pace.receive(self, super().recv, args)
        data = super().recv(*args)
        if pace is not None and pace.request_began is None and data:
            pace.request_began = time.monotonic()
        return data

    def recv_into(self, *args):  # noqa: ANN002, ANN201
        pace = _PACES.get(self)
        if pace is not None and pace.watching:
            return pace.receive(self, super().recv_into, args)
        return super().recv_into(*args)

    def sendfile(self, file, offset=0, count=None):  # noqa: ANN001, ANN201
        """Send `count` bytes of `file` from `offset` (to its end if None); return the count."""
        self._check_sendfile_params(file, offset, count)
        self.send_held()
        sock_fd = self.fileno()
        file_fd = file.fileno()
        sent = 0
        eager = False  # the reader drains at local speed: retry instead of waiting for room
        turns = 0
        try:
            while count is None or sent < count:
                wanted = SENDFILE_MAX if count is None else min(count - sent, SENDFILE_MAX)
                try:
                    done = os.sendfile(sock_fd, file_fd, offset + sent, wanted)
                except BlockingIOError:
                    if eager and turns < EAGER_TURNS:
                        turns += 1
                        gevent.sleep(0)  # one turn of the loop, then try again
                        continue
                    started = time.monotonic()
                    self._wait(self._write_event)  # raises TimeoutError after the idle timeout
                    eager = time.monotonic() - started < FAST_DRAIN_SECONDS
                    turns = 0
                    continue
                turns = 0
                if done == 0:
                    break  # end of file
                sent += done
            return sent
        finally:
            if sent:
                file.seek(offset + sent)


class _AcceptingServer(StreamServer):
    """gevent's server, accepting a batch of waiting connections per turn of a busy loop.

    gunicorn sets `max_accept = 1` when there are several workers, to spread connections
    between them. With hundreds of busy connections one turn of the loop takes tens of
    milliseconds, so one accept per turn left new clients (a fast list request among them)
    in the listen queue for seconds behind a burst of slow uploads. A quiet loop still
    takes one per turn: a batch there let the first worker to wake take a whole burst of
    eight fast uploads (CPU 16:5 between the workers), leaving a core idle.
    """

    @property
    def max_accept(self) -> int:
        busy = self.pool is not None and len(self.pool) >= BUSY_CONNECTIONS
        return ACCEPT_BATCH if busy else 1

    @max_accept.setter
    def max_accept(self, value: int) -> None:
        pass  # see the class docstring


class Worker(GeventWorker):
    """gunicorn's gevent worker with kernel sendfile, an idle timeout, a minimum body rate
    and a cap of connections per client address."""

    idle_timeout: float = Settings.idle_timeout_seconds
    limits: ConnectionLimits = ConnectionLimits()
    trusted_proxies: int = 0
    _routes: MapAdapter | None = None

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._open_by_address: Counter[str] = Counter()
        self._refusals_logged: dict[str, float] = {}
        self._public_endpoints: frozenset[str] = frozenset()

    def load_wsgi(self) -> None:
        try:
            super().load_wsgi()
        except SystemExit as stop:
            if not isinstance(stop.code, str):
                raise
            # app.py's one-line refusal of a configuration that cannot work (a database
            # that refuses its user, say). As a plain exit the arbiter would boot worker
            # after worker; as a load error it prints the line and stops the server.
            raise AppImportError(stop.code) from None
        settings = getattr(self.wsgi, "config", {}).get("DEERFLOW_SETTINGS")
        if isinstance(settings, Settings):
            self.idle_timeout = settings.idle_timeout_seconds
            self.limits = settings.connections
            self.trusted_proxies = settings.trusted_proxies
        url_map = getattr(self.wsgi, "url_map", None)
        self._routes = url_map.bind("localhost") if url_map is not None else None
        self._public_endpoints = _public_endpoints(self.wsgi)

    def run(self) -> None:
        ggevent.StreamServer = _AcceptingServer  # the name GeventWorker.run builds servers from
        super().run()

    def handle(self, listener, client, addr) -> None:  # noqa: ANN001
        client.__class__ = _SendfileSocket
        client.settimeout(self.idle_timeout)
        address = None
        if not self.trusted_proxies and self.limits.max_connections_per_address:
            address = _peer_address(addr)
            if self._open_by_address[address] >= self.limits.max_connections_per_address:
                self._refuse_connection(client, address)
                return
            self._open_by_address[address] += 1
        _PACES[client] = _Pace(self.limits, self.idle_timeout)
        try:
            # GeventWorker.handle would make the socket blocking again: skip to its parent.
            super(GeventWorker, self).handle(listener, client, addr)
        finally:
            _PACES.pop(client, None)
            if address is not None:
                self._release(address)

    def handle_request(self, listener_name, req, sock, addr) -> bool:  # noqa: ANN001
        """Serve one request, its body under the connection's pace (see the module docstring)."""
        public = self._reached_before_sign_in(req)
        if public and (refusal := self._oversized(req)) is not None:
            logger.warning("refused %s %s from %s: %s", req.method, req.path, addr, refusal[1])
            _send_refusal(sock, *refusal, api=req.path.startswith("/api/"))
            raise StopIteration()  # the body is never read: close the connection
        client = None
        if self.trusted_proxies and self.limits.max_connections_per_address:
            client = self._forwarded_client(req, addr)
            if self._open_by_address[client] >= self.limits.max_connections_per_address:
                self._log_refusal(client)
                _send_refusal(sock, *self._too_many(), api=req.path.startswith("/api/"))
                raise StopIteration()
            self._open_by_address[client] += 1
        pace = _PACES.get(sock)
        if pace is not None:
            deadline = self.limits.unauthenticated_request_seconds if public else None
            pace.begin(req, f"{req.method} {req.path} from {_peer_address(addr)}", deadline)
        if isinstance(sock, _SendfileSocket):
            _HOLDING.add(sock)  # the header block waits for the body (see _SendfileSocket)
        try:
            return super().handle_request(listener_name, req, sock, addr)
        finally:
            if isinstance(sock, _SendfileSocket):
                sock.send_held()
            if pace is not None:
                pace.end()
            if client is not None:
                self._release(client)

    def _reached_before_sign_in(self, req) -> bool:  # noqa: ANN001
        """Whether the request goes to a route that reads its body before anyone signs in."""
        if self._routes is None:
            return False
        try:
            endpoint, _arguments = self._routes.match(unquote(req.path or "/"), method=req.method)
        except HTTPException:  # no such route, another method, a redirect: nothing is read
            return False
        return endpoint in self._public_endpoints

    def _oversized(self, req) -> tuple[int, str, str] | None:  # noqa: ANN001
        """The refusal of a public route's body that is larger than it may be (or unsized)."""
        limit = self.limits.unauthenticated_max_body_bytes
        reader = getattr(req.body, "reader", None)
        length = getattr(reader, "length", None)
        if isinstance(reader, ChunkedReader):
            return 411, "Length Required", "This route needs a Content-Length"
        if length is not None and length > limit:
            return 413, "Content Too Large", f"Request body too large: at most {limit} bytes here"
        return None

    def _too_many(self) -> tuple[int, str, str]:
        cap = self.limits.max_connections_per_address
        return 429, "Too Many Requests", f"Too many connections from one address: at most {cap}"

    def _forwarded_client(self, req, addr) -> str:  # noqa: ANN001
        """The client the trusted proxies name (as ProxyFix reads X-Forwarded-For)."""
        values = [
            item.strip()
            for name, value in req.headers
            if name == "X-FORWARDED-FOR"
            for item in value.split(",")
        ]
        if len(values) >= self.trusted_proxies:
            return values[-self.trusted_proxies]
        return _peer_address(addr)

    def _refuse_connection(self, client: gevent_socket.socket, address: str) -> None:
        self._log_refusal(address)
        try:
            _send_refusal(client, *self._too_many(), api=True)
        except OSError:
            pass
        finally:
            client.close()

    def _log_refusal(self, address: str) -> None:
        now = time.monotonic()
        if now - self._refusals_logged.get(address, -REFUSAL_LOG_SECONDS) >= REFUSAL_LOG_SECONDS:
            self._refusals_logged[address] = now
            logger.warning(
                "refused connections from %s: it holds %d, at most %d (logged once a minute)",
                address,
                self._open_by_address[address],
                self.limits.max_connections_per_address,
            )

    def _release(self, address: str) -> None:
        self._open_by_address[address] -= 1
        if self._open_by_address[address] <= 0:
            del self._open_by_address[address]


def _public_endpoints(app: object) -> frozenset[str]:
    """The endpoints of the app's views marked `public` (web/marks.py), once it is loaded."""
    view_functions = getattr(app, "view_functions", None)
    if view_functions is None:
        return frozenset()
    from deerflow_web.web.marks import PUBLIC  # imports Flask: only once the app is loaded
    from deerflow_web.web.marks import endpoint_has

    return frozenset(endpoint for endpoint in view_functions if endpoint_has(app, endpoint, PUBLIC))


def _peer_address(addr: object) -> str:
    """The client's IP address (a Unix socket's peer has none: one shared name)."""
    if isinstance(addr, tuple) and addr:
        return str(addr[0])
    return "unix"


def _send_refusal(
    sock: gevent_socket.socket, status: int, reason: str, detail: str, *, api: bool
) -> None:
    """Answer before the request is read, then read (and drop) what the client sends for a
    moment, so its request arriving does not reset the connection before the answer is read."""
    body = json.dumps({"detail": detail}).encode() if api else detail.encode() + b"\n"
    kind = "application/json" if api else "text/plain; charset=utf-8"
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
        + ("Retry-After: 5\r\n" if status == 429 else "")
        + "Connection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    try:
        sock.shutdown(gevent_socket.SHUT_WR)
        sock.settimeout(REFUSAL_DRAIN_SECONDS)
        deadline = time.monotonic() + REFUSAL_DRAIN_SECONDS
        while time.monotonic() < deadline and sock.recv(65536):
            pass
    except OSError:
        pass
