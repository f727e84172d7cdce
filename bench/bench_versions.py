"""Versions benchmark: the cost of keeping the replaced bytes, on the upload path.

    /path/to/venv/bin/python bench/bench_versions.py [--rounds 3] [--quick]

Starts two servers of this checkout with `make run`'s worker class and arguments, one with
`versions.enabled: false` and one with the defaults (versions kept, trash on). Each round:

- a 100 MiB replace: `big.bin` is uploaded (not timed), then replaced by a 100 MiB file
  of other bytes (timed), on each server; the ratio is taken inside the round;
- small files: 20 requests of ten new 10 KB files, and 20 requests replacing ten 10 KB
  files by other bytes (each replace keeps a version), medians in milliseconds.

Keeping a version is a hard link made in the commit's transaction, so the 100 MiB
replace should cost the same with and without (about 1.0x). See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import bench_scanning as bs  # noqa: E402
import bench_uploads as bu  # noqa: E402


def timed(target: bu.Target, thread_id: str, files: list[tuple[str, int]]) -> float:
    started = time.perf_counter()
    bu.post_files(target.port, thread_id, files)
    return time.perf_counter() - started


def big_replace(target: bu.Target, size: int) -> float:
    """Seconds to replace a `size`-byte file by one of other bytes (one byte longer)."""
    bu.post_files(target.port, "big", [("big.bin", size - 1)])
    subprocess.run(["sync"], check=False)
    elapsed = timed(target, "big", [("big.bin", size)])
    target.drop_thread("big")
    return elapsed


def small_requests(target: bu.Target, replace: bool) -> float:
    """Median milliseconds of 20 requests of ten 10 KB files (new names, or replacing)."""
    times = []
    for repeat in range(20):
        if replace:  # the same ten names, other bytes each time (sizes alternate)
            files = [(f"small-{i}.txt", 10_000 + repeat % 2) for i in range(10)]
        else:
            files = [(f"small-{repeat}-{i}.txt", 10_000) for i in range(10)]
        times.append(timed(target, "small", files))
    target.drop_thread("small")
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10 MiB instead of 100 MiB")
    args = parser.parse_args()
    size = 10 * bu.MiB if args.quick else 100 * bu.MiB
    limit = 2 * size
    uploads = f"uploads:\n  max_file_size: {limit}\n  max_total_size: {limit}\n"
    big: dict[str, list[float]] = {"off": [], "on": [], "ratio": []}
    small: dict[str, dict[str, list[float]]] = {
        kind: {"off": [], "on": []} for kind in ("new", "replace")
    }
    with tempfile.TemporaryDirectory(prefix="bench-versions-") as tmp:
        root = Path(tmp)
        targets: list[bu.Target] = []
        try:
            targets.append(bs.start_server("off", root, uploads + "versions:\n  enabled: false\n"))
            targets.append(bs.start_server("on", root, uploads))
            off, on = targets
            big_replace(off, size)  # warm both: the first large request is slower
            big_replace(on, size)
            for round_number in range(args.rounds):
                t_off = big_replace(off, size)
                t_on = big_replace(on, size)
                big["off"].append(t_off)
                big["on"].append(t_on)
                big["ratio"].append(t_on / t_off)
                for kind in ("new", "replace"):
                    for target in targets:
                        small[kind][target.name].append(small_requests(target, kind == "replace"))
                print(f"round {round_number + 1}/{args.rounds} done", flush=True)
        finally:
            for target in targets:
                target.stop()

    label = f"{size // bu.MiB} MiB replace"
    print(f"{label:<28} without versions   with versions   with/without")
    print(
        f"{'':<28} {statistics.median(big['off']):>12.2f} s  "
        f"{statistics.median(big['on']):>12.2f} s  {statistics.median(big['ratio']):>8.2f}x"
        f"  (rounds: {', '.join(f'{r:.2f}' for r in big['ratio'])})"
    )
    for kind, row in small.items():
        ratio = statistics.median(row["on"]) / statistics.median(row["off"])
        print(
            f"10 x 10 KB per request, {kind + ':':<8} {statistics.median(row['off']):>9.1f} ms  "
            f"{statistics.median(row['on']):>12.1f} ms  {ratio:>8.2f}x"
        )
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
