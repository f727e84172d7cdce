"""Builds the services once per app and hands them to views (`app.extensions`)."""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flask import Flask
from flask import current_app
from flask import g
from flask import request
from sqlalchemy import Engine
from sqlalchemy.exc import ArgumentError
from sqlalchemy.exc import NoSuchModuleError
from sqlalchemy.exc import OperationalError

from deerflow_web.errors import ConfigError
from deerflow_web.errors import NotAuthenticated
from deerflow_web.models import SINGLE_USER
from deerflow_web.services.accounts.service import AccountService
from deerflow_web.services.archives.extract import ArchiveExtractor
from deerflow_web.services.background import BackgroundJobs
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.conversion.runner import sweep_stale_work_folders
from deerflow_web.services.files.share_links import ShareLinks
from deerflow_web.services.files.thumbnails import Thumbnails
from deerflow_web.services.history.hooks import ThreadHistory
from deerflow_web.services.history.hooks import make_history
from deerflow_web.services.periodic import PeriodicJob
from deerflow_web.services.prompt.chat_preview import ChatPreviewService
from deerflow_web.services.prompt.chat_preview import make_chat_preview_service
from deerflow_web.services.prompt.tool_preview import ToolPreviewService
from deerflow_web.services.quotas.policy import QuotaPolicy
from deerflow_web.services.quotas.retention import RetentionSweeper
from deerflow_web.services.scanning.events import RefusalLog
from deerflow_web.services.scanning.rescan import Rescanner
from deerflow_web.services.scanning.scanner import Scanner
from deerflow_web.services.scanning.scanner import make_scanner
from deerflow_web.services.threads.catalog import ThreadCatalog
from deerflow_web.services.uploads.intake import UploadIntake
from deerflow_web.services.uploads.resumable import ResumableUploadService
from deerflow_web.services.uploads.resumable import make_resumable_service
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.services.uploads.stale_uploads import StaleUploadSweeper
from deerflow_web.settings import Settings
from deerflow_web.storage.database import CONNECT_TIMEOUT_SECONDS
from deerflow_web.storage.database import DatabaseUnavailable
from deerflow_web.storage.database import default_database_url
from deerflow_web.storage.database import make_engine
from deerflow_web.storage.install_storage import refuse_local_after_move
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.local import sweep_staging_files
from deerflow_web.storage.migrate import upgrade_database
from deerflow_web.storage.objects.eviction import EVICTION_INTERVAL_SECONDS
from deerflow_web.storage.objects.eviction import WorkingCopyBudget
from deerflow_web.storage.objects.eviction import logger as eviction_logger
from deerflow_web.storage.paths import make_dirs_with_mode
from deerflow_web.storage.paths import secure_data_dir
from deerflow_web.storage.paths import tighten_secret_file
from deerflow_web.storage.paths import use_storage_group
from deerflow_web.storage.scan_events import ScanEvents
from deerflow_web.web.marks import PROBE
from deerflow_web.web.marks import STATIC_ENDPOINT
from deerflow_web.web.marks import request_has
from deerflow_web.web.startup import StartUp

logger = logging.getLogger(__name__)

EXTENSION_KEY = "deerflow_web"
SECRET_KEY_FILE = "secret_key"


class Services:
    """Everything views need, built from the settings in one place."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # One engine per process, shared by every store (SPEC 9); nothing here connects:
        # the migrations run first, in `start_up` (web/startup.py).
        self.engine = open_engine(settings)
        self.startup = StartUp(self.engine, self.start_up)
        # Virus scanning (issue: scan before anyone sees it): None unless configured.
        self.scanner: Scanner | None = make_scanner(settings.scanning)
        self.scan_events = ScanEvents(self.engine)
        # Storage quotas (issue 27): checked in the transaction of every write they bound.
        self.quotas = QuotaPolicy(self.engine, settings.quotas.default_bytes)
        # On `storage.backend: s3` the data dir is this instance's copy of the bucket.
        self.uploads: UploadService = make_upload_service(
            settings.base_dir,
            settings.limits,
            self.engine,
            self.scanner,
            self.quotas,
            storage=settings.storage,
        )
        # Versions on every replace, the trash on every delete (issue 27).
        self.history: ThreadHistory = make_history(
            self.uploads, settings.history, self.scanner, self.quotas
        )
        # With `jobs.run_in_web` off the jobs are only recorded here; workers run them.
        self.conversions = ConversionJobs(
            self.uploads, settings.conversion, runs_jobs=settings.jobs.run_in_web
        )
        self.extractor = ArchiveExtractor(self.uploads, settings.archives)
        self.intake = UploadIntake(
            self.uploads,
            self.conversions,
            extractor=self.extractor if settings.archives.extract_on_upload else None,
            scanner=self.scanner,
            refusals=RefusalLog(self.scan_events),
        )
        self.rescans: Rescanner | None = None
        if self.scanner is not None:
            self.rescans = Rescanner(
                self.uploads, self.scanner, self.scan_events, JobLeases(self.engine)
            )
        self.chat_previews: ChatPreviewService = make_chat_preview_service(
            self.uploads, image_limits=settings.agent.images
        )
        self.tool_previews = ToolPreviewService(
            self.conversions,
            settings.agent.read_conversion_wait_seconds,
            settings.agent.images,
        )
        self.resumable: ResumableUploadService = make_resumable_service(
            self.intake,
            expiry_hours=settings.resumable.expiry_hours,
            max_pending=settings.resumable.max_pending,
            max_pending_bytes=settings.resumable.max_pending_bytes,
            lease_seconds=settings.resumable.lease_seconds,
        )
        # Each user's threads (SPEC 7.4, DeerFlow's /api/threads), in both modes.
        self.threads = ThreadCatalog(self.uploads, self.chat_previews)
        self.share_links = ShareLinks(self.engine)
        # Retention (issue 27): off unless `retention.thread_days` is set.
        self.retention = RetentionSweeper(
            self.threads,
            JobLeases(self.engine),
            settings.retention.thread_days,
            interval_seconds=settings.retention.sweep_interval_minutes * 60,
            trash=self.history.trash_bin,
        )
        # On S3: the multipart uploads killed processes left in the bucket, swept.
        self.stale_uploads: StaleUploadSweeper | None = None
        copies = self.uploads.paths.copies
        if copies is not None:
            self.stale_uploads = StaleUploadSweeper(
                copies.store,
                JobLeases(self.engine),
                settings.storage.s3.stale_upload_hours * 3600,
            )
        # On S3 with `storage.s3.working_copy_max_bytes`: this data dir kept within it, by
        # every process that reads it (web, jobs off or on, and workers), one at a time.
        self.working_copy_budget: PeriodicJob | None = None
        max_bytes = settings.storage.s3.working_copy_max_bytes
        if copies is not None and max_bytes:
            budget = WorkingCopyBudget(settings.base_dir, self.uploads.records, max_bytes)
            self.working_copy_budget = PeriodicJob(
                "working-copy-budget",
                EVICTION_INTERVAL_SECONDS,
                budget.evict,
                what="working copy eviction",
                skips={
                    DatabaseUnavailable: "the database is unavailable",
                    OperationalError: "the database is unavailable",
                },
                log=eviction_logger,
            )
        # Conversions, rescans and sweeps: started here unless `jobs.run_in_web` is off, run
        # by `flask --app app worker` either way.
        self.jobs = BackgroundJobs(
            settings.jobs,
            self.conversions,
            rescans=self.rescans,
            rescan_interval_seconds=settings.scanning.rescan_interval_seconds,
            retention=self.retention,
            stale_uploads=self.stale_uploads,
        )
        self.thumbnails = Thumbnails(settings.base_dir)
        self._accounts: AccountService | None = None

    def start_up(self) -> None:
        """What needs the database before the app serves: the migrations, then clearing
        what a killed server left half-written, then the background jobs. Run once, when
        the app is built or as soon as its database answers (`self.startup`)."""
        settings = self.settings
        upgrade_database(self.engine, settings.base_dir)
        # An install whose bytes moved to a bucket never serves from this disk again.
        refuse_local_after_move(self.engine, settings.storage)
        self.resumable.sweep_expired()
        sweep_staging_files(
            self.uploads.paths.iter_uploads_dirs(), keep=self.resumable.is_live_staging
        )
        if self.working_copy_budget is not None:
            self.working_copy_budget.start()
        if settings.jobs.run_in_web:
            # The lease keeper is started by a server (app.py) or a worker, not by every app.
            self.jobs.start(keeper=False)
        else:
            logger.info(
                "background jobs off in this instance (jobs.run_in_web: false): conversions "
                "are queued for `flask --app app worker` processes"
            )

    def ping_database(self) -> None:
        """Raise unless the database answers and start-up has run (readiness); a probe
        while start-up waits tries it at once, as a request does."""
        self.startup.attempt_for_a_request(CONNECT_TIMEOUT_SECONDS)
        self.startup.check()
        self.uploads.records.ping()

    @property
    def accounts(self) -> AccountService:
        """Users, sessions, tokens and lockouts (SPEC 7); built on first use: the
        single-user mode never needs them."""
        if self._accounts is None:
            auth = self.settings.auth
            self._accounts = AccountService(
                self.engine,
                session_lifetime=auth.session_lifetime_days * 86400,
                session_idle=auth.session_idle_hours * 3600,
            )
        return self._accounts


def secret_key_of_data_dir(settings: Settings) -> str:
    """The key kept in the data dir, for an install that sets none. On the S3 backend each
    machine has a data dir of its own, hence a key of its own: say so, since a session or
    a form started on one instance is then refused by the others."""
    if settings.storage.backend != "local":
        logger.warning(
            "storage.backend is %s but no SECRET_KEY or server.secret_key is set: this "
            "instance signs sessions with a key of its own data dir, which instances on "
            "other machines do not share; set one key for all (docs/deploy.md)",
            settings.storage.backend,
        )
    with data_dir_in_use(settings.base_dir):
        return persistent_secret_key(settings.base_dir)


def persistent_secret_key(base_dir: Path) -> str:
    """A session key shared by every worker process and kept across restarts.

    Each gunicorn worker builds its own app; a key generated in memory would make one
    worker reject the CSRF tokens another one issued. The key is written to a private
    temporary file first and hard-linked into place, so a worker starting at the same
    moment reads either no file or a complete one, never an empty one.
    """
    path = base_dir / SECRET_KEY_FILE
    if path.exists():
        tighten_secret_file(path)
        return path.read_text(encoding="ascii").strip()
    make_dirs_with_mode(base_dir)
    handle, temporary = tempfile.mkstemp(dir=base_dir, prefix=".secret-")  # mode 0600
    try:
        with os.fdopen(handle, "w", encoding="ascii") as file:
            file.write(secrets.token_hex(32))
        os.link(temporary, path)
    except FileExistsError:
        pass  # another worker won the race: use its key
    finally:
        os.unlink(temporary)
    return path.read_text(encoding="ascii").strip()


def open_engine(settings: Settings) -> Engine:
    """The engine of the configured database (the data dir's SQLite file by default).

    Raises:
        ConfigError: The URL is not one SQLAlchemy can use (malformed, unknown driver, a
            driver that is not installed).
    """
    try:
        return make_engine(settings.database_url or default_database_url(settings.base_dir))
    except (ArgumentError, NoSuchModuleError, ImportError) as error:
        raise ConfigError(f"database.url / DATABASE_URL is not usable: {error}") from None


@contextmanager
def data_dir_in_use(base_dir: Path) -> Iterator[None]:
    """Where the data dir is first created or written: a folder that cannot be (a path
    through a file, a read-only or foreign mount) is a configuration error, said in one
    line, not a traceback from deep inside the start-up.

    Raises:
        ConfigError: The data dir cannot be created or written.
    """
    try:
        yield
    except OSError as error:
        reason = error.strerror or str(error)
        where = f" ({error.filename})" if error.filename else ""
        raise ConfigError(
            f"The data dir {base_dir} cannot be used: {reason}{where}; "
            "set DEER_FLOW_HOME to a folder this user may create and write"
        ) from None


def init_app(app: Flask, settings: Settings) -> None:
    """Attach the services and start up on the database: now, or once it answers (while
    it does not, every request but the health probes is answered 503)."""
    use_storage_group(settings.storage_group)
    with data_dir_in_use(settings.base_dir):
        secure_data_dir(settings.base_dir)
    services = Services(settings)
    sweep_stale_work_folders()  # of converters whose server was killed; no database needed
    try:
        services.startup.begin()
    except ConfigError:
        services.engine.dispose()  # the process stops: its connections with it
        raise
    app.extensions[EXTENSION_KEY] = services

    def refuse_until_started() -> None:
        if services.startup.done or request_has(PROBE) or request.endpoint == STATIC_ENDPOINT:
            return
        if services.startup.attempt_for_a_request(CONNECT_TIMEOUT_SECONDS):
            return  # the database is back: this request is served
        # Answered before the sign-in gate runs: nobody is signed in for this request, and
        # its error page asks the database (not migrated yet, perhaps) nothing.
        g.signed_in_user = None
        g.header_usage = None
        services.startup.check()  # raises DatabaseUnavailable: 503 with Retry-After

    app.before_request(refuse_until_started)


def get_services() -> Services:
    """The services of the current app."""
    return current_app.extensions[EXTENSION_KEY]


def get_upload_service() -> UploadService:
    """The upload service of the current app."""
    return get_services().uploads


def get_chat_preview_service() -> ChatPreviewService:
    """The chat preview service of the current app."""
    return get_services().chat_previews


def get_tool_preview_service() -> ToolPreviewService:
    """The service that shows what the agent's file tools return."""
    return get_services().tool_previews


def current_owner() -> str:
    """The owner of the threads a request may touch: the signed-in account's id with
    accounts on, `SINGLE_USER` (the flat layout) with accounts off (SPEC D16).

    Raises:
        NotAuthenticated: Accounts are on and nobody is signed in.
    """
    user_id = current_user_id()
    return SINGLE_USER if user_id is None else user_id


def current_user_id() -> str | None:
    """The user whose files a request may touch (SPEC D16).

    The signed-in account's id with accounts on (its per-user layout); None with accounts
    off, which selects the flat single-user layout of the first release.
    """
    from deerflow_web.web.accounts.gate import auth_enabled
    from deerflow_web.web.accounts.gate import signed_in

    if not auth_enabled():
        return None
    user = signed_in()
    if user is None:  # never fall back to the shared flat layout
        raise NotAuthenticated()
    return user.id
