"""`flask --app app worker` in a subprocess, for tests that need a real worker process.

Like `live_server.py` for gunicorn: one place starts the worker the way a deployment runs it
(the same environment variables: data dir, config file, database URL), waits until it has
logged that it started, and stops it with SIGTERM as systemd would, or kills its whole
process group with SIGKILL as a crash would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from deerflow_web.services.conversion.runner import process_start_time
from tests.support.live_server import deployment_environment

ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 60.0
STARTED = "worker started"


@dataclass
class LiveWorker:
    """One worker process; `start()` again after `kill()`/`stop()`. `app`: the module
    `flask --app` loads (a test app with a stand-in converter, say)."""

    base_dir: Path
    log: Path
    config: Path | None = None
    database_url: str | None = None
    app: str = "app"
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "the worker is not running"
        return self.process.pid

    def environment(self) -> dict[str, str]:
        return deployment_environment(self.base_dir, self.config, self.database_url, self.env)

    def start(self, until: str = STARTED) -> LiveWorker:
        """Start the worker; return once it logged its start line, or the line `until`
        (fails after a minute)."""
        assert self.process is None or self.process.poll() is not None, "already running"
        already = self.log.read_text(errors="replace").count(until) if self.log.exists() else 0
        with open(self.log, "ab") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "flask", "--app", self.app, "worker"],
                cwd=ROOT,
                env=self.environment(),
                start_new_session=True,  # its own process group: kill() takes converters too
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_SECONDS
        while self.log.read_text(errors="replace").count(until) <= already:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the worker did not start{self.log_tail()}")
            time.sleep(0.1)
        return self

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, as systemd stops it; its exit status (None: killed after `timeout`)."""
        if self.process is None:
            return None
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            status = None
        self.kill()
        return status

    def kill(self) -> None:
        """SIGKILL the worker's whole process group, as a crash or an OOM kill would."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process = None

    def log_tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return ":\n" + "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def converters_in(temp: Path) -> dict[int, Path]:
    """Live processes working in a folder under `temp` (conversion workers): pid -> folder."""
    found: dict[int, Path] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd.parent == temp and process_start_time(int(entry.name)) is not None:
            found[int(entry.name)] = cwd
    return found
