"""Convert one document to Markdown in a separate, bounded process (SPEC 3, D9).

markitdown parses untrusted Office and PDF files, and a hostile or huge file can hang it or eat
all memory. So the parsing happens in a child process (`worker.py`) that has a time
limit (the parent kills its whole process group), an address-space limit, a private HOME and
TMPDIR (markitdown's import writes a cache under HOME), and none of the app's environment
secrets. The document reaches it on standard input under a neutral name, so no host path can
end up in a companion. The Markdown is written to a staging file next to the destination and
renamed onto it only on success, so a failed or stopped conversion never leaves a partial
`.md` behind.

The worker dies with the server process that started it: a killed server must not leave
parsers running for minutes, nor their work folders. The child asks the kernel for SIGKILL
when its parent goes (`PR_SET_PDEATHSIG`, set between fork and exec), and checks it was not
orphaned before asking. The kernel sends that signal when the *thread* that forked the child
exits, not the process; that is harmless here because the forking thread is the one that
waits for the worker (`_run`) and never leaves before the worker has ended (under gevent it
is a greenlet of the main thread anyway). Watching the process group or a pipe from the child
would need a watcher inside every worker command; the kernel's signal needs none, and stand-in
commands get it too. The work folders are named after their owner process (pid and start
time), so start-up removes exactly those whose owner is gone (`sweep_stale_work_folders`).

This module knows nothing of threads, records or the web; callers pick the destination name
(SPEC 3.2, D8) and turn `ConversionError` into whatever their user sees.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from deerflow_web.errors import ConversionError
from deerflow_web.errors import ConversionTimedOut
from deerflow_web.errors import NotConvertible
from deerflow_web.models import CONVERTIBLE_EXTENSIONS
from deerflow_web.services.conversion.ocr import MAX_DECODE_PIXELS
from deerflow_web.services.conversion.worker import EXIT_OUT_OF_MEMORY
from deerflow_web.storage.paths import STAGING_PREFIX
from deerflow_web.storage.paths import STAGING_SUFFIX
from deerflow_web.storage.paths import storage_modes

logger = logging.getLogger(__name__)

WORKER_COMMAND = (sys.executable, "-m", "deerflow_web.services.conversion.worker")

_PROJECT_ROOT = Path(__file__).resolve().parents[3]  # the folder holding `deerflow_web`
# The staging name follows SPEC 1.7 so that listings hide it and start-up sweeps a leftover.
_INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
# RLIMIT_AS counts reserved address space: keep BLAS/OpenMP pools and malloc arenas small so
# the limit measures the document, not the number of CPU cores.
_WORKER_ENV = {
    "MALLOC_ARENA_MAX": "2",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUTF8": "1",
}
_RESULT_LIMIT = 64 * 1024
_OUTPUT_NAME = "output.md"
_LOG_TAIL = 2000
_FORMAT_NAMES = {
    ".pdf": "PDF",
    ".doc": "Word",
    ".docx": "Word",
    ".xls": "Excel",
    ".xlsx": "Excel",
    ".ppt": "PowerPoint",
    ".pptx": "PowerPoint",
    ".png": "PNG image",
    ".jpg": "JPEG image",
    ".jpeg": "JPEG image",
    ".webp": "WebP image",
    ".tif": "TIFF image",
    ".tiff": "TIFF image",
    ".bmp": "BMP image",
    ".gif": "GIF image",
}
_MODERN_SUFFIXES = {".doc": ".docx", ".ppt": ".pptx", ".xls": ".xlsx"}

WORK_FOLDER_PREFIX = "deerflow-convert-"
# deerflow-convert-<pid>.<start time>-<random>: enough to tell whether the owner still runs.
_WORK_FOLDER = re.compile(re.escape(WORK_FOLDER_PREFIX) + r"(\d+)\.(\d+)-")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, never in a fork
except (OSError, AttributeError):  # not Linux: the worker still dies at its time limits
    _prctl = None


def process_start_time(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc), or None if there is no such
    process; with the pid it names one process, even after the pid is reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]) if len(fields) > 19 and fields[0] not in {"Z", "X"} else None


def _work_folder_prefix() -> str:
    pid = os.getpid()
    return f"{WORK_FOLDER_PREFIX}{pid}.{process_start_time(pid) or 0}-"


def sweep_stale_work_folders(directory: Path | None = None) -> int:
    """Remove the work folders of conversions whose server process is gone (killed while a
    worker ran); return how many. A folder of a live process, another user's, or one not
    named after its owner is left alone."""
    base = Path(directory if directory is not None else tempfile.gettempdir())
    removed = 0
    try:
        entries = list(os.scandir(base))
    except OSError:
        return 0
    for entry in entries:
        match = _WORK_FOLDER.match(entry.name)
        if match is None:
            continue
        try:
            if (
                not entry.is_dir(follow_symlinks=False)
                or entry.stat(follow_symlinks=False).st_uid != os.geteuid()
            ):
                continue
        except OSError:
            continue
        pid, started = int(match[1]), int(match[2])
        if process_start_time(pid) == started:
            continue  # its owner still runs (a conversion in another server process)
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    if removed:
        logger.info("removed %d work folder(s) of conversions cut off by a restart", removed)
    return removed


def _prepare_child(parent: int, cpu_limit_seconds: float | None) -> None:
    """Run in the child between fork and exec: SIGKILL when the parent dies (see above),
    and the job's CPU limit, which the kernel enforces on whatever command runs."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request: nobody would ask
        os._exit(1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cpu_limit_seconds:
        soft = max(1, math.ceil(cpu_limit_seconds))
        # SIGXCPU at the soft limit; SIGKILL a second later if that signal is ignored.
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))


@dataclass(frozen=True)
class MarkdownConversion:
    """What a successful conversion produced, for logs and benchmarks."""

    destination: Path
    characters: int | None
    seconds: float
    peak_rss_mb: float | None
    pages: int | None = None  # of a PDF (1 for an image)
    ocr_seconds: tuple[float, ...] = ()  # per page read by OCR, inside the worker
    ocr_cpu_seconds: tuple[float, ...] = ()  # the same pages' CPU time


def convert_to_markdown(
    source: Path,
    destination: Path,
    *,
    timeout_seconds: float,
    memory_limit_mb: int,
    max_output_bytes: int | None = None,
    worker_command: Sequence[str] | None = None,
    cpu_limit_seconds: float | None = None,
) -> MarkdownConversion:
    """Convert `source` to Markdown at `destination` in a time- and memory-limited process.

    `destination` is replaced atomically, and only when the conversion succeeded with some
    text; on any failure it is left as it was (absent or with its old bytes), and no staging
    file remains. The new file gets mode 0644 (SPEC 2.1.8).

    Args:
        source: The document; its extension must be one of `CONVERTIBLE_EXTENSIONS`.
        destination: Where the Markdown goes; its folder must exist. Choosing a name that
            does not clobber the user's files is the caller's job (SPEC 3.2, D8).
        timeout_seconds: Wall-clock limit; the worker's process group is killed after it.
        memory_limit_mb: Address-space limit of the worker (RLIMIT_AS). Loading markitdown
            alone needs about 300 MB of address space, so lower values fail every conversion.
        max_output_bytes: `conversion.max_output_bytes`: Markdown longer than this fails
            the conversion (nothing is saved); None means no cap.
        worker_command: Replaces `WORKER_COMMAND`, for tests. The command gets the worker's
            arguments appended and must follow the protocol in `worker.py`; the memory
            limit is the command's own business.
        cpu_limit_seconds: `conversion.cpu_limit_seconds`: CPU time the worker may use
            (RLIMIT_CPU, set before exec, so any command gets it); None: only the worker's
            own backstop just above the wall-clock limit.

    Returns:
        The destination, the number of characters written, the duration and the worker's
        peak resident memory (the worker's figures are None when it did not report them).

    Raises:
        NotConvertible: The extension is not a convertible one.
        ConversionTimedOut: The worker ran past `timeout_seconds`, or used up
            `cpu_limit_seconds` of CPU, and was stopped.
        ConversionError: Any other failure, with a sentence a user can act on.
        ValueError: A non-positive limit.
    """
    name = source.name
    suffix = source.suffix.lower()
    if suffix not in CONVERTIBLE_EXTENSIONS:
        raise NotConvertible(name)
    if timeout_seconds <= 0 or memory_limit_mb <= 0:
        raise ValueError("timeout_seconds and memory_limit_mb must be positive")
    try:
        # O_NOFOLLOW: a symlink could point the parser at any file on the host.
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConversionError(f"{name} does not exist") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ConversionError(
                f"{name} is not a regular file (links are never converted)"
            ) from None
        raise ConversionError(f"Could not open {name}: {error.strerror or error}") from None
    with os.fdopen(fd, "rb") as document:
        info = os.fstat(document.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConversionError(f"{name} is not a regular file (links are never converted)")
        if info.st_size == 0:
            raise ConversionError(f"{name} is empty (0 bytes); there is nothing to convert")
        result = _convert_stream(
            document,
            name,
            suffix,
            destination,
            timeout_seconds=timeout_seconds,
            memory_limit_mb=memory_limit_mb,
            max_output_bytes=max_output_bytes,
            worker_command=worker_command,
            cpu_limit_seconds=cpu_limit_seconds,
        )
    peak_rss_kb = result.get("peak_rss_kb")
    characters = result.get("characters")
    pages = result.get("pages")
    ocr_seconds = result.get("ocr_seconds")
    ocr_cpu_seconds = result.get("ocr_cpu_seconds")
    return MarkdownConversion(
        destination=destination,
        characters=characters if isinstance(characters, int) else None,
        seconds=float(result.get("seconds") or 0.0),
        peak_rss_mb=peak_rss_kb / 1024 if isinstance(peak_rss_kb, int) else None,
        pages=pages if isinstance(pages, int) else None,
        ocr_seconds=_numbers(ocr_seconds),
        ocr_cpu_seconds=_numbers(ocr_cpu_seconds),
    )


def _numbers(value: object) -> tuple[float, ...]:
    """A list of numbers from the worker's report; anything else gives none."""
    if not isinstance(value, list):
        return ()
    return tuple(float(item) for item in value if isinstance(item, int | float))


def _convert_stream(
    document: BinaryIO,
    name: str,
    suffix: str,
    destination: Path,
    *,
    timeout_seconds: float,
    memory_limit_mb: int,
    max_output_bytes: int | None,
    worker_command: Sequence[str] | None,
    cpu_limit_seconds: float | None = None,
) -> dict[str, object]:
    """Run the worker on an open document and put its Markdown in place; return its report."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(
        prefix=_work_folder_prefix(), ignore_cleanup_errors=True
    ) as private:
        private_dir = Path(private)
        staging = _create_staging(destination, name)
        try:
            # Only names inside the private folder (the worker's cwd): the bytes come on
            # stdin, the Markdown is copied out afterwards, so no host path reaches a parser.
            argv = [
                *(WORKER_COMMAND if worker_command is None else worker_command),
                f"document{suffix}",
                _OUTPUT_NAME,
                "result.json",
                "--memory-limit-mb",
                str(memory_limit_mb),
                "--time-limit-seconds",
                str(timeout_seconds),
                "--max-output-bytes",
                str(max_output_bytes or 0),
            ]
            returncode = _run(argv, document, private_dir, name, timeout_seconds, cpu_limit_seconds)
            result = _read_result(private_dir / "result.json")
            if returncode != 0 or result.get("status") != "ok":
                log_tail = _read_tail(private_dir / "worker.log")
                raise _failure(
                    name,
                    suffix,
                    returncode,
                    result,
                    memory_limit_mb,
                    timeout_seconds,
                    log_tail,
                    max_output_bytes,
                    cpu_limit_seconds,
                )
            _copy_output(private_dir / _OUTPUT_NAME, staging, name, max_output_bytes)
            _commit(staging, destination, name, max_output_bytes)
        finally:
            staging.unlink(missing_ok=True)
    result["seconds"] = time.monotonic() - started
    return result


def _create_staging(destination: Path, name: str) -> Path:
    """Create the empty 0600 file the worker writes into, next to the destination."""
    try:
        handle, path = tempfile.mkstemp(
            prefix=STAGING_PREFIX, suffix=STAGING_SUFFIX, dir=destination.parent
        )
    except OSError as error:
        raise ConversionError(
            f"Could not create the Markdown file for {name}: {error.strerror or error}"
        ) from error
    os.close(handle)
    return Path(path)


def _child_env(private_dir: Path) -> dict[str, str]:
    """A minimal environment: the parser must not see the app's API keys or real HOME."""
    env = {key: os.environ[key] for key in _INHERITED_ENV if key in os.environ}
    home = private_dir / "home"
    home.mkdir()
    python_path = [str(_PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]
    env.update(_WORKER_ENV)
    env.update(
        HOME=str(home),
        TMPDIR=str(private_dir),
        PYTHONPATH=os.pathsep.join(part for part in python_path if part),
    )
    return env


def _run(
    argv: list[str],
    document: BinaryIO,
    private_dir: Path,
    name: str,
    timeout_seconds: float,
    cpu_limit_seconds: float | None = None,
) -> int:
    """Run the worker in its own session and return its exit status (negative: signal)."""
    env = _child_env(private_dir)
    parent = os.getpid()
    try:
        with (private_dir / "worker.log").open("wb") as log:
            # A file, not a pipe: a chatty worker can never block on a full pipe.
            process = subprocess.Popen(
                argv,
                stdin=document,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=private_dir,
                env=env,
                start_new_session=True,  # its own process group, so one kill stops everything
                preexec_fn=lambda: _prepare_child(parent, cpu_limit_seconds),
            )
    except OSError as error:
        raise ConversionError(
            f"Could not start the converter for {name}: {error.strerror or error}"
        ) from error
    try:
        return process.wait(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise ConversionTimedOut(
            f"Conversion of {name} stopped after {timeout_seconds:g} s (time limit)"
        ) from None
    except BaseException:
        _kill_group(process)  # interrupted while waiting: never leave a worker behind
        raise


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill the worker and anything it started, then reap the worker."""
    # The worker is not reaped yet, so its pid still names its process group.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _read_result(path: Path) -> dict[str, object]:
    """The worker's JSON report, or {} when it wrote none (crashed or was killed)."""
    try:
        with path.open("rb") as handle:
            data = json.loads(handle.read(_RESULT_LIMIT))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_tail(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - _LOG_TAIL))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _copy_output(output: Path, staging: Path, name: str, max_output_bytes: int | None) -> None:
    """Copy the worker's Markdown next to the destination, refusing more than the cap."""
    limit = max_output_bytes or 0
    try:
        with output.open("rb") as source, staging.open("wb") as target:
            copied = 0
            while chunk := source.read(1024 * 1024):
                copied += len(chunk)
                if limit and copied > limit:
                    raise ConversionError(_too_large(name, output.stat().st_size, limit))
                target.write(chunk)
            target.flush()
            os.fsync(target.fileno())
    except FileNotFoundError:
        return  # the worker wrote nothing: `_commit` says there is no text
    except OSError as error:
        raise ConversionError(
            f"Could not save the Markdown for {name}: {error.strerror or error}"
        ) from error


def _commit(staging: Path, destination: Path, name: str, max_output_bytes: int | None) -> None:
    """Put the finished Markdown in place; readers see the old file or the new, never half."""
    try:
        size = staging.stat().st_size
        if size == 0:  # a worker that claims success but wrote nothing
            raise ConversionError(f"No text could be extracted from {name}")
        if max_output_bytes and size > max_output_bytes:  # the worker caps too; trust neither
            raise ConversionError(_too_large(name, size, max_output_bytes))
        staging.chmod(storage_modes().file)
        os.replace(staging, destination)  # replaces a link at destination, never follows it
    except OSError as error:
        raise ConversionError(
            f"Could not save the Markdown for {name}: {error.strerror or error}"
        ) from error


def _failure(
    name: str,
    suffix: str,
    returncode: int,
    result: dict[str, object],
    memory_limit_mb: int,
    timeout_seconds: float,
    log_tail: str,
    max_output_bytes: int | None = None,
    cpu_limit_seconds: float | None = None,
) -> ConversionError:
    """Turn the worker's report or exit status into an error a user can act on."""
    kind = result.get("kind") if result.get("status") == "error" else None
    if isinstance(kind, str):
        detail = " ".join(str(result.get("detail") or "").split())
        logger.info("conversion of %s failed (%s): %s", name, kind, detail)
        if kind == "too_large" and detail.isdigit() and max_output_bytes:
            return ConversionError(_too_large(name, int(detail), max_output_bytes))
        return ConversionError(_message(kind, name, suffix, memory_limit_mb, detail))
    logger.warning(
        "conversion worker for %s exited with status %s; log tail:\n%s",
        name,
        returncode,
        log_tail,
    )
    if returncode == EXIT_OUT_OF_MEMORY:
        return ConversionError(_message("memory", name, suffix, memory_limit_mb, ""))
    hint = f"it may have run out of memory (limit {memory_limit_mb} MB) or the file is malformed"
    if returncode == -signal.SIGXCPU:  # the CPU limit fired before the wall clock
        if cpu_limit_seconds:
            return ConversionTimedOut(
                f"Conversion of {name} stopped after {math.ceil(cpu_limit_seconds)} s of CPU "
                "time (CPU limit, conversion.cpu_limit_seconds): the document takes too much "
                "work to read"
            )
        return ConversionTimedOut(
            f"Conversion of {name} stopped after {timeout_seconds:g} s of CPU time (time limit)"
        )
    if returncode < 0:
        return ConversionError(
            f"Conversion of {name} crashed ({_signal_name(-returncode)}); {hint}"
        )
    return ConversionError(
        f"Conversion of {name} stopped unexpectedly (exit code {returncode}); {hint}"
    )


def _signal_name(number: int) -> str:
    try:
        return f"signal {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB"


def _too_large(name: str, size: int, limit: int) -> str:
    return (
        f"The Markdown of {name} would be {_megabytes(size)} ({size} bytes), above the limit "
        f"of {_megabytes(limit)} ({limit} bytes, conversion.max_output_bytes); nothing was saved"
    )


def _message(kind: str, name: str, suffix: str, memory_limit_mb: int, detail: str) -> str:
    """The sentence for one of the worker's error kinds."""
    file_type = f"{_FORMAT_NAMES.get(suffix, 'document')} ({suffix})"
    match kind:
        case "password":
            return f"{name} is password-protected; remove the password and try again"
        case "protected_office":
            return (
                f"{name} is password-protected (or is an old binary Office file renamed to "
                f"{suffix}); remove the password or re-save it as {suffix} and try again"
            )
        case "corrupt":
            return f"{name} is corrupt or not a valid {file_type} file"
        case "mislabelled":
            what = detail or "something else"
            return (
                f"{name} is not a valid {file_type} file: its content is {what}, so its text "
                "cannot be extracted as a document"
            )
        case "legacy":
            modern = _MODERN_SUFFIXES.get(suffix, ".docx")
            return (
                f"{name} is a legacy {file_type} file, which is not supported; "
                f"save it as {modern} and try again"
            )
        case "empty":
            return (
                f"No text could be extracted from {name}; it may be empty, or its images hold "
                "no text that OCR could read"
            )
        case "too_many_pixels":
            size = f" ({detail} pixels)" if detail else ""
            return (
                f"{name} is too large an image to read{size}: at most "
                f"{MAX_DECODE_PIXELS:,} pixels are decoded; scale it down and try again"
            )
        case "ocr_timeout":
            return (
                f"Reading the text of {name} by OCR stopped after {detail or '?'} s of CPU "
                "time (limit per image)"
            )
        case "ocr_unavailable":
            return (
                f"The text of {name} cannot be read here: the OCR engine could not be "
                f"loaded ({detail})"
            )
        case "memory":
            return f"Conversion of {name} ran out of memory (limit {memory_limit_mb} MB)"
        case "startup":
            return (
                f"Conversion of {name} could not load the converter ({detail}); "
                f"the memory limit of {memory_limit_mb} MB may be too low"
            )
        case _:
            return f"Conversion of {name} failed: {detail or 'unknown error'}"
