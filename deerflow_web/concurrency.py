"""CPU-bound work that must not stop other connections, whichever server runs the app.

Under `make run` every connection of a worker process is a greenlet on one event loop
(`web/transport/server.py`): a greenlet that computes for a second holds up every other connection
of its process for that second. `off_loop` runs such work (a model-written regex over
200 MB, Markdown rendering, hashing a large file found on disk) in gevent's pool of real
threads, where the interpreter's thread switching shares the CPU with the loop; a `Turn`
lets a long transfer step aside between chunks; `start_beside` lets a lone large upload
hash on the core the loop leaves idle. Under threads (the test client, any other WSGI
server) all three do nothing special. Plain Python: usable from every layer, and gevent is
only looked at when the process has already loaded and patched it.
"""

from __future__ import annotations

import contextvars
import sys
import time
from collections.abc import Callable
from typing import Any
from typing import TypeVar

T = TypeVar("T")


def _gevent_hub() -> Any | None:
    """gevent's hub when threading is monkey-patched in this process, else None."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return None
    import gevent

    return gevent.get_hub()


def on_event_loop() -> bool:
    """Whether this process serves its connections as greenlets on gevent's loop."""
    return _gevent_hub() is not None


def _outcome(
    function: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[bool, Any]:
    """`(True, result)`, or `(False, the exception)` that `function` raised.

    gevent's pool prints every exception a task raises as a crash (a traceback in the
    server log for each "file not found" answered as a 404); carried back as a value, the
    exception is raised again in the caller, with its traceback, and only there.
    """
    try:
        return True, function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - raised again by `_unwrap`
        return False, error


def _unwrap(outcome: tuple[bool, Any]) -> Any:
    returned, value = outcome
    if returned:
        return value
    raise value


def off_loop(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call `function` where it does not freeze the event loop; return or raise as it does.

    The caller's context variables (Flask's request and app context among them) go
    along, so the function may read them as if it ran in place.
    """
    hub = _gevent_hub()
    if hub is None:
        return function(*args, **kwargs)
    context = contextvars.copy_context()
    return _unwrap(hub.threadpool.apply(context.run, (_outcome, function, args, kwargs)))


def start_beside(function: Callable[..., T], /, *args: Any) -> Callable[[], T]:
    """Start `function(*args)` on a native thread; return the wait for its result.

    For work that releases the interpreter lock (hashing a large buffer) and can overlap
    what the caller does next: the caller goes on and waits only when it needs the result.
    Off gevent's loop it runs now, and the wait returns at once.
    """
    hub = _gevent_hub()
    if hub is None:
        result = function(*args)
        return lambda: result
    pending = hub.threadpool.spawn(_outcome, function, args, {})
    return lambda: _unwrap(pending.get())


TURN_SECONDS = 0.005


class Turn:
    """A greenlet's fair share of the loop while it streams: it steps aside once it has
    held the loop for `seconds`.

    A fast client never makes a read wait, so its upload would otherwise hold the loop
    until the body ends. Stepping aside after every chunk cost 3% of a 1 GiB upload's
    speed (a turn of the loop per megabyte); once per 5 ms gives two thirds of that back,
    and a request arriving meanwhile waits at most those 5 ms for each such upload.
    Under threads `step_aside` does nothing: the interpreter switches them.
    """

    def __init__(self, seconds: float = TURN_SECONDS) -> None:
        self._seconds = seconds
        self._ends = time.monotonic() + seconds

    def step_aside(self) -> None:
        """Let other greenlets run if this one's turn is over."""
        now = time.monotonic()
        if now < self._ends:
            return
        if _gevent_hub() is not None:
            import gevent

            # Not `sleep(0)`: that lets only the greenlets already ready run, before the
            # loop polls for I/O, so a connection waiting on its socket would starve. Until
            # the loop is idle, or one more turn at most if others keep it busy.
            with gevent.Timeout(self._seconds, False):
                gevent.idle()
        self._ends = time.monotonic() + self._seconds
