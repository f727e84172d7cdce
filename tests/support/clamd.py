"""A real clamd for the tests, with a signature database made at test time.

No signatures can be downloaded here, so the database is built from files the tests name:
one `.hdb` line per file (its MD5, size and a name), packed by `sigtool --build --unsigned`
into a versioned `daily.cud`, so `VERSION` reports a signature version that a new build
moves (the rescan tests rely on it). clamd listens on a unix socket in a temporary folder,
runs in the foreground as a child process and is stopped with SIGTERM.
`make test` installs Debian's clamav-daemon and clamav when they are missing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# The standard 68-byte antivirus test file (eicar.org); every scanner reports it.
EICAR = rb"X5O!P%@AP[4\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*"
EICAR_SIGNATURE = "Eicar-Test-Signature"
CLAMD = "/usr/sbin/clamd"
SIGTOOL = "sigtool"


def clamd_missing() -> str | None:
    """Why a clamd cannot be started here, or None."""
    if not os.access(CLAMD, os.X_OK):
        return "clamd is not installed (make clamav installs clamav-daemon)"
    if shutil.which(SIGTOOL) is None:
        return "sigtool is not installed (make clamav installs clamav)"
    return None


class Clamd:
    """One clamd process and its database."""

    def __init__(self, folder: Path, stream_max: str = "256M", extra: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.socket = folder / "clamd.sock"
        self.database = folder / "db"
        self.database.mkdir(exist_ok=True)
        self.version = 100
        self.signatures: dict[str, bytes] = {EICAR_SIGNATURE: EICAR}
        self.config = folder / "clamd.conf"
        self.config.write_text(
            "\n".join(
                [
                    f"LocalSocket {self.socket}",
                    "LocalSocketMode 600",
                    f"DatabaseDirectory {self.database}",
                    "Foreground yes",
                    f"StreamMaxLength {stream_max}",
                    f"PidFile {folder / 'clamd.pid'}",
                    f"TemporaryDirectory {folder}",
                    "SelfCheck 0",
                    "LogTime no",
                    *extra,
                ]
            )
            + "\n",
            encoding="utf-8",
        )
        self.process: subprocess.Popen[bytes] | None = None
        self._build()

    @property
    def address(self) -> str:
        """What `scanning.clamd` is set to."""
        return str(self.socket)

    def _build(self) -> None:
        """Pack the signatures into a `daily.cud` of `self.version`."""
        work = Path(tempfile.mkdtemp(dir=self.folder, prefix="build-"))
        lines = [
            f"{hashlib.md5(data).hexdigest()}:{len(data)}:{name}"
            for name, data in self.signatures.items()
        ]
        (work / "daily.hdb").write_text("\n".join(lines) + "\n", encoding="ascii")
        (work / "COPYING").write_text("test signatures\n", encoding="ascii")
        subprocess.run(
            [SIGTOOL, "--build=daily.cud", "--unsigned", f"--cvd-version={self.version}"],
            cwd=work,
            input=b"tests\ntests\n",
            capture_output=True,
            check=True,
            timeout=60,
        )
        os.replace(work / "daily.cud", self.database / "daily.cud")
        shutil.rmtree(work)

    def start(self) -> Clamd:
        """Start clamd and wait until it answers PING."""
        self.process = subprocess.Popen(
            [CLAMD, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"clamd exited with {self.process.returncode}")
            try:
                if self.command("PING") == "PONG":
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("clamd did not answer PING within 60 s")

    def command(self, name: str) -> str:
        """One command's reply."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(self.socket))
            sock.sendall(b"z" + name.encode() + b"\0")
            data = b""
            while b"\0" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        return data.split(b"\0")[0].decode()

    def add_signature(self, name: str, data: bytes) -> int:
        """Detect `data` from now on: a new database version, loaded; return the version."""
        self.signatures[name] = data
        self.version += 1
        self._build()
        self.command("RELOAD")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if f"/{self.version}/" in self.command("VERSION"):
                    return self.version
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("clamd did not load the new signatures")

    def pause(self) -> None:
        """Freeze clamd (SIGSTOP): it accepts connections and never answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused clamd go on."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process is None:
            return
        self.resume()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
        self.socket.unlink(missing_ok=True)
