"""One instance against two on one data dir, and list latency by database.

    .venv/bin/python bench/bench_instances.py [--rounds 2] [--quick]
    DATABASE_URL=postgresql+psycopg://... .venv/bin/python bench/bench_instances.py

Instances are `make run`'s server (tests/live_server.py: gunicorn with the gevent worker,
two workers each), single-user, on one temporary data dir. Figures:

- **uploads**: 16 client threads each upload 10 MiB files as fast as they can, to one
  instance, or alternately to two (as a round-robin load balancer would): MB/s over the
  whole run, p50 and p99 of one upload. Rounds alternate one/two, and the two/one ratio is
  taken inside each round. On a 2-core machine expect little gain; the point is that nothing
  serialises on a lock shared by the instances (the records database, the data dir).
- **list**: GET `/uploads/list` of a thread of 1,000 and of 10,000 files (median and p99 of
  repeated GETs, each on a new connection), with the default SQLite database and, when
  `DATABASE_URL` is set, with that database (a note is printed otherwise).
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.live_server import LiveServer  # noqa: E402

MIB = 1024 * 1024
CLIENTS = 16
BOUNDARY = "benchboundary"


def multipart(name: str, data: bytes) -> bytes:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def post(port: int, path: str, body: bytes) -> float:
    """One upload on a new connection; its duration in seconds."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        connection.request(
            "POST",
            path,
            body=body,
            headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
        )
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise SystemExit(f"upload answered {response.status}: {answer[:300]!r}")
    return time.perf_counter() - started


def get(port: int, path: str) -> float:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise SystemExit(f"GET {path} answered {response.status}")
    return time.perf_counter() - started


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def start(data: Path, count: int, database_url: str | None = None) -> list[LiveServer]:
    servers = [
        LiveServer(data, single_user=True, database_url=database_url, workers=2)
        for _ in range(count)
    ]
    for server in servers:
        server.start()
    return servers


def upload_round(ports: list[int], per_client: int, size: int, tag: str) -> dict[str, float]:
    """16 clients, `per_client` uploads each, spread over `ports` in turn."""
    payload = os.urandom(size)
    bodies = [multipart(f"c{c}-{tag}.bin", payload) for c in range(CLIENTS)]
    barrier = threading.Barrier(CLIENTS)
    latencies: list[float] = []

    def client(index: int) -> list[float]:
        barrier.wait()
        own = []
        for number in range(per_client):
            port = ports[(index + number) % len(ports)]
            own.append(
                post(port, f"/api/threads/bench-{tag}-{index}-{number}/uploads", bodies[index])
            )
        return own

    started = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        for own in pool.map(client, range(CLIENTS)):
            latencies.extend(own)
    elapsed = time.perf_counter() - started
    total = CLIENTS * per_client * size
    return {
        "mbps": total / elapsed / 1e6,
        "p50": statistics.median(latencies) * 1000,
        "p99": percentile(latencies, 0.99) * 1000,
    }


def populate(port: int, thread_id: str, count: int) -> None:
    """`count` small files through the API, ten per request, eight requests at a time."""

    def batch(first: int) -> None:
        parts = b"".join(
            (
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; '
                f'filename="f{n:05}.txt"\r\nContent-Type: text/plain\r\n\r\n'
            ).encode()
            + f"file {n}\n".encode()
            + b"\r\n"
            for n in range(first, min(first + 10, count))
        )
        post(port, f"/api/threads/{thread_id}/uploads", parts + f"--{BOUNDARY}--\r\n".encode())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(batch, range(0, count, 10)))


def list_latency(port: int, thread_id: str, gets: int) -> dict[str, float]:
    get(port, f"/api/threads/{thread_id}/uploads/list")  # warm
    samples = [get(port, f"/api/threads/{thread_id}/uploads/list") for _ in range(gets)]
    return {
        "median": statistics.median(samples) * 1000,
        "p99": percentile(samples, 0.99) * 1000,
    }


def timed_section(title: str, body: Callable[[], None]) -> None:
    print(f"\n## {title}", flush=True)
    started = time.monotonic()
    body()
    print(f"({time.monotonic() - started:.0f} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer uploads, lists of 1,000 only")
    parser.add_argument("--lists-only", action="store_true", help="skip the upload rounds")
    args = parser.parse_args()
    per_client = 2 if args.quick else 4
    list_sizes = [1000] if args.quick else [1000, 10_000]
    print(f"# deerflow-web: instances ({os.cpu_count()} CPUs; figures are indicative on a")
    print("# shared machine: compare within one run, never across runs)")
    root = Path(tempfile.mkdtemp(prefix="bench-instances-"))
    try:

        def uploads() -> None:
            ratios = []
            for number in range(args.rounds):
                figures = {}
                for count in (1, 2) if number % 2 == 0 else (2, 1):
                    data = root / f"uploads-{number}-{count}"
                    servers = start(data, count)
                    try:
                        ports = [s.port for s in servers]
                        figures[count] = upload_round(ports, per_client, 10 * MIB, f"r{number}")
                    finally:
                        for server in servers:
                            server.kill()
                        shutil.rmtree(data, ignore_errors=True)
                    f = figures[count]
                    print(
                        f"round {number + 1}, {count} instance(s): {f['mbps']:7.1f} MB/s, "
                        f"upload p50 {f['p50']:6.0f} ms, p99 {f['p99']:6.0f} ms",
                        flush=True,
                    )
                ratios.append(figures[2]["mbps"] / figures[1]["mbps"])
            print(
                f"two/one throughput ratio: median {statistics.median(ratios):.2f} "
                f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)}); "
                f"{CLIENTS} clients x {per_client} uploads of 10 MiB per round"
            )

        def lists() -> None:
            databases: list[tuple[str, str | None]] = [("SQLite (default)", None)]
            if os.environ.get("DATABASE_URL"):
                databases.append(("DATABASE_URL", os.environ["DATABASE_URL"]))
            else:
                print("note: DATABASE_URL is not set; PostgreSQL figures skipped")
            for label, url in databases:
                data = root / f"list-{len(label)}"
                [server] = start(data, 1, url)
                try:
                    for size in list_sizes:
                        populate(server.port, f"list-{size}", size)
                        f = list_latency(server.port, f"list-{size}", 30 if size <= 1000 else 10)
                        print(
                            f"{label}: list of {size:>6,} files: median {f['median']:7.1f} ms, "
                            f"p99 {f['p99']:7.1f} ms",
                            flush=True,
                        )
                    if url is not None and (data / "uploads.sqlite3").exists():
                        print(
                            "note: the upload records stayed in uploads.sqlite3 in the data dir: "
                            "these figures are SQLite's, DATABASE_URL served accounts only"
                        )
                finally:
                    server.kill()
                    shutil.rmtree(data, ignore_errors=True)

        if not args.lists_only:
            timed_section("16 clients uploading 10 MiB files: one instance vs two", uploads)
        timed_section("list latency", lists)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
