"""CPU-bound work that must not stop other connections, whichever server runs the app.

Under `make run` every connection of a worker process is a greenlet on one event loop
(`web/server.py`): a greenlet that computes for a second holds up every other connection
of its process for that second. `off_loop` runs such work (a model-written regex over
200 MB, Markdown rendering, hashing a large file found on disk) in gevent's pool of real
threads, where the interpreter's thread switching shares the CPU with the loop; `pause`
lets a long transfer step aside between chunks. Under threads (the test client, any other
WSGI server) both do nothing special. Plain Python: usable from every layer, and gevent is
only looked at when the process has already loaded and patched it.
"""

from __future__ import annotations

import contextvars
import sys
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


def off_loop(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call `function` where it does not freeze the event loop; return or raise as it does.

    The caller's context variables (Flask's request and app context among them) go
    along, so the function may read them as if it ran in place.
    """
    hub = _gevent_hub()
    if hub is None:
        return function(*args, **kwargs)
    context = contextvars.copy_context()
    return hub.threadpool.apply(context.run, (function, *args), kwargs)


def start_off_loop(function: Callable[..., T], /, *args: Any) -> Callable[[], T]:
    """Start `function` like `off_loop` without waiting; return what waits for its result.

    Lets a greenlet overlap its own work: read the next chunk of a body while the thread
    hashes and writes the previous one. Under threads the function has run by the time
    this returns (an error is raised here, not by the waiter).
    """
    hub = _gevent_hub()
    if hub is None:
        value = function(*args)
        return lambda: value
    context = contextvars.copy_context()
    return hub.threadpool.spawn(context.run, function, *args).get


def pause() -> None:
    """Let other greenlets run (a no-op under threads, which the interpreter switches)."""
    if on_event_loop():
        import gevent

        gevent.sleep(0)
