"""The scanning policy and the sink an upload feeds while it streams.

Fail-closed by default: a scanner that cannot be reached, times out or answers an error
refuses the upload (`ScannerUnavailable`, 503 with Retry-After) and so does a file over
clamd's `StreamMaxLength` (`TooLargeToScan`, 413), unless `scanning.on_unavailable` /
`scanning.on_too_large` is `accept_unscanned`: then the verdict is UNSCANNED, the file is
stored, and it is kept from the agent until a rescan clears it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from deerflow_web.errors import InfectedFile
from deerflow_web.errors import ScannerUnavailable
from deerflow_web.errors import TooLargeToScan
from deerflow_web.models import ScanState
from deerflow_web.models import ScanVerdict
from deerflow_web.services.scanning.clamd import ClamdAddress
from deerflow_web.services.scanning.clamd import ClamdClient
from deerflow_web.services.scanning.clamd import ClamdError
from deerflow_web.services.scanning.clamd import InstreamScan
from deerflow_web.services.scanning.clamd import StreamTooLarge
from deerflow_web.settings import ScanSettings

logger = logging.getLogger(__name__)

READ_CHUNK = 1024 * 1024
VERSION_TTL_SECONDS = 30.0  # how long a signature version read from clamd is reused
ACCEPT = "accept_unscanned"


class Scanner:
    """Scans uploads with clamd under the `scanning.*` policy."""

    def __init__(
        self, settings: ScanSettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if settings.clamd is None:
            raise ValueError("scanning.clamd is not set")
        self.settings = settings
        self.client = ClamdClient(ClamdAddress.parse(settings.clamd), settings.timeout_seconds)
        self._clock = clock
        self._version: tuple[float, str] | None = None
        self._lock = threading.Lock()

    def open(self, filename: str) -> FileScan:
        """Start scanning one file as it streams in.

        Raises:
            ScannerUnavailable: clamd cannot be reached and the policy refuses.
        """
        try:
            stream = self.client.instream()
        except ClamdError as error:
            return FileScan(self, filename, None, self._unavailable(filename, error))
        return FileScan(self, filename, stream, None)

    def scan_file(self, path: Path, filename: str) -> ScanVerdict:
        """Scan a file on disk (a finished resumable upload, a rescan), streamed from it.

        Raises:
            ScannerUnavailable, TooLargeToScan: As the policy says.
        """
        scan = self.open(filename)
        try:
            with open(path, "rb", buffering=0) as handle:
                while chunk := handle.read(READ_CHUNK):
                    scan.feed(chunk)
        except BaseException:
            scan.abort()
            raise
        return scan.finish()

    def scan_bytes(self, data: bytes, filename: str) -> ScanVerdict:
        """Scan a body held in memory (an artifact edit)."""
        scan = self.open(filename)
        scan.feed(data)
        return scan.finish()

    def require_clean(self, data: bytes, filename: str) -> ScanVerdict:
        """`scan_bytes`, refusing what is infected.

        Raises:
            InfectedFile, ScannerUnavailable, TooLargeToScan.
        """
        verdict = self.scan_bytes(data, filename)
        if verdict.state is ScanState.INFECTED:
            raise InfectedFile(filename, verdict.found or "a threat")
        return verdict

    def signatures(self, *, fresh: bool = False) -> str | None:
        """The signature database version clamd runs (cached briefly); None if unreachable."""
        with self._lock:
            cached = self._version
        now = self._clock()
        if not fresh and cached is not None and now - cached[0] < VERSION_TTL_SECONDS:
            return cached[1]
        try:
            _, version = self.client.version()
        except ClamdError:
            return None
        with self._lock:
            self._version = (now, version)
        return version

    def check(self) -> None:
        """Raise `ClamdError` unless clamd answers (readiness)."""
        self.client.ping()

    def _unavailable(self, filename: str, error: Exception) -> ScanVerdict:
        logger.warning("virus scanner unavailable for %s: %s", filename, error)
        if self.settings.on_unavailable != ACCEPT:
            raise ScannerUnavailable(self.settings.retry_after_seconds) from error
        return ScanVerdict(ScanState.UNSCANNED, reason=f"scanner unavailable: {error}")

    def _too_large(self, filename: str, error: Exception) -> ScanVerdict:
        logger.warning("%s is over the scanner's stream limit: %s", filename, error)
        if self.settings.on_too_large != ACCEPT:
            raise TooLargeToScan(filename) from error
        return ScanVerdict(ScanState.UNSCANNED, reason="larger than the scanner accepts")


class FileScan:
    """One file's scan while it streams: `feed` every chunk as it is written, then
    `finish` for the verdict before the file is committed."""

    def __init__(
        self,
        scanner: Scanner,
        filename: str,
        stream: InstreamScan | None,
        verdict: ScanVerdict | None,
    ) -> None:
        self._scanner = scanner
        self._filename = filename
        self._stream = stream
        self._verdict = verdict

    def feed(self, chunk: bytes | memoryview) -> None:
        """Pass a chunk on to clamd (failures are reported by `finish`)."""
        if self._stream is not None:
            self._stream.send(chunk)

    def finish(self) -> ScanVerdict:
        """Wait for clamd's verdict.

        Raises:
            ScannerUnavailable, TooLargeToScan: As the policy says.
        """
        if self._stream is None:
            assert self._verdict is not None
            return self._verdict
        stream, self._stream = self._stream, None
        scanner = self._scanner
        try:
            reply = stream.finish()
        except StreamTooLarge as error:
            self._verdict = scanner._too_large(self._filename, error)
            return self._verdict
        except ClamdError as error:
            self._verdict = scanner._unavailable(self._filename, error)
            return self._verdict
        signatures = scanner.signatures()
        if reply.found is not None:
            self._verdict = ScanVerdict(ScanState.INFECTED, signatures, found=reply.found)
        else:
            self._verdict = ScanVerdict(ScanState.CLEAN, signatures)
        return self._verdict

    def abort(self) -> None:
        """Drop the scan of an upload that will not be stored; safe to call twice."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def make_scanner(settings: ScanSettings) -> Scanner | None:
    """The scanner when `scanning.clamd` is set, else None (scanning off)."""
    return Scanner(settings) if settings.enabled else None
