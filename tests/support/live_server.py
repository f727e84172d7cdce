"""`make run`'s server in a subprocess, for tests and benchmarks that need real processes.

One place starts gunicorn the way the Makefile's `run` target does (web/transport/server.py's gevent
worker, `--no-control-socket` so several can run at once), on a free loopback port, with a
given data dir, config file and database URL; waits until the app itself answers; and stops
it gently, or kills its whole process group with SIGKILL as a crash would. A killed server
can be started again on the same port, as a supervisor would restart it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from tests.helpers import auth_header_line

ROOT = Path(__file__).resolve().parents[2]
WORKER_CLASS = "deerflow_web.web.transport.server.Worker"  # what `make run` uses
START_SECONDS = 60.0


# The Host line of a raw request, and the test user's token (with accounts on).
RAW_HOST = "Host: 127.0.0.1\r\n" + auth_header_line()


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening_sockets(port: int) -> set[str] | None:
    """The inodes of the sockets listening on TCP `port` (None: no /proc to read)."""
    found: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                found.add(inode)
    return found if readable else None


def raw_request(
    port: int, method: str, path: str, head: str = "", body: bytes = b"", timeout: float = 10
) -> bytes:
    """One request on its own connection; the whole raw response. `head`: extra header lines."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        request = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Connection: close\r\n"
        if body:
            request += f"Content-Length: {len(body)}\r\n"
        sock.sendall(request.encode() + b"\r\n" + body)
        return b"".join(iter(lambda: sock.recv(65536), b""))


def deployment_environment(
    base_dir: Path, config: Path | None, database_url: str | None, extra: dict[str, str]
) -> dict[str, str]:
    """The variables a deployment sets for the app's processes (web or worker): the data
    dir, the config file and the database URL (None: the data dir's SQLite database)."""
    env = {**os.environ, "DEER_FLOW_HOME": str(base_dir), **extra}
    if config is not None:
        env["DEER_FLOW_CONFIG_PATH"] = str(config)
    env.pop("DATABASE_URL", None)
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return env


@dataclass
class LiveServer:
    """One gunicorn server (an "instance") on `port`; `start()` again after `kill()`/`stop()`."""

    base_dir: Path
    port: int = field(default_factory=free_port)
    config: Path | None = None
    single_user: bool = False
    database_url: str | None = None
    workers: int = 1
    worker_connections: int = 1000
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server is not running"
        return self.process.pid

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gunicorn",
            "--worker-class",
            WORKER_CLASS,
            "--workers",
            str(self.workers),
            "--worker-connections",
            str(self.worker_connections),
            "--bind",
            f"127.0.0.1:{self.port}",
            "--timeout",
            "600",
            "--graceful-timeout",
            "30",
            "--no-control-socket",
            "app:app",
        ]

    def environment(self) -> dict[str, str]:
        env = deployment_environment(self.base_dir, self.config, self.database_url, self.env)
        env["DEER_FLOW_BIND_HOST"] = "127.0.0.1"
        if self.single_user:
            env["DEER_FLOW_AUTH_DISABLED"] = "1"
        return env

    def start(self) -> LiveServer:
        """Start the server and return once a worker answers `/healthz` (fails after a minute)."""
        assert self.process is None or self.process.poll() is not None, "already running"
        output = open(self.log, "ab") if self.log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                env=self.environment(),
                start_new_session=True,  # its own process group: kill() takes the workers too
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        finally:
            if output is not subprocess.DEVNULL:
                output.close()
        deadline = time.monotonic() + START_SECONDS
        while not (self.answers() and self.holds_its_port()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the server on :{self.port} did not start{self.log_tail()}")
            time.sleep(0.1)
        return self

    def answers(self) -> bool:
        """Whether the app (not just the listening socket) answers `/healthz` with 200."""
        try:
            return raw_request(self.port, "GET", "/healthz", timeout=5).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def holds_its_port(self) -> bool:
        """Whether the listening socket on `port` is this server's own (its arbiter's).

        `port` was free when it was chosen, not when gunicorn binds it: another test's
        server may take it meanwhile, and then answers `/healthz` there while this one
        still retries its bind. Read from /proc; where there is none, assume so."""
        assert self.process is not None
        listening = listening_sockets(self.port)
        if listening is None:
            return True
        try:
            descriptors = list(Path(f"/proc/{self.process.pid}/fd").iterdir())
        except OSError:
            return False
        for descriptor in descriptors:
            try:
                target = os.readlink(descriptor)
            except OSError:
                continue
            if target.startswith("socket:[") and target[len("socket:[") : -1] in listening:
                return True
        return False

    def kill(self) -> None:
        """SIGKILL the arbiter and every worker at once, as a crash or an OOM kill would."""
        if self.process is None:
            return
        group = self.process.pid
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process = None
        # The workers outlive the arbiter for a moment (until init reaps them); a test that
        # asks "is that worker's pid still alive?" must not see them.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (gunicorn's graceful stop), then SIGKILL if it takes longer than `timeout`."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def log_tail(self, lines: int = 30) -> str:
        if self.log is None or not self.log.exists():
            return ""
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return ":\n" + "\n".join(text)

    def __enter__(self) -> LiveServer:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.kill()


def start_server(
    base_dir: Path,
    config: Path | None = None,
    *,
    single_user: bool = False,
    port: int | None = None,
    **options: object,
) -> LiveServer:
    """Start an instance on `base_dir`; with accounts on (unless `single_user`) the test user
    and `SERVER_TOKEN` exist first, so raw requests can carry `auth_header_line()`."""
    from tests.helpers import provision_server_user

    database_url = options.get("database_url")
    if not single_user:
        provision_server_user(base_dir, database_url=database_url)  # type: ignore[arg-type]
    server = LiveServer(
        base_dir,
        port or free_port(),
        config,
        single_user,
        **options,  # type: ignore[arg-type]
    )
    return server.start()


def http(port: int, method: str, path: str) -> bytes:
    """A raw request as the test user; the whole answer, headers and body."""
    return raw_request(port, method, path, auth_header_line())


def read_response(sock: socket.socket, pending: bytearray) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length from a kept-alive connection.

    `pending` holds what was received past the previous response.
    """
    while b"\r\n\r\n" not in pending:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        pending += data
    head, _, _ = bytes(pending).partition(b"\r\n\r\n")
    del pending[: len(head) + 4]
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers["content-length"])
    while len(pending) < length:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        pending += data
    body = bytes(pending[:length])
    del pending[:length]
    return int(lines[0].split()[1]), body
