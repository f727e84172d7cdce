"""The streamed zip download: memory stays flat as the archive grows.

Writes files of growing size, streams each through `stream_zip` into nowhere and prints the
throughput and the process's peak RSS after each round: a memory that grew with the archive
would show here as a peak that climbs with the size.

    python bench/bench_zip.py [--sizes-mib 64,256,1024]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from deerflow_web.services.files.artifacts import Artifact
from deerflow_web.services.files.zip_download import ZipMember
from deerflow_web.services.files.zip_download import stream_zip


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-mib", default="64,256,1024")
    sizes = [int(part) for part in parser.parse_args().sizes_mib.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        for size in sizes:
            path = Path(folder) / f"{size}.bin"
            with path.open("wb") as file:
                block = bytes(range(256)) * 4096  # 1 MiB, not compressible to nothing
                for _ in range(size):
                    file.write(block)
            member = ZipMember(
                path.name, Artifact(path, path.name, "application/x", False, size << 20)
            )
            started = time.perf_counter()
            total = sum(
                len(piece) for piece in stream_zip([member], lambda m: open(m.artifact.path, "rb"))
            )
            elapsed = time.perf_counter() - started
            print(
                f"{size:>5} MiB: zip {total / 2**20:8.1f} MiB in {elapsed:5.2f} s "
                f"({size / elapsed:7.1f} MiB/s), peak RSS {peak_rss_mib():6.1f} MiB"
            )
            path.unlink()


if __name__ == "__main__":
    main()
