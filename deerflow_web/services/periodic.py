"""The one background thread behind every periodic job: the rescans, the retention sweeps
and the sweeps of unfinished bucket uploads.

Each of those asks, every few minutes, whether its round is due (a database lease and a
"last run" time decide, so many instances run it about once between them). What they
share is the thread around that question: start it once, wait an interval before each
round, keep going when a round fails (an outage of the scanner or the bucket must not end
the schedule for the life of the process), and stop promptly at shutdown. That lives here
once, so a fix to it (a lost stop signal, a thread that dies on one error) is made once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Mapping

logger = logging.getLogger(__name__)

STOP_WAIT_SECONDS = 10.0  # how long `stop` waits for a round under way to end


class PeriodicJob:
    """Calls `work()` every `interval` seconds on a daemon thread named `name`.

    The first round comes one interval after `start` (`first_delay` to choose another
    wait): a process restarting in a loop does not run a round on every start, and the
    job's own "is it due" check, not the start-up, decides when work is done.

    A round that raises is logged and the schedule goes on: an exception of a type in
    `skips` as one warning line ("{what} skipped: {reason}"), the known outage of what
    the round needs; any other with its traceback ("{what} failed"). Both go to `log`,
    the job's own module logger, so a job's lines keep their logger name.
    """

    def __init__(
        self,
        name: str,
        interval: float,
        work: Callable[[], object],
        *,
        what: str | None = None,
        skips: Mapping[type[BaseException], str] | None = None,
        first_delay: float | None = None,
        log: logging.Logger = logger,
    ) -> None:
        self.name = name
        self.interval = interval
        self.work = work
        self.what = what or name
        self.skips = dict(skips or {})
        self.first_delay = interval if first_delay is None else first_delay
        self.log = log
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None

    @property
    def is_running(self) -> bool:
        """Whether the schedule is on: started and not stopped since."""
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the schedule; nothing happens if it is already running.

        Raises:
            ValueError: The interval is not positive (a loop without a pause).
        """
        if self.interval <= 0:
            raise ValueError(f"periodic job {self.name!r}: the interval must be positive")
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            # A signal of its own per start: a thread of an earlier start still ending
            # its round (`stop` waited only so long) keeps its own set signal and ends.
            stop = threading.Event()
            thread = threading.Thread(target=self._loop, args=(stop,), name=self.name, daemon=True)
            self._stop, self._thread = stop, thread
            thread.start()

    def stop(self, timeout: float = STOP_WAIT_SECONDS) -> None:
        """Stop the schedule: no round starts after this; a round under way is waited for
        up to `timeout` seconds (it is not interrupted). Safe to call when not running."""
        with self._lock:
            stop, thread = self._stop, self._thread
            self._stop = self._thread = None
        if stop is not None:
            stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout)

    def run_once(self) -> None:
        """One round now, its failure logged as the schedule logs it."""
        try:
            self.work()
        except Exception as error:
            reason = self._skip_reason(error)
            if reason is None:
                self.log.exception("%s failed", self.what)
            else:
                self.log.warning("%s skipped: %s", self.what, reason)

    def _skip_reason(self, error: BaseException) -> str | None:
        for kind, reason in self.skips.items():
            if isinstance(error, kind):
                return reason
        return None

    def _loop(self, stop: threading.Event) -> None:
        wait = self.first_delay
        while not stop.wait(wait):
            self.run_once()
            wait = self.interval
