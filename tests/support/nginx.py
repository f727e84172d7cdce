"""A private nginx for tests: its own prefix, config and ports, stopped with its test.

`run_nginx(prefix, site, port)` writes a main config that includes `site` (a file for
nginx's `http` block), starts nginx in the foreground as a child process, waits until it
listens on `port` (its pid file written: its own sockets are bound), and stops it
afterwards. Everything it writes stays under `prefix`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import wait_until

NGINX = shutil.which("nginx") or next(
    (path for path in ("/usr/sbin/nginx",) if os.access(path, os.X_OK)), None
)


def main_config(prefix: Path, site: Path) -> str:
    """A private nginx: everything it writes stays under `prefix`."""
    temp = "\n".join(
        f"    {kind}_temp_path {prefix / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root;\n" if os.getuid() == 0 else ""  # else its workers could not reach prefix
    return (
        f"{user}daemon off;\npid {prefix / 'nginx.pid'};\nerror_log {prefix / 'error.log'} info;\n"
        "events { worker_connections 512; }\n"
        f"http {{\n    access_log {prefix / 'access.log'};\n{temp}\n    include {site};\n}}\n"
    )


@contextmanager
def run_nginx(prefix: Path, site: Path, port: int) -> Iterator[None]:
    """nginx serving `site` until the block ends; fails if it does not listen on `port`."""
    assert NGINX is not None, "nginx is not installed"
    (prefix / "nginx.conf").write_text(main_config(prefix, site))
    with open(prefix / "stderr.log", "wb") as errors:
        nginx = subprocess.Popen(
            [NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", "stderr"],
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,
        )
    try:

        def listening() -> bool:
            """nginx writes its pid file only once it holds its listening sockets: before
            that, whatever answers on `port` is another process's (a port handed out
            again meanwhile), and nginx itself may still be retrying its bind."""
            assert nginx.poll() is None, (prefix / "stderr.log").read_text()
            try:
                written = (prefix / "nginx.pid").read_text().strip()
            except FileNotFoundError:
                return False
            if written != str(nginx.pid):
                return False
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_until(listening, timeout=20)
        yield
    finally:
        nginx.terminate()
        nginx.wait(10)
