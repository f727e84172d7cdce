"""Virus scanning benchmark: uploads with and without clamd, and clamd alone, same rounds.

    /path/to/venv/bin/python bench/bench_scanning.py [--rounds 3] [--quick]

Starts clamd (Debian's, with a signature database built here as the tests build it:
tests/support/clamd.py; limits raised so a 1 GiB stream is really scanned) and two servers
of this checkout with `make run`'s worker class and arguments, one without scanning and one
with `scanning.clamd` set. Each round, for 100 MiB and 1 GiB: the upload to each server and
the same bytes sent to clamd alone with INSTREAM. The goal (issue: scan while it streams) is
the scanned upload within 1.3x of the slower of "upload alone" and "clamd alone", taken
inside each round and reported as the median over rounds. Then ten 10 KB files per request
(the typical chat upload), medians in milliseconds. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import bench_uploads as bu  # noqa: E402

from tests.support.clamd import Clamd  # noqa: E402
from tests.support.clamd import clamd_missing  # noqa: E402

GOAL = 1.3
CLAMD_LIMITS = (
    "MaxScanSize 4000M",
    "MaxFileSize 4000M",
    "StreamMaxLength 4000M",
)


def start_server(name: str, root: Path, config_text: str) -> bu.Target:
    """This checkout's app under `make run`'s gunicorn worker class and options."""
    target = bu.Target(name, root / name, port=bu.free_port(), log=root / f"{name}.log")
    config = root / f"{name}.yaml"
    config.write_text(config_text, encoding="utf-8")
    env = bu.server_env(target.data_dir, config)
    env["PYTHONPATH"] = str(bu.REPO)
    env["DEER_FLOW_BIND_HOST"] = bu.HOST
    gunicorn = Path(sys.executable).with_name("gunicorn")
    command = [
        str(gunicorn),
        "--chdir",
        str(bu.REPO),
        "--worker-class",
        "deerflow_web.web.transport.server.Worker",
        "--workers",
        "2",
        "--worker-connections",
        "1000",
        "--bind",
        f"{bu.HOST}:{target.port}",
        "--timeout",
        "600",
        "--no-control-socket",
        "app:app",
    ]
    target.launch(command, env)
    target.wait_ready(120)
    return target


def clamd_alone(clamd: Clamd, size: int) -> float:
    """Seconds to send `size` bytes to clamd with INSTREAM and get its verdict."""
    started = time.perf_counter()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(clamd.socket))
        sock.sendall(b"zINSTREAM\0")
        block = bu.BLOCK
        full, rest = divmod(size, len(block))
        header = struct.pack(">I", len(block))
        for _ in range(full):
            sock.sendall(header)
            sock.sendall(block)
        if rest:
            sock.sendall(struct.pack(">I", rest))
            sock.sendall(block[:rest])
        sock.sendall(struct.pack(">I", 0))
        reply = sock.recv(4096)
    if b"OK" not in reply:
        raise bu.BenchError(f"clamd answered {reply!r}")
    return time.perf_counter() - started


def timed_upload(target: bu.Target, thread_id: str, files: list[tuple[str, int]]) -> float:
    subprocess.run(["sync"], check=False)
    started = time.perf_counter()
    answer = bu.post_files(target.port, thread_id, files)
    elapsed = time.perf_counter() - started
    states = {f.get("scan_state") for f in answer["files"]}
    expected = {"clean"} if target.name == "scanned" else {None}
    if states != expected:
        raise bu.BenchError(f"{target.name}: scan states {states}, expected {expected}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10 and 100 MiB instead")
    args = parser.parse_args()
    if (reason := clamd_missing()) is not None:
        raise SystemExit(f"cannot benchmark scanning: {reason}")
    big_sizes = [10 * bu.MiB, 100 * bu.MiB] if args.quick else [100 * bu.MiB, bu.GiB]
    limit = 2 * max(big_sizes)
    uploads = f"uploads:\n  max_file_size: {limit}\n  max_total_size: {limit}\n"
    with tempfile.TemporaryDirectory(prefix="bench-scan-") as tmp:
        root = Path(tmp)
        (root / "clamd").mkdir()
        clamd = Clamd(root / "clamd", stream_max="4000M", extra=CLAMD_LIMITS).start()
        targets: list[bu.Target] = []
        try:
            targets.append(start_server("plain", root, uploads))
            scanning = f"scanning:\n  clamd: {clamd.address}\n  rescan_interval_seconds: 0\n"
            targets.append(start_server("scanned", root, uploads + scanning))
            plain, scanned = targets
            results: dict[int, dict[str, list[float]]] = {
                size: {"plain": [], "scanned": [], "clamd": [], "ratio": []} for size in big_sizes
            }
            small: dict[str, list[float]] = {"plain": [], "scanned": []}
            for size in big_sizes:  # clamd's first large stream is slow: not a round's
                clamd_alone(clamd, size)
            for round_number in range(args.rounds):
                for size in big_sizes:
                    row = results[size]
                    t_plain = timed_upload(plain, "big", [("big.bin", size)])
                    plain.drop_thread("big")
                    t_scanned = timed_upload(scanned, "big", [("big.bin", size)])
                    scanned.drop_thread("big")
                    t_clamd = clamd_alone(clamd, size)
                    row["plain"].append(t_plain)
                    row["scanned"].append(t_scanned)
                    row["clamd"].append(t_clamd)
                    row["ratio"].append(t_scanned / max(t_plain, t_clamd))
                for target in targets:
                    times = []
                    for repeat in range(20):
                        files = [(f"small-{repeat}-{i}.txt", 10_000) for i in range(10)]
                        started = time.perf_counter()
                        bu.post_files(target.port, "small", files)
                        times.append(time.perf_counter() - started)
                    small[target.name].append(statistics.median(times) * 1000)
                    target.drop_thread("small")
                print(f"round {round_number + 1}/{args.rounds} done", flush=True)
        finally:
            for target in targets:
                target.stop()
            clamd.stop()

    print("size       upload alone   clamd alone   upload+scan   scan/slower (goal <= 1.3)")
    for size, row in results.items():
        label = f"{size // bu.MiB} MiB"
        print(
            f"{label:<10} {statistics.median(row['plain']):>9.2f} s  "
            f"{statistics.median(row['clamd']):>9.2f} s  "
            f"{statistics.median(row['scanned']):>9.2f} s  "
            f"{statistics.median(row['ratio']):>8.2f}x"
            f"  (rounds: {', '.join(f'{r:.2f}' for r in row['ratio'])})"
        )
    ratio = statistics.median(small["scanned"]) / statistics.median(small["plain"])
    print(
        f"10 x 10 KB per request: {statistics.median(small['plain']):.1f} ms without scanning, "
        f"{statistics.median(small['scanned']):.1f} ms with ({ratio:.2f}x)"
    )
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
