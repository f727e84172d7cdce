"""The start-up work that needs the database, done as soon as the database answers.

An app opens its database when it is built: the migrations (under their lock, so that
instances starting together apply them once), then the clean-ups of what a killed server
left (expired resumable uploads, orphaned staging files) and the start of the background
jobs. A gunicorn worker that could not do this failed to boot, and gunicorn then stopped
the whole server: at a start during a PostgreSQL outage, and whenever a worker was
replaced (after a crash, a SIGKILL) while the outage lasted.

So the work is tried once while the app is built. When a server database is out of reach
(connection refused, timed out, its host unknown for now, the server starting or shutting
down) the app is built without it: every request but the health probes gets the 503 with
`Retry-After` a running instance gives during an outage, `/readyz` says the database
failed, and the work is tried again in the background, waiting longer each time up to the
`Retry-After`, until it is done, in the same process and without a restart. A request that
arrives meanwhile tries at once (as a running instance's request reconnects at once), so
the first one after the database is back is served. Nothing reads the database before the
migrations ran, so a schema the new release does not know yet is never queried.

What the error says decides: a server that answers and refuses the URL's user, password
or database is misconfigured, not out of reach, and waiting would never mend it, so
start-up stops at once with a one-line `ConfigError`. The embedded SQLite database is
never out of reach either: its errors stop start-up as they always did.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from deerflow_web.errors import ConfigError
from deerflow_web.storage.database import DatabaseUnavailable
from deerflow_web.storage.database import is_misconfigured
from deerflow_web.storage.database import is_sqlite
from deerflow_web.web.errors import DATABASE_RETRY_AFTER_SECONDS
from deerflow_web.web.errors import causes
from deerflow_web.web.errors import database_unreachable

logger = logging.getLogger(__name__)

RETRY_FIRST_SECONDS = 0.5
# Never longer than the Retry-After the waiting requests are given: a client that comes
# back when told finds an instance that has tried again meanwhile.
RETRY_MAX_SECONDS = float(DATABASE_RETRY_AFTER_SECONDS)
LOG_EVERY_SECONDS = 60.0  # one line when the wait begins, then one a minute, not one a try
WAIT_POLL_SECONDS = 0.2
NOT_STARTED = "the app has not finished starting: its database has not answered yet"


def first_line(error: BaseException) -> str:
    """The driver's own words, without SQLAlchemy's wrapping and libpq's hints."""
    original = getattr(error, "orig", None) or error
    return (str(original).strip().splitlines() or [type(original).__name__])[0]


class StartUp:
    """Runs `work` once, now or after the database came back; reports whether it ran."""

    def __init__(self, engine: Engine, work: Callable[[], None]) -> None:
        self._engine = engine
        self._work = work
        self._lock = threading.Lock()  # one attempt at a time: retrier, requests, a command
        self._done = threading.Event()
        self._stop = threading.Event()
        self._then: list[Callable[[], None]] = []
        self._retrier: threading.Thread | None = None
        self.failures = 0  # attempts that met the database out of reach
        self._waiting_since = 0.0
        self._logged_at = 0.0

    @property
    def done(self) -> bool:
        """Whether the work has run: the database answered and is migrated."""
        return self._done.is_set()

    @property
    def url(self) -> str:
        """The database, as logs may show it (no password)."""
        return self._engine.url.render_as_string(hide_password=True)

    def begin(self) -> None:
        """Run the work now; if the database is out of reach, again in the background until
        it answers.

        Raises:
            ConfigError: The database refused the URL's user, password or database.
        """
        if self.attempt():
            return
        self._retrier = threading.Thread(target=self._retry, name="database-start-up", daemon=True)
        self._retrier.start()

    def attempt(self, wait_seconds: float | None = None) -> bool:
        """Try the work once unless it ran already; whether it has run now. With
        `wait_seconds`, an attempt already under way is waited for that long at most, and
        then not repeated.

        Raises:
            ConfigError: The database refused the URL's user, password or database.
        """
        if self._done.is_set():
            return True
        if not self._lock.acquire(timeout=-1 if wait_seconds is None else wait_seconds):
            return self._done.is_set()
        try:
            if self._done.is_set():
                return True
            try:
                self._work()
            except Exception as error:
                if not self._may_wait_for(error):
                    raise
                self._out_of_reach(error)
                return False
            self._done.set()
            callbacks, self._then = self._then, []
        finally:
            self._lock.release()
        if self.failures:
            logger.warning(
                "database %s answers again: start-up finished after %d attempt(s) over %.0f s",
                self.url,
                self.failures + 1,
                time.monotonic() - self._waiting_since,
            )
        for callback in callbacks:
            callback()
        return True

    def attempt_for_a_request(self, wait_seconds: float) -> bool:
        """`attempt` for a request that arrives while start-up waits: it tries now rather
        than at the next retry, as a running instance's request reconnects at once, so the
        first request after the database is back is served. Never raises: the retrier
        logs what goes wrong, once a minute."""
        try:
            return self.attempt(wait_seconds)
        except Exception:  # noqa: BLE001 - answered 503; the retrier reports it
            return False

    def then(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the work has run: now if it has."""
        with self._lock:
            if not self._done.is_set():
                self._then.append(callback)
                return
        callback()

    def check(self) -> None:
        """Raise unless the work has run.

        Raises:
            DatabaseUnavailable: Still waiting for the database.
        """
        if not self._done.is_set():
            raise DatabaseUnavailable(NOT_STARTED)

    def wait(self, stop: threading.Event) -> bool:
        """Block until the work has run (True) or `stop` is set first (False)."""
        while not self._done.wait(WAIT_POLL_SECONDS):
            if stop.is_set():
                return False
        return True

    def close(self) -> None:
        """Stop retrying (an app thrown away before its database came back)."""
        self._stop.set()
        if self._retrier is not None:
            self._retrier.join(10)

    def _may_wait_for(self, error: Exception) -> bool:
        """Whether `error` is an outage to wait out; a misconfiguration raises ConfigError."""
        if any(is_misconfigured(seen) for seen in causes(error)):
            raise ConfigError(
                f"The database refused to serve this app: {first_line(error)} "
                f"(database URL {self.url}); check its user, password and database name"
            ) from None
        return not is_sqlite(self._engine) and database_unreachable(error)

    def _out_of_reach(self, error: Exception) -> None:
        """Count the failed attempt; log when the wait begins and once a minute after."""
        now = time.monotonic()
        self.failures += 1
        if self.failures == 1:
            self._waiting_since = now
        elif now - self._logged_at < LOG_EVERY_SECONDS:
            return
        self._logged_at = now
        if self.failures == 1:
            logger.warning(
                "database %s out of reach (%s): requests are answered 503 until it answers; "
                "start-up is tried again every %g s at most",
                self.url,
                first_line(error),
                RETRY_MAX_SECONDS,
            )
        else:
            logger.warning(
                "database %s still out of reach after %d attempts over %.0f s (%s)",
                self.url,
                self.failures,
                now - self._waiting_since,
                first_line(error),
            )

    def _retry(self) -> None:
        delay = RETRY_FIRST_SECONDS
        while not self._stop.wait(delay):
            delay = min(delay * 2, RETRY_MAX_SECONDS)
            try:
                if self.attempt():
                    return
            except ConfigError as error:  # the server is back, and refuses this app
                self._refused(error)
                delay = RETRY_MAX_SECONDS
            except Exception:  # a bug, or a schema the migrations cannot bring up to date
                self._refused(None)
                delay = RETRY_MAX_SECONDS

    def _refused(self, error: ConfigError | None) -> None:
        """Log a failure waiting does not mend: in full at once, then once a minute."""
        now = time.monotonic()
        self.failures += 1
        if now - self._logged_at < LOG_EVERY_SECONDS:
            return
        self._logged_at = now
        if error is None:
            logger.exception("start-up failed; tried again every %g s", RETRY_MAX_SECONDS)
        else:
            logger.error("%s; tried again every %g s", error, RETRY_MAX_SECONDS)
