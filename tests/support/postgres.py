"""A real PostgreSQL server for the tests: one per test session, fresh databases per test.

`TEST_DATABASE_URL` (or `DATABASE_URL`) given from outside names a server to use instead
(the URL's database serves only as the maintenance connection: every test still gets its
own database on that server). Otherwise Debian's server binaries
(`/usr/lib/postgresql/*/bin`, `make test` installs them when missing) run a throw-away
cluster: `initdb` into a temporary directory, a free loopback port, the unix socket in the
same directory, durability turned off (the data dies with the session anyway), stopped
and removed at the end of the session, also when it fails. PostgreSQL refuses to run as
root, so as root the cluster belongs to the `postgres` system user.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy import make_url
from sqlalchemy import text
from sqlalchemy.engine import URL

USER = "deerflow"


def external_url() -> str | None:
    """The server given from outside, if any (read before tests isolate the environment)."""
    url = os.environ.get("TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
    return url if url and url.startswith("postgresql") else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL server binaries missing: apt-get install postgresql")
    return Path(found[-1]).parent


class PostgresServer:
    """A started server (own or external) that hands out fresh databases."""

    def __init__(self, admin_url: URL, directory: Path | None = None, options: str = "") -> None:
        self.admin_url = admin_url
        self.directory = directory  # set when this session started the server itself
        self._options = options  # pg_ctl's -o, to start it again the same way
        self._names = itertools.count(1)
        self._admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")

    @classmethod
    def start(cls, given: str | None = None) -> PostgresServer:
        """Use the external server `given`, or initdb and start one."""
        if given:
            return cls(make_url(given))
        bin_dir = _binaries()
        directory = Path(tempfile.mkdtemp(prefix="deerflow-pg-"))
        as_root = os.geteuid() == 0
        prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
        if as_root:
            shutil.chown(directory, "postgres", "postgres")
        data = directory / "data"
        port = _free_port()
        try:
            subprocess.run(
                [*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", USER,
                 "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"],
                check=True, capture_output=True,
            )  # fmt: skip
            options = (
                f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
            )
            subprocess.run(
                [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options,
                 "-l", str(directory / "log"), "-w", "-t", "60", "start"],
                check=True, capture_output=True,
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        url = URL.create(
            "postgresql+psycopg", username=USER, host="127.0.0.1", port=port, database="postgres"
        )
        return cls(url, directory, options)

    def _pg_ctl(self, *args: str) -> None:
        assert self.directory is not None, "only a server this session started can be driven"
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(
            [*prefix, str(_binaries() / "pg_ctl"), "-D", str(self.directory / "data"), *args],
            check=True,
            capture_output=True,
        )

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data: `fast` cuts the connections; `immediate`
        stops at once, as a crash would (recovery runs at the next start)."""
        self._admin.dispose()
        self._pg_ctl("-m", mode, "-w", "stop")

    def commit_durably(self, url: str) -> None:
        """Make the database's commits survive `crash_server` (the session's cluster turns
        `synchronous_commit` off, which a crash would show as lost recent commits)."""
        name = make_url(url).database
        with self._admin.connect() as db:
            db.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = on'))

    def crash_server(self) -> None:
        """Stop the server as a crash would (`pg_ctl stop -m immediate`), keeping its data
        (what was committed durably, see `commit_durably`)."""
        self._admin.dispose()
        self._pg_ctl("-m", "immediate", "-w", "stop")

    def start_server(self) -> None:
        """Start the stopped server again on the same port."""
        assert self.directory is not None
        log = str(self.directory / "log")
        self._pg_ctl("-o", self._options, "-l", log, "-w", "-t", "60", "start")

    def create_database(self, template: str | None = None) -> str:
        """A new database, empty or a copy of the database at the URL `template` (which no
        one may be connected to); its SQLAlchemy URL (psycopg 3) as a string."""
        name = f"test_{os.getpid()}_{next(self._names)}_{int(time.time() * 1000) % 100000}"
        source = make_url(template).database if template else "template0"
        with self._admin.connect() as db:
            db.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{source}"'))
        return self.admin_url.set(database=name).render_as_string(hide_password=False)

    def drop_database(self, url: str) -> None:
        """Drop a database made by `create_database`, cutting its leftover connections."""
        name = make_url(url).database
        with self._admin.connect() as db:
            db.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def terminate_connections(self, url: str) -> int:
        """Kill every server connection to the database (as a failover would)."""
        name = make_url(url).database
        with self._admin.connect() as db:
            return len(
                db.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": name},
                ).all()
            )

    def close(self) -> None:
        """Stop and remove a server this session started; leave an external one alone."""
        self._admin.dispose()
        if self.directory is None:
            return
        try:
            self._pg_ctl("-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass  # already stopped
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
