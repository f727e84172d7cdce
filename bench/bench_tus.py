"""Resumable upload benchmark: a 1 GiB file over tus in 8 MiB PATCHes against the same file
in one multipart upload, on `make run`'s server, in the same rounds.

    .venv/bin/python bench/bench_tus.py [--rounds 3] [--quick] [--chunk-mib 8]

The server is started exactly as bench_uploads.py starts it (`make run` with a temporary
data dir and limits raised to fit the file). Each round uploads the file both ways, the
order alternating between rounds; `sync` runs before each measured upload. Reported: the
median throughput of each way, the median of the per-round ratios (tus / multipart) and the
server's CPU seconds per GiB (user + system, whole process tree). The tus figure includes
the creation request and the commit at the end (which reads the file once more to hash it).
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_uploads import BenchError  # noqa: E402
from bench_uploads import GiB  # noqa: E402
from bench_uploads import MiB  # noqa: E402
from bench_uploads import Sample  # noqa: E402
from bench_uploads import Target  # noqa: E402
from bench_uploads import _connect  # noqa: E402
from bench_uploads import _send_repeated  # noqa: E402
from bench_uploads import measured  # noqa: E402
from bench_uploads import pick_root  # noqa: E402
from bench_uploads import post_files  # noqa: E402
from bench_uploads import start_ours  # noqa: E402

TUS = "1.0.0"


def tus_upload(port: int, thread_id: str, name: str, size: int, chunk: int) -> None:
    """Create a tus upload and send it in `chunk`-byte PATCHes over one kept-alive
    connection, each body streamed from the benchmark's random block."""
    conn = _connect(port)
    try:
        metadata = "filename " + base64.b64encode(name.encode()).decode()
        conn.request(
            "POST",
            f"/api/threads/{thread_id}/uploads/tus",
            headers={"Tus-Resumable": TUS, "Upload-Length": str(size), "Upload-Metadata": metadata},
        )
        response = conn.getresponse()
        response.read()
        if response.status != 201:
            raise BenchError(f"tus creation answered {response.status}")
        location = response.getheader("Location")
        offset = 0
        while offset < size:
            length = min(chunk, size - offset)
            conn.putrequest("PATCH", location, skip_accept_encoding=True)
            conn.putheader("Tus-Resumable", TUS)
            conn.putheader("Upload-Offset", str(offset))
            conn.putheader("Content-Type", "application/offset+octet-stream")
            conn.putheader("Content-Length", str(length))
            conn.endheaders()
            _send_repeated(conn.sock, length)
            response = conn.getresponse()
            body = response.read()
            if response.status != 204:
                raise BenchError(f"PATCH at {offset} answered {response.status}: {body[:200]!r}")
            offset = int(response.getheader("Upload-Offset"))
    finally:
        conn.close()


def listed_size(target: Target, thread_id: str, name: str) -> int:
    conn = _connect(target.port)
    try:
        conn.request("GET", f"/api/threads/{thread_id}/uploads/list")
        files = json.loads(conn.getresponse().read())["files"]
    finally:
        conn.close()
    sizes = {f["filename"]: f["size"] for f in files}
    return sizes.get(name, -1)


def run_one(target: Target, way: str, thread_id: str, size: int, chunk: int) -> Sample:
    subprocess.run(["sync"], check=False)
    with measured(target.pids()) as sample:
        if way == "tus":
            tus_upload(target.port, thread_id, "big.bin", size, chunk)
        else:
            post_files(target.port, thread_id, [("big.bin", size)])
    sample.bytes = size
    if listed_size(target, thread_id, "big.bin") != size:
        raise BenchError(f"{way}: the stored file does not have {size} bytes")
    target.drop_thread(thread_id)
    return sample


def main() -> int:
    parser = argparse.ArgumentParser(description="tus vs multipart upload benchmark.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="256 MiB instead of 1 GiB")
    parser.add_argument("--chunk-mib", type=int, default=8, help="PATCH size in MiB")
    parser.add_argument("--data-root", type=Path, help="parent of the temporary data dir")
    args = parser.parse_args()
    size = 256 * MiB if args.quick else GiB
    chunk = args.chunk_mib * MiB

    root = pick_root(args.data_root)
    config = root / "config.yaml"
    limit = 2 * size
    config.write_text(
        f"uploads:\n  max_file_size: {limit}\n  max_total_size: {limit}\n", encoding="utf-8"
    )
    target: Target | None = None
    samples: dict[str, list[Sample]] = {"multipart": [], "tus": []}
    ratios: list[float] = []
    try:
        print("starting the server ...")
        target = start_ours(root, config)
        print(f"server: {target.command}")
        print(f"file: {size // MiB} MiB; tus PATCHes of {args.chunk_mib} MiB")
        for index in range(args.rounds):
            order = ["multipart", "tus"] if index % 2 == 0 else ["tus", "multipart"]
            got: dict[str, Sample] = {}
            for way in order:
                got[way] = run_one(target, way, f"bench-{way}-{index}", size, chunk)
                samples[way].append(got[way])
            ratios.append(got["tus"].mibs / got["multipart"].mibs)
            print(
                f"round {index + 1}: multipart {got['multipart'].mibs:7.0f} MiB/s "
                f"{got['multipart'].cpu_per_gib:5.2f} CPU-s/GiB | "
                f"tus {got['tus'].mibs:7.0f} MiB/s {got['tus'].cpu_per_gib:5.2f} CPU-s/GiB | "
                f"ratio {ratios[-1]:.2f}"
            )
        print()
        for way, runs in samples.items():
            print(
                f"{way:9s} median {statistics.median(s.mibs for s in runs):7.0f} MiB/s, "
                f"server CPU {statistics.median(s.cpu_per_gib for s in runs):.2f} s/GiB "
                f"(system {statistics.median(s.sys_per_gib for s in runs):.2f}), "
                f"peak RSS growth {max(s.rss_growth for s in runs) / MiB:.0f} MiB"
            )
        ratio = statistics.median(ratios)
        print(f"throughput ratio tus / multipart (median of rounds): {ratio:.2f}")
        return 0
    except KeyboardInterrupt:
        return 130
    except BenchError as error:
        print(f"benchmark aborted: {error}", file=sys.stderr)
        return 2
    finally:
        if target is not None:
            target.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
