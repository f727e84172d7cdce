"""`flask --app app users ...`: set up accounts without a browser (SPEC 7.2);
`flask --app app db upgrade`: migrate the shared database (SPEC 9);
`flask --app app import-deerflow DIR`: adopt a DeerFlow data directory, once (doc C);
`flask --app app files rescan`: scan stored files again for viruses;
`flask --app app files sweep`: the retention sweep, and the bucket's unfinished uploads;
`flask --app app storage migrate --to s3`: move a local install's files into the bucket;
`flask --app app worker`: run only the background jobs, with no HTTP server.

The commands use the same account rules as the pages and the API: a password the set-up
page would refuse is refused here too.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

import click
from flask import Flask
from flask.cli import AppGroup
from flask.cli import with_appcontext

from deerflow_web.errors import DeerFlowError
from deerflow_web.errors import ObjectNotFound
from deerflow_web.services.accounts.service import ADMIN
from deerflow_web.services.accounts.service import USER
from deerflow_web.services.threads.adopt import adopt_flat_threads
from deerflow_web.services.uploads.deerflow_import import Owners
from deerflow_web.services.uploads.deerflow_import import import_deerflow
from deerflow_web.services.uploads.stale_uploads import StaleUploadSweeper
from deerflow_web.settings import StorageSettings
from deerflow_web.storage.install_storage import mark_moved
from deerflow_web.storage.install_storage import settings_to_set
from deerflow_web.storage.migrate import current_revision
from deerflow_web.storage.migrate import upgrade_database
from deerflow_web.storage.objects import make_object_store
from deerflow_web.storage.objects.move import InstallMover
from deerflow_web.storage.objects.move import LocalFile
from deerflow_web.storage.objects.move import MoveReport
from deerflow_web.web.wiring import Services
from deerflow_web.web.wiring import get_services

logger = logging.getLogger(__name__)

db_cli = AppGroup("db", help="The shared database: apply its migrations.")
files_cli = AppGroup("files", help="Stored files: rescan them for viruses, sweep them.")
users_cli = AppGroup("users", help="Manage accounts: create users, API tokens, adopt threads.")
storage_cli = AppGroup("storage", help="Where file bytes live: move an install into a bucket.")


def _read_password() -> str:
    """Prompt twice on a terminal; read one line from standard input otherwise."""
    if sys.stdin.isatty():
        return click.prompt("Password", hide_input=True, confirmation_prompt=True)
    return sys.stdin.readline().rstrip("\r\n")


def _fail(error: DeerFlowError) -> None:
    raise click.ClickException(str(error))


def _started_services() -> Services:
    """The services, once start-up has run on the database (web/startup.py): a command
    run while the database is out of reach stops with one clear line, having done nothing."""
    services = get_services()
    if not services.startup.attempt():
        raise click.ClickException(
            f"The database {services.startup.url} cannot be reached; nothing was done. "
            "Try again once it answers."
        )
    return services


@users_cli.command("create")
@click.argument("email")
@click.option("--admin", is_flag=True, help="Give the account the admin role.")
def create_user(email: str, admin: bool) -> None:
    """Create an account; the password comes from a prompt or standard input."""
    password = _read_password()
    try:
        account = _started_services().accounts.create_user(
            email, password, role=ADMIN if admin else USER
        )
    except DeerFlowError as error:
        _fail(error)
    click.echo(f"Created {account.system_role} {account.email} ({account.id})")


@users_cli.command("token")
@click.argument("email")
@click.option("--name", required=True, help="What the token is for.")
@click.option("--expires-in-days", type=int, default=None, help="Expiry; none means never.")
def create_token(email: str, name: str, expires_in_days: int | None) -> None:
    """Print a new API token for the account (shown this once)."""
    accounts = _started_services().accounts
    account = accounts.find_by_email(email)
    if account is None:
        raise click.ClickException(f"No account with email {email}")
    try:
        created = accounts.create_token(account.id, name, expires_in_days)
    except DeerFlowError as error:
        _fail(error)
    click.echo(created.secret)


@users_cli.command("adopt-threads")
@click.argument("email")
def adopt_threads(email: str) -> None:
    """Move every single-user (flat layout) thread into this account."""
    services = _started_services()
    account = services.accounts.find_by_email(email)
    if account is None:
        raise click.ClickException(f"No account with email {email}")
    report = adopt_flat_threads(services.threads, services.uploads.records, account.id)
    for thread_id in report.moved:
        click.echo(f"adopted {thread_id}")
    for thread_id, reason in report.skipped:
        click.echo(f"skipped {thread_id}: {reason}", err=True)
    click.echo(f"{len(report.moved)} thread(s) moved to {account.email}")


@files_cli.command("rescan")
@click.option("--all", "everything", is_flag=True, help="Scan every file, not only those due.")
def rescan_files(everything: bool) -> None:
    """Scan stored files again with clamd; quarantine what is found infected now.

    Due are the files never scanned clean and those scanned with other signatures than
    clamd runs now.
    """
    rescans = _started_services().rescans
    if rescans is None:
        raise click.ClickException("Scanning is off: set scanning.clamd in config.yaml first.")
    try:
        report = rescans.run(everything=everything)
    except DeerFlowError as error:
        _fail(error)
    click.echo(report.summary())


@files_cli.command("sweep")
def sweep_files() -> None:
    """Run one retention sweep now: the threads untouched for `retention.thread_days`
    (never one with an upload in progress) have their files moved to the trash, and are
    removed once that trash has expired. On the S3 backend, first abort the multipart
    uploads older than `storage.s3.stale_upload_hours` that killed processes left
    unfinished in the bucket."""
    services = _started_services()
    retention = services.retention
    if services.stale_uploads is not None:
        _sweep_stale_uploads(services.stale_uploads)
        if not retention.enabled:
            return
    if not retention.enabled:
        raise click.ClickException(
            "Retention is off: set retention.thread_days in config.yaml first."
        )
    report = retention.sweep()
    if report is None:
        raise click.ClickException("Another instance is sweeping right now; try again later.")
    for ref in report.trashed:
        click.echo(
            f"moved to the trash: the files of {ref.owner or '(single user)'}/{ref.thread_id}"
        )
    for ref in report.removed:
        click.echo(f"removed {ref.owner or '(single user)'}/{ref.thread_id}")
    click.echo(report.summary())


def _sweep_stale_uploads(sweeper: StaleUploadSweeper) -> None:
    try:
        aborted = sweeper.sweep()
    except DeerFlowError as error:
        _fail(error)
    if aborted is None:
        raise click.ClickException(
            "Another instance is sweeping the bucket right now; try again later."
        )
    click.echo(
        f"stale upload sweep: {aborted} unfinished upload(s) older than "
        f"{sweeper.older_than_seconds / 3600:g} h aborted in the bucket"
    )


@db_cli.command("upgrade")
def upgrade_db() -> None:
    """Apply the migrations (and import the files of earlier releases) under the lock.

    The server does the same at start-up; run it by hand before starting several instances
    of a new release, or to check where a database stands.
    """
    services = _started_services()
    upgrade_database(services.engine, services.settings.base_dir)
    with services.engine.connect() as connection:
        revision = current_revision(connection)
    click.echo(f"Database at revision {revision} ({services.engine.url.render_as_string()})")


@storage_cli.command("migrate")
@click.option(
    "--to",
    "target",
    type=click.Choice(["s3"]),
    required=True,
    help="The backend to move to: the bucket of storage.s3.*.",
)
@click.option(
    "--every",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Print a progress line every N files.",
)
@click.option(
    "--no-switch",
    is_flag=True,
    help="Copy and verify only; the install stays on its disk (a first pass while it serves).",
)
def migrate_storage(target: str, every: int, no_switch: bool) -> None:
    """Copy every file of this install into the bucket of storage.s3.*, verify each
    SHA-256, then mark the install as moved.

    Every upload, earlier version and trash entry the database names is copied to the
    bucket unless it is there already, so a run cut off is finished by the next one. A
    file whose bytes do not match its record, or that is missing, is reported and not
    copied: the command then exits non-zero and does not switch. Once it switches, an
    instance still set to storage.backend: local refuses to start.
    """
    services = get_services()
    settings = services.settings
    s3 = settings.storage.s3
    if not s3.bucket:
        raise click.ClickException(
            "storage.s3.bucket (or DEER_FLOW_STORAGE_S3_BUCKET) must name the bucket to move "
            "the files into; storage.s3.endpoint_url, region and prefix are read as well"
        )
    try:
        store = make_object_store(StorageSettings(target, s3), settings.base_dir)
        ping = getattr(store, "ping", None)
        if ping is not None:
            try:
                ping()  # reachable, the bucket there, the credentials taken: before any file
            except ObjectNotFound as error:
                raise click.ClickException(
                    f"The bucket {s3.bucket} does not exist"
                    + (f" at {s3.endpoint_url}" if s3.endpoint_url else "")
                    + ": create it first (the app never creates buckets)"
                ) from error
        mover = InstallMover(services.engine, settings.base_dir, store)
        click.echo(
            f"Moving the files of {settings.base_dir} into the bucket {s3.bucket}"
            + (f" (prefix {s3.prefix})" if s3.prefix else "")
        )

        def progress(report: MoveReport, _local: LocalFile) -> None:
            if report.files % every == 0:
                click.echo(report.summary())

        report = mover.run(progress)
    except DeerFlowError as error:
        raise click.ClickException(
            f"{error} (nothing copied so far is lost: run the command again)"
        ) from error
    for failure in report.failures:
        click.echo(f"not copied: {failure.describe()}", err=True)
    click.echo(f"{report.threads} thread(s), each with its row in the database")
    if report.swept:
        click.echo(f"{report.swept} unfinished upload(s) of an earlier run aborted")
    click.echo(f"Done: {report.summary()}")
    if not report.complete:
        raise click.ClickException(
            f"{len(report.failures)} file(s) do not match their records or are missing, so "
            "the install was not switched: restore or delete them, then run the command again"
        )
    if report.copied == 0:
        click.echo("Nothing to copy: the bucket holds every file already.")
    if no_switch:
        click.echo(
            "Every file is in the bucket and verified; not switched (--no-switch). Stop the "
            "instances and run the command again without --no-switch to copy what changed "
            "meanwhile and switch."
        )
        return
    moved = mark_moved(services.engine, s3)
    click.echo(
        "Every file is in the bucket and verified: the install is now marked as moved. "
        "Set on every instance, then restart them:"
    )
    for line in settings_to_set(moved):
        click.echo(f"  {line}")
    click.echo("An instance still set to storage.backend: local refuses to start.")


def _account_id(email: str) -> str:
    account = _started_services().accounts.find_by_email(email)
    if account is None:
        raise click.ClickException(f"No account with email {email}")
    return account.id


@click.command("import-deerflow")
@click.argument(
    "directory", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="DIR"
)
@click.option("--owner", "owner", metavar="EMAIL", help="Account for DeerFlow's flat layout.")
@click.option(
    "--map",
    "mapping",
    multiple=True,
    metavar="UID=EMAIL",
    help="Account for one DeerFlow user of the per-user layout (repeat per user).",
)
@click.option("--move", is_flag=True, help="Move the files instead of copying them.")
@with_appcontext
def import_deerflow_command(
    directory: Path, owner: str | None, mapping: tuple[str, ...], move: bool
) -> None:
    """Adopt DeerFlow's data directory DIR: files, hashes, types and companions.

    DIR is left unchanged unless --move is given. Running it again adopts nothing twice.
    """
    services = _started_services()
    accounts = services.settings.auth.enabled
    if not accounts and (owner or mapping):
        raise click.ClickException(
            "Accounts are off (single-user mode): every thread goes to the flat layout, "
            "so --owner and --map do not apply"
        )
    by_user = {}
    for item in mapping:
        uid, sep, email = item.partition("=")
        if not sep or not uid or not email:
            raise click.ClickException(f"--map takes UID=EMAIL, not {item!r}")
        by_user[uid] = _account_id(email)
    owners = Owners(accounts, _account_id(owner) if owner else None, by_user)
    report = import_deerflow(
        directory,
        services.uploads.paths,
        services.uploads.records,
        owners,
        move=move,
    )
    for source, target in report.adopted:
        click.echo(f"adopted {source} -> {target}")
    for source, reason in report.skipped:
        click.echo(f"skipped {source}: {reason}", err=True)
    click.echo(
        f"{len(report.adopted)} file(s) {'moved' if move else 'copied'} into "
        f"{len(report.threads)} thread(s), {report.records_written} upload record(s) written "
        f"({report.companions} Markdown companion(s)), {report.already} already here, "
        f"{len(report.skipped)} skipped"
    )


@click.command("worker")
@with_appcontext
def worker_command() -> None:
    """Run only the background jobs: conversions and OCR, the rescans (with scanning on),
    the retention sweeps (with retention on) and the sweeps of unfinished uploads in the
    bucket (on S3), with no HTTP server, until SIGTERM or SIGINT.

    Web instances with `jobs.run_in_web: false` record the jobs in the shared database and
    any number of workers run them. On SIGTERM a worker takes no more jobs, hands back the
    queued ones, lets running conversions finish for `jobs.stop_grace_seconds` and releases
    the rest for another worker.
    """
    services = get_services()
    jobs = services.jobs
    _log_to_stderr()
    stop = threading.Event()
    received: list[str] = []

    def on_signal(number: int, _frame: object) -> None:
        received.append(signal.Signals(number).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if not services.startup.done:
            logger.info(
                "worker (pid %d) waits for the database %s before it runs any job",
                os.getpid(),
                services.startup.url,
            )
        if not services.startup.wait(stop):
            logger.info(
                "worker stopped (pid %d, %s) before its database answered",
                os.getpid(),
                received[0] if received else "stopped",
            )
            return
        logger.info(
            "worker started (pid %d): runs %s; database %s, data dir %s",
            os.getpid(),
            jobs.describe(),
            services.engine.url.render_as_string(),
            services.settings.base_dir,
        )
        unfinished = jobs.run_until(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    logger.info(
        "worker stopped (pid %d, %s): %d conversion(s) left to other workers",
        os.getpid(),
        received[0] if received else "stopped",
        unfinished,
    )
    if unfinished:
        # Released already; their converters end with this process rather than keep
        # the interpreter waiting for their threads.
        logging.shutdown()
        os._exit(0)


def _log_to_stderr() -> None:
    """A worker's log is its only output: INFO and above to standard error, unless the
    embedding program set logging up already."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )


def init_app(app: Flask) -> None:
    """Register the command groups."""
    app.cli.add_command(users_cli)
    app.cli.add_command(db_cli)
    app.cli.add_command(files_cli)
    app.cli.add_command(storage_cli)
    app.cli.add_command(import_deerflow_command)
    app.cli.add_command(worker_command)
