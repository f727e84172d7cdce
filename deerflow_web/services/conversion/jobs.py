"""Conversion jobs: Markdown companions made in the background, their state in the records.

A 1,000-page PDF takes over a minute, so no request waits for a conversion longer than
`conversion_wait_seconds`: the job runs on a small thread pool (each conversion itself in a
limited child process, see `runner.py`) and writes `queued`, `converting`, `done` or
`failed` into the file's upload record, where every server process can read it. The
companion is recorded as converted from its original (SPEC D8), so a delete removes exactly
that file, a re-conversion replaces it, and a `.md` the user uploaded is never touched.

Several instances (SPEC 9): a job is claimed in the database by the process that runs it,
with a lease (`conversion.lease_seconds`) that a keeper thread renews for the jobs the
process really holds (in its queue or its converters), never for a row merely marked with
its name. A job whose process died stops being renewed; once its lease has run out any
instance claims it again (the keeper's sweep, `FOR UPDATE SKIP LOCKED` on PostgreSQL, or a
convert request that finds it). A convert request for a job another instance runs polls
the database.

Fair share (per process): when a converter frees up it takes the queued job of the user
who has the fewest conversions running right now, the one who has waited longest for a turn
on a tie, so a user who queued twenty slow documents does not hold back another user's
first one. And a user may have at most `conversion.max_per_user` jobs queued or running
here (429 beyond that); each conversion is also bounded in CPU time
(`conversion.cpu_limit_seconds`), below its wall-clock limit, so a document that spins the
CPU ends sooner than one that merely waits.

Where jobs run (`jobs.run_in_web`): by default every web instance runs the jobs it is asked
for, and takes over orphaned ones. With it off, a web instance only records a job as
`queued` with no holder and no lease, so any worker (`flask --app app worker`, see
`services/background.py`) claims it at once, and follows it in the database as it follows a
job of another instance; it never starts a converter. A worker claims only as many jobs as
it has converters free, so several workers share a burst instead of one hoarding it.

Every job ends `done` or `failed`, or is run again: its final write (`_land`) is retried
while the database is unreachable, for up to one lease; if the database stays away longer
the job is released (no longer renewed), and whoever sweeps after its lease ran out runs
it again. A database that goes away before the converter ran releases the job the same
way, rather than failing it for a reason that has nothing to do with the document.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections import Counter
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

from deerflow_web.errors import ConversionError
from deerflow_web.errors import ConversionOverQuota
from deerflow_web.errors import ConversionQueueFull
from deerflow_web.errors import ConversionUserLimit
from deerflow_web.errors import NotConvertible
from deerflow_web.errors import NotScannedYet
from deerflow_web.errors import QuotaExceeded
from deerflow_web.errors import UploadNotFound
from deerflow_web.models import ACTIVE_CONVERSION_STATES
from deerflow_web.models import SINGLE_USER
from deerflow_web.models import ConversionState
from deerflow_web.models import RecordSource
from deerflow_web.models import UploadRecord
from deerflow_web.services.conversion.runner import convert_to_markdown
from deerflow_web.services.files.freshness import checked_upload
from deerflow_web.services.scanning.policy import withheld_reason
from deerflow_web.services.uploads.service import UploadResult
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.settings import ConversionSettings
from deerflow_web.storage.database import is_unavailable
from deerflow_web.storage.digest import hash_and_sniff
from deerflow_web.storage.filenames import companion_name
from deerflow_web.storage.filenames import first_free_name
from deerflow_web.storage.local import facts_of
from deerflow_web.storage.local import is_safe_destination
from deerflow_web.storage.local import staging_path
from deerflow_web.storage.paths import Thread
from deerflow_web.storage.paths import ThreadFolders
from deerflow_web.storage.records import StoredRecord

logger = logging.getLogger(__name__)

INTERRUPTED = "The conversion was interrupted by a server restart; convert the file again"
POLL_SECONDS = 0.2
RETRY_AFTER_SECONDS = 10  # a slot frees when a job ends; most take seconds, not minutes
LAND_FIRST_DELAY = 0.1  # between tries of a job's final write while the database is away
LAND_MAX_DELAY = 2.0

Converter = Callable[..., object]
Outcome = dict[str, ConversionError | None]


@dataclass(frozen=True)
class _QueuedJob:
    """A job waiting for a converter: what to convert, for whom, and its caller's future."""

    thread: ThreadFolders
    filenames: list[str]
    future: Future[Outcome]

    @property
    def user_id(self) -> str:
        return self.thread.ref.user_id


@dataclass(frozen=True)
class ConversionStatus:
    """Where one file's conversion stands after the caller's wait."""

    record: UploadRecord
    companion: UploadRecord | None
    error: ConversionError | None = None

    @property
    def finished(self) -> bool:
        """Whether the job is over (done or failed), as opposed to still queued or running."""
        return self.record.conversion_state not in ACTIVE_CONVERSION_STATES


def process_owner() -> str:
    """`host:pid` of this process, stored with a job so a restart can tell it was cut off."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_is_gone(owner: str | None) -> bool:
    """A job owned by a dead process on this host will never finish."""
    if not owner:
        return True
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's job: it reports its own fate
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _keep(jobs: weakref.ref[ConversionJobs], stop: threading.Event, every: float) -> None:
    """The keeper thread: holds its jobs object weakly, so a dropped one ends it."""
    while not stop.wait(every):
        current = jobs()
        if current is None:
            return
        try:
            current.keep_once()
        except Exception as error:  # a database outage must not end the keeper
            if is_unavailable(error):  # expected during an outage: no traceback each round
                logger.warning("conversion leases: database unavailable, renewal failed")
            else:
                logger.warning("conversion leases: renewal failed", exc_info=True)
        del current


class ConversionJobs:
    """Start conversions, wait a little for them, and report their state.

    `queued` (and so `conversion.max_queued`) counts this process's backlog: each instance
    bounds the work it takes on, wherever the requests came from.
    """

    def __init__(
        self,
        uploads: UploadService,
        settings: ConversionSettings,
        *,
        converter: Converter = convert_to_markdown,
        runs_jobs: bool = True,
    ) -> None:
        """`runs_jobs`: False for a web instance with `jobs.run_in_web` off, which records
        jobs for the workers and never converts anything itself."""
        self.uploads = uploads
        self.runs_jobs = runs_jobs
        # A worker process (`become_worker`) claims no more jobs than it has converters free.
        self.is_worker = False
        self._accepting = True  # False once a worker stops: nothing new is claimed
        self.settings = settings
        self.converter = converter
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # made on first use: never across a fork
        self._running: dict[tuple[str, str], Future[Outcome]] = {}
        self._counting = threading.Lock()  # guards the counts and queues below
        self._waiting = 0  # jobs submitted to the pool that have not started yet
        self._queues: dict[str | None, deque[_QueuedJob]] = {}  # per user, oldest first
        self._active: Counter[str | None] = Counter()  # per user: queued + running
        self._converting: Counter[str | None] = Counter()  # per user: running
        self._turns: dict[str | None, int] = {}  # per user: when they last got a converter
        self._turn = 0
        # (scope, filename) queued or running here: how many of this process's jobs cover it
        self._held: Counter[tuple[str, str]] = Counter()
        self.started_jobs = 0  # conversions run by this process, for tests and benchmarks
        self.owner = process_owner()
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()
        self._claiming = threading.Lock()

    @property
    def queued(self) -> int:
        """Jobs of this process waiting for a free converter."""
        with self._counting:
            return self._waiting

    @property
    def free_converters(self) -> int:
        """Converters of this process neither busy nor promised to a queued job."""
        with self._counting:
            return max(self.settings.workers - self._waiting - sum(self._converting.values()), 0)

    def become_worker(self) -> None:
        """Run jobs as a worker process: claim them from the database, as many as there are
        free converters, whatever this process's `jobs.run_in_web` says."""
        self.runs_jobs = True
        self.is_worker = True

    def _lease(self) -> float:
        return time.time() + self.settings.lease_seconds

    def held_jobs(self) -> list[tuple[str, str]]:
        """(scope, filename) of the jobs this process has queued or is converting: the only
        leases its keeper renews."""
        with self._counting:
            return sorted(self._held)

    def _release(self, scope: str, filename: str) -> None:
        with self._counting:
            self._unhold(scope, filename)

    def _unhold(self, scope: str, filename: str) -> None:
        """One job of this process no longer covers the file (under `_counting`)."""
        self._held[(scope, filename)] -= 1
        if self._held[(scope, filename)] <= 0:
            del self._held[(scope, filename)]

    def reclaim_interrupted_jobs(self) -> int:
        """At start-up: take over jobs whose process on this host died (a restart) and run
        them again, without waiting for their leases to run out; return how many. A web
        instance that runs no jobs leaves them to the workers."""
        if not self.runs_jobs:
            return 0
        records = self.uploads.records
        now = time.time()
        count = 0
        for scope, filename, owner in records.find_conversions(ACTIVE_CONVERSION_STATES):
            # No holder: queued for whichever worker has room (`claim_waiting_jobs`), not
            # all taken by the first process that starts.
            if owner is None or not _owner_is_gone(owner):
                continue
            records.set_conversion(scope, filename, ConversionState.QUEUED, None, None, 0.0, now)
            if records.claim_conversion(scope, filename, self.owner, now, self._lease()):
                self._start_claimed(scope, filename)
                count += 1
        return count

    def start_keeper(self) -> None:
        """Renew this process's leases and sweep for orphaned jobs, in the background.

        Started by the first job, and by servers at start-up (so an idle instance still
        picks up the jobs of one that died). Not in a web instance that runs no jobs.
        """
        if not self.runs_jobs:
            return
        with self._lock:
            if self._keeper is not None and self._keeper.is_alive():
                return
            self._stop.clear()
            self._keeper = threading.Thread(
                target=_keep,
                args=(weakref.ref(self), self._stop, self.settings.lease_renew_seconds),
                name="conversion-leases",
                daemon=True,
            )
            self._keeper.start()

    def stop_keeper(self) -> None:
        """Stop the keeper thread (tests)."""
        self._stop.set()
        keeper = self._keeper
        if keeper is not None:
            keeper.join(5)

    def keep_once(self) -> list[tuple[str, str]]:
        """Renew the leases of the jobs this process holds, then claim orphaned jobs it has
        room for."""
        records = self.uploads.records
        records.renew_leases(self.owner, self._lease(), self.held_jobs())
        return self.claim_waiting_jobs()

    def claim_waiting_jobs(self) -> list[tuple[str, str]]:
        """Claim and start the jobs nobody holds: queued for the workers, or orphaned by a
        process that died. As many as this process has room for: a worker's free
        converters, else its queue bound."""
        records = self.uploads.records
        with self._claiming:  # the keeper and a worker's poll: one counts the room at a time
            if not self._accepting:
                return []
            room = (
                self.free_converters if self.is_worker else self.settings.max_queued - self.queued
            )
            if room <= 0 or not records.has_claimable_conversions(time.time()):
                return []  # read first: an idle poll takes no write lock
            claimed = records.claim_expired_conversions(
                self.owner, time.time(), self._lease(), room
            )
            for scope, filename in claimed:
                logger.info("claimed conversion of %s in %s", filename, scope)
                self._start_claimed(scope, filename)
        return claimed

    def drain(self) -> int:
        """Stop taking jobs (a worker that is stopping), and hand back the ones queued here
        that no converter has started: they become claimable at once by another worker.
        Returns how many; conversions already running go on (`running`)."""
        with self._claiming:  # a claim under way finishes first; none starts after it
            self._accepting = False
        with self._counting:
            jobs = [job for queue in self._queues.values() for job in queue]
            self._queues.clear()
            self._waiting -= len(jobs)
            for job in jobs:
                self._done_with(job.user_id)
                for name in job.filenames:
                    self._unhold(job.thread.scope, name)
        records = self.uploads.records
        for job in jobs:
            for name in job.filenames:
                records.release_conversion(job.thread.scope, name, self.owner)
            job.future.cancel()
        return len(jobs)

    @property
    def running(self) -> int:
        """Conversions of this process that a converter is working on now."""
        with self._counting:
            return sum(self._converting.values())

    def release_held_jobs(self) -> int:
        """Give up every job this process still holds (a worker out of time to stop): each
        becomes claimable at once instead of after its lease. Returns how many."""
        held = self.held_jobs()
        records = self.uploads.records
        for scope, filename in held:
            records.release_conversion(scope, filename, self.owner)
        return len(held)

    def _start_claimed(self, scope: str, filename: str) -> None:
        """Run a job this process has just claimed in the database."""
        try:
            ref = self.uploads.paths.parse_scope(scope)
        except ValueError:
            self.uploads.records.set_conversion(
                scope, filename, ConversionState.FAILED, "Unknown thread"
            )
            return
        try:
            self._start(self.uploads.folders(ref), [filename], claimed=True)
        except ConversionQueueFull:
            pass  # our lease lapses and another instance (or a later sweep) takes it

    def convert(
        self,
        thread: Thread,
        filename: str,
        *,
        wait: float | None = None,
    ) -> ConversionStatus:
        """Convert one upload on explicit request, waiting up to `wait` seconds for it.

        Raises:
            UploadNotFound: No such upload.
            NotConvertible: Not a PDF, Word, Excel or PowerPoint file.
            ConversionQueueFull: `conversion.max_queued` jobs are already waiting.
        """
        folders = self.uploads.folders(thread)
        record = self.uploads.get_upload(folders, filename)
        if not record.convertible:
            raise NotConvertible(filename)
        if (reason := withheld_reason(record, self.uploads.scanner is not None)) is not None:
            raise NotScannedYet(filename, reason)  # the converter reads only clean files
        timeout = self.settings.wait_seconds if wait is None else wait
        scope = folders.scope
        records = self.uploads.records
        job = records.conversion_job(scope, filename)
        if not self.runs_jobs:
            if job is None or job.state not in ACTIVE_CONVERSION_STATES:
                self._enqueue(folders, [filename])
            return self._wait_for_other_process(folders, filename, timeout)
        if job is not None and job.state in ACTIVE_CONVERSION_STATES and job.owner != self.owner:
            now = time.time()
            taken = not job.live(now) and records.claim_conversion(
                scope, filename, self.owner, now, self._lease()
            )
            if not taken:  # another instance runs it: follow it in the database
                return self._wait_for_other_process(folders, filename, timeout)
            future = self._start(folders, [filename], claimed=True)
        else:
            future = self._start(folders, [filename])
        error: ConversionError | None = None
        try:
            error = future.result(timeout=timeout).get(filename)
        except FutureTimeout:
            folders.forget_records()  # the job goes on writing: read where it stands
        return self.status(folders, filename, error=error)

    def convert_after_upload(self, thread: Thread, result: UploadResult) -> dict[str, UploadRecord]:
        """With `auto_convert_documents` on, convert the request's documents; return the
        companions made within the wait, by original name (nothing when the option is off).

        One job converts the request's files one after the other, so companion names are
        given out in request order (`a.md` for `a.docx`, then `a_1.md` for `a.pdf`).
        """
        if not self.settings.auto_convert_documents:
            return {}
        scanning = self.uploads.scanner is not None
        names = [
            saved.record.filename
            for saved in result.files
            if saved.record.convertible and withheld_reason(saved.record, scanning) is None
        ]
        if not names:
            return {}
        if not self.runs_jobs:
            folders = self.uploads.folders(thread)
            try:
                self._enqueue(folders, names)
            except ConversionQueueFull:
                logger.warning(
                    "conversion limit reached: %d upload(s) left unconverted", len(names)
                )
                return {}  # the upload itself succeeded; Convert stays available
            return self._companions_within_wait(folders, names)
        try:
            folders = self.uploads.folders(thread)
            future = self._start(folders, names)
        except ConversionQueueFull:
            logger.warning("conversion queue full: %d upload(s) left unconverted", len(names))
            return {}  # the upload itself succeeded; Convert stays available
        try:
            future.result(timeout=self.settings.wait_seconds)
        except FutureTimeout:
            folders.forget_records()  # the job goes on writing: read where it stands
        records = self.uploads.records_of(folders)
        return {r.converted_from: r for r in records if r.converted_from in names}

    def _enqueue(self, folders: ThreadFolders, filenames: list[str]) -> None:
        """Record jobs as `queued` with no holder and no lease, for a worker to claim at once
        (a web instance that runs no jobs).

        Fair share still holds, counted in the database since the jobs run elsewhere: a
        user may have at most `conversion.max_per_user` conversions queued or running on
        all workers together (single-user mode: no bound, as `_admit` has one user).

        Raises:
            ConversionUserLimit: The user has that many already; nothing was queued.
        """
        scope = folders.scope
        user_id = folders.ref.user_id
        if user_id != SINGLE_USER:
            active = 0
            for other_scope, other_name, _owner in self.uploads.records.find_conversions(
                ACTIVE_CONVERSION_STATES
            ):
                if other_scope == scope and other_name in filenames:
                    continue  # queued again: counted once
                try:
                    if self.uploads.paths.parse_scope(other_scope).user_id == user_id:
                        active += 1
                except ValueError:
                    continue
            if active >= self.settings.max_per_user:  # a request's files go in together
                raise ConversionUserLimit(active, RETRY_AFTER_SECONDS)
        now = time.time()
        for name in filenames:
            self.uploads.records.set_conversion(
                scope, name, ConversionState.QUEUED, None, None, None, now
            )

    def _companions_within_wait(
        self, folders: ThreadFolders, names: list[str]
    ) -> dict[str, UploadRecord]:
        """Poll the database for up to `conversion_wait_seconds` while workers convert
        `names`; the companions made by then, by original name."""
        deadline = time.monotonic() + self.settings.wait_seconds
        while True:
            folders.forget_records()  # the workers write the records
            records = self.uploads.records_of(folders)
            pending = [
                r
                for r in records
                if r.filename in names and r.conversion_state in ACTIVE_CONVERSION_STATES
            ]
            if not pending or time.monotonic() >= deadline:
                return {r.converted_from: r for r in records if r.converted_from in names}
            time.sleep(POLL_SECONDS)

    def _start(
        self, folders: ThreadFolders, filenames: list[str], *, claimed: bool = False
    ) -> Future[Outcome]:
        scope = folders.scope
        user_id = folders.ref.user_id
        key = (scope, filenames[0]) if len(filenames) == 1 else (scope, "\0".join(filenames))
        with self._lock:
            running = self._running.get(key)
            if running is not None and not running.done():
                folders.forget_records()  # another handle's job writes: read them afresh
                return running
            job = _QueuedJob(folders, filenames, Future())
            with self._counting:
                self._admit(user_id)
                self._waiting += 1
                self._active[user_id] += 1
                self._held.update((scope, name) for name in filenames)
            folders.forget_records()
            try:
                if not claimed:
                    now = time.time()
                    for name in filenames:
                        self.uploads.records.set_conversion(
                            scope,
                            name,
                            ConversionState.QUEUED,
                            None,
                            self.owner,
                            self._lease(),
                            now,
                        )
            except BaseException:
                with self._counting:
                    self._waiting -= 1
                    self._done_with(user_id)
                    for name in filenames:
                        self._unhold(scope, name)
                raise
            with self._counting:
                self._queues.setdefault(user_id, deque()).append(job)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.settings.workers, thread_name_prefix="convert"
                )
            self._pool.submit(self._run_next)  # one turn of a converter per queued job
            self._running[key] = job.future
        # Outside the lock: a job that is already done runs the callback right here, and
        # the callback takes the lock itself.
        job.future.add_done_callback(lambda _: self._forget(key, job.future))
        self.start_keeper()
        return job.future

    def _admit(self, user_id: str) -> None:
        """Refuse a job past the process's queue bound or the user's share (under
        `_counting`). Single-user mode has one user: only the queue bound."""
        if self._waiting >= self.settings.max_queued:
            # Bounded, so a burst of requests cannot pile up hours of work.
            raise ConversionQueueFull(self._waiting, RETRY_AFTER_SECONDS)
        if user_id != SINGLE_USER and self._active[user_id] >= self.settings.max_per_user:
            raise ConversionUserLimit(self._active[user_id], RETRY_AFTER_SECONDS)

    def _done_with(self, user_id: str) -> None:
        """One job of the user is over (under `_counting`)."""
        self._active[user_id] -= 1
        if self._active[user_id] <= 0:
            del self._active[user_id]

    def _next_job(self) -> _QueuedJob:
        """The queued job whose user has the fewest conversions running now, the user who
        got a converter longest ago on a tie (under `_counting`)."""
        waiting = [user for user, queue in self._queues.items() if queue]
        user = min(waiting, key=lambda u: (self._converting[u], self._turns.get(u, -1)))
        queue = self._queues[user]
        job = queue.popleft()
        if not queue:
            del self._queues[user]
        self._turn += 1
        self._turns[user] = self._turn
        return job

    def _run_next(self) -> None:
        """A converter's turn: run the fairest queued job (see `_next_job`)."""
        with self._counting:  # not `_lock`: a pool may run a job inside `_start`
            if not self._queues:
                return  # handed back by `drain` before a converter got to it
            job = self._next_job()
            self._waiting -= 1
            self._converting[job.user_id] += 1
            self.started_jobs += 1
        job.future.set_running_or_notify_cancel()
        try:
            outcome = self._run(job.thread, job.filenames)
        except BaseException as error:
            self._finish_turn(job.user_id)
            job.future.set_exception(error)
        else:
            self._finish_turn(job.user_id)  # before the caller hears: it may queue again
            job.future.set_result(outcome)

    def _finish_turn(self, user_id: str) -> None:
        with self._counting:
            self._converting[user_id] -= 1
            if self._converting[user_id] <= 0:
                del self._converting[user_id]
            self._done_with(user_id)

    def _forget(self, key: tuple[str, str], future: Future) -> None:
        with self._lock:
            if self._running.get(key) is future:
                del self._running[key]

    def status(
        self,
        thread: Thread,
        filename: str,
        *,
        error: ConversionError | None = None,
    ) -> ConversionStatus:
        """The file's record and companion as they stand now.

        Raises:
            UploadNotFound: The file is gone (deleted while it was converted, say).
        """
        records = self.uploads.records_of(thread)
        record = next((r for r in records if r.filename == filename), None)
        if record is None:
            raise UploadNotFound(filename)
        companion = next((r for r in records if r.converted_from == filename), None)
        if error is None and record.conversion_state is ConversionState.FAILED:
            error = ConversionError(record.conversion_error or "The conversion failed")
        return ConversionStatus(record, companion, error)

    def _run(self, folders: ThreadFolders, filenames: list[str]) -> Outcome:
        scope = folders.scope
        outcome: dict[str, ConversionError | None] = {}
        for filename in filenames:
            try:
                outcome[filename] = self._run_one(folders, filename)
            finally:
                self._release(scope, filename)  # ended, or left for another run: not renewed
        return outcome

    def _run_one(self, folders: ThreadFolders, filename: str) -> ConversionError | None:
        """Convert one file and land its end in the records; the error it failed with."""
        scope = folders.scope
        try:
            self._convert_one(folders, filename)
            return None
        except ConversionError as error:
            failure = error
        except Exception as error:
            if is_unavailable(error):  # before the converter ran: nothing to report yet
                logger.warning(
                    "conversion of %s released to run again: database unavailable", filename
                )
                return None
            # A bug must still end the job, never leave it "converting".
            logger.exception("conversion of %s failed unexpectedly", filename)
            failure = ConversionError(f"Conversion of {filename} failed: {error}")
        folders.forget_records()
        records = self.uploads.records
        self._land(
            filename,
            lambda: records.finish_conversion(
                scope, filename, self.owner, ConversionState.FAILED, str(failure)
            ),
        )
        return failure

    def _land(self, filename: str, write: Callable[[], object]) -> bool:
        """Make a job's final write, retrying while the database is unreachable.

        False when it stayed unreachable for a whole lease: the job is released then (the
        caller stops holding it), so once its lease has run out a sweep, this process's or
        another instance's, claims it and runs it again. Any other error is raised.
        """
        deadline = time.monotonic() + self.settings.lease_seconds
        delay = LAND_FIRST_DELAY
        while True:
            try:
                write()
                return True
            except Exception as error:
                if not is_unavailable(error):
                    raise
                if time.monotonic() + delay > deadline:
                    logger.warning(
                        "conversion of %s: its end could not be recorded for %g s; released "
                        "to run again",
                        filename,
                        self.settings.lease_seconds,
                    )
                    return False
                logger.info("conversion of %s: database unavailable, retrying its end", filename)
            time.sleep(delay)
            delay = min(delay * 2, LAND_MAX_DELAY)

    def _set(
        self,
        scope: str,
        filename: str,
        state: ConversionState,
        error: str | None = None,
    ) -> None:
        active = state in ACTIVE_CONVERSION_STATES
        self.uploads.records.set_conversion(
            scope,
            filename,
            state,
            error,
            self.owner if active else None,
            self._lease() if active else None,
        )

    def _convert_one(self, folders: ThreadFolders, filename: str) -> None:
        scope = folders.scope
        folder = folders.uploads_dir()
        records = self.uploads.records
        before = records.get(scope, filename)
        if before is None:
            return  # deleted while queued
        now = time.time()
        if not records.claim_conversion(scope, filename, self.owner, now, self._lease()):
            return  # our lease ran out meanwhile and another instance took the job
        self._set(scope, filename, ConversionState.CONVERTING)
        folders.forget_records()
        # The source as it is now (an edit in place re-hashes it): the companion records
        # the SHA-256 of the bytes it was made from.
        source = checked_upload(self.uploads, folders, filename)
        sha256 = (source or before.record).sha256
        started = time.monotonic()
        temporary = staging_path(folder)
        try:
            self.converter(
                folder / filename,
                temporary,
                timeout_seconds=self.settings.timeout_seconds,
                memory_limit_mb=self.settings.memory_limit_mb,
                max_output_bytes=self.settings.max_output_bytes,
                cpu_limit_seconds=self.settings.cpu_limit_seconds,
            )
            try:
                landed = self._land(
                    filename, lambda: self._commit(folders, filename, sha256, temporary)
                )
            except QuotaExceeded as error:
                raise ConversionOverQuota(filename, error) from error
            if not landed:
                return
        finally:
            temporary.unlink(missing_ok=True)
        logger.info("converted %s in %.1f s", filename, time.monotonic() - started)

    def _commit(self, folders: ThreadFolders, filename: str, sha256: str, temporary: Path) -> None:
        """Put the Markdown in place under the records lock, with D8's naming rule.

        If the records cannot be written, the Markdown goes back to `temporary`: no
        companion without a record, and a retry (`_land`) finds it where it was.
        """
        placed: list[Path] = []
        try:
            self._place(folders, filename, sha256, temporary, placed)
        except BaseException:
            for destination in placed:
                os.replace(destination, temporary)
            raise

    def _place(
        self,
        folders: ThreadFolders,
        filename: str,
        sha256: str,
        temporary: Path,
        placed: list[Path],
    ) -> None:
        folder = folders.uploads_dir()
        folders.forget_records()
        final: list[UploadRecord] | None = None
        quotas = self.uploads.quotas
        with self.uploads.records.locked(folders.scope) as txn:
            original = txn.get(filename)
            if original is None or original.record.sha256 != sha256:
                return  # replaced or deleted while converting: the result is stale
            admission = (
                quotas.admit(txn.connection, folders.ref.user_id, folders.scope) if quotas else None
            )
            previous = next(
                (s.record for s in txn.all() if s.record.converted_from == filename), None
            )
            if previous is not None and is_safe_destination(folder / previous.filename):
                name = previous.filename  # a re-conversion replaces what it made before
            else:
                name = first_free_name(
                    companion_name(filename), lambda n: os.path.lexists(folder / n)
                )
            destination = folder / name
            os.replace(temporary, destination)
            placed.append(destination)
            info = destination.lstat()
            digest, _ = hash_and_sniff(destination)
            companion = UploadRecord(
                filename=name,
                size=info.st_size,
                sha256=digest,
                content_type="text/markdown",
                uploaded_at=time.time(),
                modified=info.st_mtime_ns / 1e9,
                source=RecordSource.CONVERSION,
                converted_from=filename,
                source_sha256=sha256,
                # Made from the original's bytes, which were converted only once usable.
                scan_state=original.record.scan_state,
                scan_signatures=original.record.scan_signatures,
            )
            facts = facts_of(info)
            txn.put(StoredRecord(companion, facts.mtime_ns, facts.inode, facts.ctime_ns))
            done = replace(
                original.record, conversion_state=ConversionState.DONE, conversion_error=None
            )
            txn.put(replace(original, record=done))
            if admission is not None:  # over: rolled back, the Markdown moved back out
                replaced = previous.size if previous and previous.filename == name else 0
                admission.check(info.st_size, replaced)
            final = [s.record for s in txn.all()]
        if admission is not None:
            admission.committed()
        # Committed: what it left is what the caller's next read of the handle sees.
        folders.remember_records(final)

    def _wait_for_other_process(
        self, folders: ThreadFolders, filename: str, wait: float
    ) -> ConversionStatus:
        """Poll the database while another process (or instance) runs the job; take the job
        over if that process stops renewing its lease meanwhile."""
        deadline = time.monotonic() + wait
        scope = folders.scope
        records = self.uploads.records
        while True:
            folders.forget_records()  # another process writes the records
            status = self.status(folders, filename)
            if status.finished or time.monotonic() >= deadline:
                return status
            job = records.conversion_job(scope, filename)
            now = time.time()
            # A web instance that runs no jobs never takes one over: a worker claims it,
            # however long it waits.
            lapsed = job is not None and not job.live(now) and job.owner != self.owner
            if self.runs_jobs and lapsed:
                if records.claim_conversion(scope, filename, self.owner, now, self._lease()):
                    self._start(folders, [filename], claimed=True)
            time.sleep(POLL_SECONDS)
