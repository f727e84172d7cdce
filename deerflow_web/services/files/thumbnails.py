"""Image thumbnails for the file manager's grid and list, made once per content.

A thumbnail is made by a child process (`services/conversion/thumbnail_worker.py`, with
memory and time limits) from the bytes of the upload, and cached under the data dir by the
upload's SHA-256 (`thumbnails/ab/abcdef....webp`): the same picture uploaded twice, or into
two threads, is decoded once, and a replaced file (a new hash) gets a new thumbnail. The
cache holds only what its owner could already see: every request resolves the upload for
the caller first, and the key is the content's hash, which the caller's own record names.

SVG is never rendered (it is not among the worker's formats, and this module does not even
ask for it); a refused or failed image simply has no thumbnail, remembered as an empty
marker so it is not retried on every page view.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO

from deerflow_web.services.conversion.thumbnail_worker import MAX_INPUT_BYTES
from deerflow_web.services.conversion.thumbnail_worker import TIME_LIMIT_SECONDS
from deerflow_web.storage.paths import make_dirs_with_mode

THUMBNAIL_FOLDER = "thumbnails"
WORKER_COMMAND = (sys.executable, "-m", "deerflow_web.services.conversion.thumbnail_worker")
# What may get a thumbnail: raster images a browser shows. Never .svg.
THUMBNAIL_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"})
_PROJECT_ROOT = Path(__file__).resolve().parents[3]


def wants_thumbnail(filename: str, size: int) -> bool:
    """Whether an upload is a raster image small enough to make a thumbnail of."""
    return Path(filename).suffix.lower() in THUMBNAIL_SUFFIXES and 0 < size <= MAX_INPUT_BYTES


class Thumbnails:
    """The cache of thumbnails under `{base}/thumbnails`, filled by the worker."""

    def __init__(self, base_dir: Path) -> None:
        self._root = base_dir / THUMBNAIL_FOLDER

    def path_for(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError("not a SHA-256")
        return self._root / sha256[:2] / f"{sha256}.webp"

    def get(self, sha256: str, source: BinaryIO) -> Path | None:
        """The cached thumbnail of the content, made from `source` if needed; None when the
        image cannot have one."""
        path = self.path_for(sha256)
        if path.exists():
            return path if path.stat().st_size else None
        data = self._run_worker(source)
        make_dirs_with_mode(path.parent)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".thumb-")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data or b"")  # empty: remembered as "no thumbnail"
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return path if data else None

    def _run_worker(self, source: BinaryIO) -> bytes | None:
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(_PROJECT_ROOT)}
        env.update(MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1", PYTHONUTF8="1")
        data = source.read(MAX_INPUT_BYTES + 1)  # bounded: wants_thumbnail checked the size
        if len(data) > MAX_INPUT_BYTES:
            return None
        try:
            done = subprocess.run(
                WORKER_COMMAND,
                input=data,
                capture_output=True,
                env=env,
                timeout=TIME_LIMIT_SECONDS + 5,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 and done.stdout else None
