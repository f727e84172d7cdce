"""`flask --app app users ...`: set up accounts without a browser (SPEC 7.2);
`flask --app app db upgrade`: migrate the shared database (SPEC 9).

The commands use the same account rules as the pages and the API: a password the set-up
page would refuse is refused here too.
"""

from __future__ import annotations

import sys

import click
from flask import Flask
from flask.cli import AppGroup

from deerflow_web.errors import DeerFlowError
from deerflow_web.services.accounts.service import ADMIN
from deerflow_web.services.accounts.service import USER
from deerflow_web.services.threads.adopt import adopt_flat_threads
from deerflow_web.storage.migrate import current_revision
from deerflow_web.storage.migrate import upgrade_database
from deerflow_web.web.wiring import get_services

db_cli = AppGroup("db", help="The shared database: apply its migrations.")
users_cli = AppGroup("users", help="Manage accounts: create users, API tokens, adopt threads.")


def _read_password() -> str:
    """Prompt twice on a terminal; read one line from standard input otherwise."""
    if sys.stdin.isatty():
        return click.prompt("Password", hide_input=True, confirmation_prompt=True)
    return sys.stdin.readline().rstrip("\r\n")


def _fail(error: DeerFlowError) -> None:
    raise click.ClickException(str(error))


@users_cli.command("create")
@click.argument("email")
@click.option("--admin", is_flag=True, help="Give the account the admin role.")
def create_user(email: str, admin: bool) -> None:
    """Create an account; the password comes from a prompt or standard input."""
    password = _read_password()
    try:
        account = get_services().accounts.create_user(
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
    accounts = get_services().accounts
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
    services = get_services()
    account = services.accounts.find_by_email(email)
    if account is None:
        raise click.ClickException(f"No account with email {email}")
    report = adopt_flat_threads(services.threads, services.uploads.records, account.id)
    for thread_id in report.moved:
        click.echo(f"adopted {thread_id}")
    for thread_id, reason in report.skipped:
        click.echo(f"skipped {thread_id}: {reason}", err=True)
    click.echo(f"{len(report.moved)} thread(s) moved to {account.email}")


@db_cli.command("upgrade")
def upgrade_db() -> None:
    """Apply the migrations (and import the files of earlier releases) under the lock.

    The server does the same at start-up; run it by hand before starting several instances
    of a new release, or to check where a database stands.
    """
    services = get_services()
    upgrade_database(services.engine, services.settings.base_dir)
    with services.engine.connect() as connection:
        revision = current_revision(connection)
    click.echo(f"Database at revision {revision} ({services.engine.url.render_as_string()})")


def init_app(app: Flask) -> None:
    """Register the command groups."""
    app.cli.add_command(users_cli)
    app.cli.add_command(db_cli)
