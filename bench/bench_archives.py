"""What reading archives costs: listing, a member read by path, grep over members, extraction.

Builds one .zip and one .tar.gz of the same text members (seeded prose, so they compress
like prose), uploads them into a temporary data dir, and times, in the same run:

- `list_archive` cold (first read of the file) and cached (the same file again);
- `read_file` of one member by virtual path, cold (read out of the archive) and warm;
- `grep` over all members of the archive (cold: every member read out; warm: cached);
- extraction into workspace/, beside copying the same bytes with `shutil.copyfileobj`.

Usage: .venv/bin/python bench/bench_archives.py [--members 2000] [--member-kb 24]
"""

from __future__ import annotations

import argparse
import io
import random
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deerflow_web.models import IncomingFile  # noqa: E402
from deerflow_web.models import UploadLimits  # noqa: E402
from deerflow_web.services.archives.extract import ArchiveExtractor  # noqa: E402
from deerflow_web.services.archives.reader import list_archive  # noqa: E402
from deerflow_web.services.prompt.file_access import UserDataFiles  # noqa: E402
from deerflow_web.services.uploads.service import make_upload_service  # noqa: E402
from deerflow_web.settings import ArchiveLimits  # noqa: E402


def _prose(size: int, rng: random.Random) -> bytes:
    words = []
    total = 0
    while total < size:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        words.append(word)
        total += len(word) + 1
    return (" ".join(words)[:size]).encode()


def _archives(members: int, member_bytes: int) -> tuple[bytes, bytes]:
    rng = random.Random(1)
    files = {f"dir{i % 20}/file{i}.txt": _prose(member_bytes, rng) for i in range(members)}
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    tarred = io.BytesIO()
    with tarfile.open(fileobj=tarred, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return zipped.getvalue(), tarred.getvalue()


def _timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _measure(service, name: str) -> dict[str, float]:
    """The figures of one archive, in one data dir."""
    limits = ArchiveLimits()
    path = service.uploads_dir("t1") / name
    files = UserDataFiles(service.paths, "t1", None, None, lambda _: True)
    member = f"/mnt/user-data/uploads/{name}/dir3/file3.txt"
    folder = f"/mnt/user-data/uploads/{name}"
    figures = {
        "list cold": _timed(lambda: list_archive(path, limits)),
        "list cached": _timed(lambda: list_archive(path, limits)),
        "read member cold": _timed(lambda: files.read(member)),
        "read member warm": _timed(lambda: files.read(member)),
        "grep all cold": _timed(lambda: files.grep("zzzz", folder)),
        "grep all warm": _timed(lambda: files.grep("zzzz", folder)),
        "extract": _timed(lambda: ArchiveExtractor(service, limits).extract("t1", name)),
    }
    copy_target = path.with_name(".copy-bench")
    with path.open("rb") as source, copy_target.open("wb") as target:
        figures["copy (baseline)"] = _timed(lambda: shutil.copyfileobj(source, target))
    copy_target.unlink()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=2000)
    parser.add_argument("--member-kb", type=int, default=24)
    options = parser.parse_args()
    zipped, tarred = _archives(options.members, options.member_kb * 1024)
    raw = options.members * options.member_kb * 1024
    print(f"{options.members} members, {raw / 2**20:.1f} MiB of text")
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder) / "data"
        base.mkdir()
        service = make_upload_service(base, UploadLimits(max_file_size=2**30, max_total_size=2**31))
        for name, data in (("bench.zip", zipped), ("bench.tar.gz", tarred)):
            service.save_uploads("t1", [IncomingFile(name, io.BytesIO(data))])
            figures = _measure(service, name)
            print(f"\n{name}: {len(data) / 2**20:.1f} MiB on disk")
            for label, seconds in figures.items():
                print(f"  {label:<18} {seconds * 1000:9.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
