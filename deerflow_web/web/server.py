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
- **prompt accepts.** gunicorn accepts one connection per turn of the loop when several
  workers share the socket; `_AcceptingServer` takes a batch once the loop is busy, so a
  new client does not queue behind a burst of slow ones.

The app itself never imports gevent; `deerflow_web.concurrency` finds out at run time
whether it runs in greenlets and moves CPU-bound work off the event loop then.
"""

from __future__ import annotations

import os
import time

import gevent
from gevent import socket as gevent_socket
from gevent.server import StreamServer
from gunicorn.workers import ggevent
from gunicorn.workers.ggevent import GeventWorker

from deerflow_web.settings import Settings

SENDFILE_MAX = 16 * 1024 * 1024  # per call: the kernel stops at a full socket buffer anyway
# A reader that frees room this soon after its buffer filled reads at local speed (one at
# 100 KB/s takes seconds); its download retries for this many turns of the loop before it
# waits for room again.
FAST_DRAIN_SECONDS = 0.005
EAGER_TURNS = 64
ACCEPT_BATCH = 64  # connections taken from the listen queue per turn of a busy loop
BUSY_CONNECTIONS = 32  # from this many open connections on, a worker's loop counts as busy


class _SendfileSocket(gevent_socket.socket):
    """A gevent socket whose `sendfile` is the kernel's, waiting cooperatively when full."""

    __slots__ = ()

    def sendfile(self, file, offset=0, count=None):  # noqa: ANN001, ANN201
        """Send `count` bytes of `file` from `offset` (to its end if None); return the count."""
        self._check_sendfile_params(file, offset, count)
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
    """gunicorn's gevent worker with kernel sendfile and a per-connection idle timeout."""

    idle_timeout: float = Settings.idle_timeout_seconds

    def load_wsgi(self) -> None:
        super().load_wsgi()
        settings = getattr(self.wsgi, "config", {}).get("DEERFLOW_SETTINGS")
        if isinstance(settings, Settings):
            self.idle_timeout = settings.idle_timeout_seconds

    def run(self) -> None:
        ggevent.StreamServer = _AcceptingServer  # the name GeventWorker.run builds servers from
        super().run()

    def handle(self, listener, client, addr) -> None:  # noqa: ANN001
        client.__class__ = _SendfileSocket
        client.settimeout(self.idle_timeout)
        # GeventWorker.handle would make the socket blocking again: skip to its parent.
        super(GeventWorker, self).handle(listener, client, addr)
