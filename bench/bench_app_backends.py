"""The app on both storage backends, side by side: issue 29's figures.

    .venv/bin/python bench/bench_app_backends.py [--rounds 2] [--quick] [--json FILE]

In one run on one machine, `make run`'s server (gunicorn with the gevent worker, two
workers; tests/support/live_server.py) with accounts on, every request carrying the API
token of a user provisioned before the server starts (tests/helpers.py):

- `local`: `storage.backend: local`, its data dir and the SQLite database in it;
- `s3` (instance A): `storage.backend: s3` against SeaweedFS's `weed server` on loopback
  (tests/support/seaweedfs.py), with a data dir of its own and the records in a SQLite
  file outside it;
- `s3, second instance` (B): the same bucket and the same database, a data dir of its own
  that is empty at first, as a new instance behind a load balancer would start.

Each round, the order of the backends alternating:

- a 1 GiB upload through `POST /api/threads/{id}/uploads` into a new thread, the body
  streamed from one random MiB (never held by the client): MiB/s, and the server's peak
  RSS (VmRSS summed over gunicorn's arbiter and workers, /proc, every 20 ms) with its
  growth over the value just before. The time is split where the client has sent its last
  byte: streaming the body (to the staging file) and what follows until the answer (on s3
  the push of the staged bytes to the bucket, then the commit), with the server's and
  SeaweedFS's CPU seconds in each part;
- a 100 MiB upload (not timed) into a new thread, then two downloads of it. Local: both
  from the instance that stored it. S3: both from B, whose working copy lacks the file:
  the first streams from the bucket as it arrives and is kept as B's copy once sent whole,
  the repeat is sent from that copy;
- the same number of bytes put straight into the bucket by boto3's own transfer manager
  (`upload_fileobj`: 8 MiB parts, ten at a time), with no app in the way: the most this
  S3 server takes on this machine, so that the app's upload reads against it as well as
  against local disk (`s3 app / bucket alone`);
- GETs of the list of a thread of 1,000 files (filled through the API before the first
  round), each on a new connection: median and p99; on s3 on A and on B.

Ratios s3/local are taken inside each round; the median across rounds is reported. The
machine's state of memory moves write speeds several-fold, so before every timed write as
many bytes are written to the same disk and deleted, then `sync` (as bench_uploads.py does).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
# Accounts on, whatever the shell says: tests.helpers reads the mode when it is imported.
os.environ.pop("DEER_FLOW_AUTH_DISABLED", None)

from bench_uploads import BLOCK  # noqa: E402
from bench_uploads import CLK_TCK  # noqa: E402
from bench_uploads import MAX_RSS_GROWTH  # noqa: E402
from bench_uploads import BenchError  # noqa: E402
from bench_uploads import GiB  # noqa: E402
from bench_uploads import MiB  # noqa: E402
from bench_uploads import Sizes  # noqa: E402
from bench_uploads import aborted  # noqa: E402
from bench_uploads import cpu_ticks  # noqa: E402
from bench_uploads import download  # noqa: E402
from bench_uploads import list_uploads  # noqa: E402
from bench_uploads import measured  # noqa: E402
from bench_uploads import pick_root  # noqa: E402
from bench_uploads import populate_list_thread  # noqa: E402
from bench_uploads import post_files  # noqa: E402
from bench_uploads import prepare_write  # noqa: E402
from bench_uploads import process_tree  # noqa: E402

from tests.helpers import SERVER_TOKEN  # noqa: E402
from tests.helpers import provision_server_user  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402
from tests.support.seaweedfs import ACCESS_KEY  # noqa: E402
from tests.support.seaweedfs import SECRET_KEY  # noqa: E402
from tests.support.seaweedfs import SeaweedFS  # noqa: E402
from tests.support.seaweedfs import weed_missing  # noqa: E402

BUCKET = "deerflow-bench"
PREFIX = "bench"
AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"}
LIST_FILES = 1000
LIST_THREAD = "list-thread"
FILL_PER_REQUEST = 100  # files per request while the list thread is filled (not timed)

# Issue 29's goals.
MIN_UPLOAD_RATIO = 0.5  # s3/local upload speed
MAX_LIST_RATIO = 1.2  # s3/local median list latency: "unchanged", within this machine's noise


@dataclass(frozen=True)
class Plan:
    upload: int = GiB
    download: int = 100 * MiB
    lists: int = 100  # list GETs per instance per round


QUICK = Plan(upload=256 * MiB, download=32 * MiB, lists=30)


@dataclass
class Backend:
    """One backend under test: the instance that uploads, and the one that reads back."""

    name: str
    writer: LiveServer
    reader: LiveServer
    figures: dict[str, list[float]] = field(default_factory=dict)

    def instances(self) -> list[tuple[str, LiveServer]]:
        """(suffix of its figures, server): the writer, and the reader when it is another."""
        second = [("_second", self.reader)] if self.reader is not self.writer else []
        return [("", self.writer), *second]

    def add(self, key: str, value: float) -> None:
        self.figures.setdefault(key, []).append(value)


def cpu_seconds(pids: list[int]) -> float:
    return sum(u + s for u, s in cpu_ticks(pids).values()) / CLK_TCK


def upload_big(
    backend: Backend,
    weed: list[int],
    others: list[LiveServer],
    thread_id: str,
    size: int,
    primer: Sizes,
) -> str:
    """The timed upload, split where the client sent its last byte; one line for the log.
    `others`: the run's other servers, whose CPU meanwhile should be next to nothing."""
    server = backend.writer
    pids = process_tree(server.pid)
    bystanders = [pid for other in others for pid in process_tree(other.pid)]
    prepare_write(primer, size)
    marks: dict[str, float] = {}

    def on_sent() -> None:
        marks.update(
            sent=time.perf_counter(), server_cpu=cpu_seconds(pids), weed_cpu=cpu_seconds(weed)
        )

    server_before, weed_before = cpu_seconds(pids), cpu_seconds(weed)
    bystanders_before = cpu_seconds(bystanders)
    with measured(pids) as sample:
        started = time.perf_counter()
        post_files(server.port, thread_id, [("big.bin", size)], AUTH, on_sent)
    done = time.perf_counter()
    server_after, weed_after = cpu_seconds(pids), cpu_seconds(weed)
    sample.bytes = size
    backend.add("upload_others_cpu", cpu_seconds(bystanders) - bystanders_before)
    backend.add("upload_mibs", sample.mibs)
    backend.add("upload_peak_rss_mib", sample.peak_rss / MiB)
    backend.add("upload_rss_growth_mib", sample.rss_growth / MiB)
    backend.add("upload_body_s", marks["sent"] - started)
    backend.add("upload_after_s", done - marks["sent"])
    backend.add("upload_body_server_cpu", marks["server_cpu"] - server_before)
    backend.add("upload_after_server_cpu", server_after - marks["server_cpu"])
    backend.add("upload_body_weed_cpu", marks["weed_cpu"] - weed_before)
    backend.add("upload_after_weed_cpu", weed_after - marks["weed_cpu"])
    return (
        f"{sample.mibs:7.1f} MiB/s  peak RSS {sample.peak_rss / MiB:5.0f} MiB "
        f"(+{sample.rss_growth / MiB:.0f})  body {marks['sent'] - started:5.1f} s, "
        f"then {done - marks['sent']:5.1f} s"
    )


class _Repeated:
    """`size` bytes of one random MiB over and over, read as a file (never held whole)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        out = bytearray()
        while len(out) < n:
            out += BLOCK[: n - len(out)]
        self.left -= n
        return bytes(out)


def bucket_alone(backend: Backend, weed: SeaweedFS, weed_pids: list[int], size: int) -> str:
    """`size` bytes into the bucket by boto3's transfer manager, no app in the way."""
    client = weed.store(BUCKET, prefix=PREFIX).client
    key = f"{PREFIX}/bench-bucket-alone"
    before = cpu_seconds(weed_pids)
    started = time.perf_counter()
    client.upload_fileobj(_Repeated(size), BUCKET, key)
    elapsed = time.perf_counter() - started
    weed_cpu = cpu_seconds(weed_pids) - before
    client.delete_object(Bucket=BUCKET, Key=key)
    mibs = size / MiB / elapsed
    backend.add("bucket_alone_mibs", mibs)
    backend.add("bucket_alone_weed_cpu", weed_cpu)
    return f"{mibs:7.1f} MiB/s  SeaweedFS CPU {weed_cpu:.1f} s"


def downloads(backend: Backend, thread_id: str, size: int) -> str:
    """Store `size` bytes through the writer (not timed); download them twice from the reader."""
    post_files(backend.writer.port, thread_id, [("medium.bin", size)], AUTH)
    reader = backend.reader
    spoken = []
    for key in ("download_first_mibs", "download_repeat_mibs"):
        os.sync()
        with measured(process_tree(reader.pid)) as sample:
            got = download(reader.port, thread_id, "medium.bin", AUTH)
        if got != size:
            raise BenchError(f"{backend.name} sent {got} bytes of {thread_id}, expected {size}")
        sample.bytes = size
        backend.add(key, sample.mibs)
        backend.add(key.replace("mibs", "peak_rss_mib"), sample.peak_rss / MiB)
        spoken.append(f"{sample.mibs:7.0f} MiB/s")
    return "first " + spoken[0] + ", repeat " + spoken[1]


def lists(backend: Backend, count: int) -> str:
    spoken = []
    for suffix, server in backend.instances():
        latencies = []
        for _ in range(count):
            started = time.perf_counter()
            list_uploads(server.port, LIST_THREAD, parse=False, headers=AUTH)
            latencies.append((time.perf_counter() - started) * 1000)
        backend.add("list_median_ms" + suffix, statistics.median(latencies))
        backend.figures.setdefault("list_samples_ms" + suffix, []).extend(latencies)
        spoken.append(f"median {statistics.median(latencies):6.1f} ms")
    return ", second instance ".join(spoken)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def start_instance(
    data_dir: Path, config: Path, log: Path, database_url: str | None, env: dict[str, str]
) -> LiveServer:
    data_dir.mkdir(parents=True)
    provision_server_user(data_dir, database_url=database_url)
    server = LiveServer(
        data_dir, config=config, database_url=database_url, workers=2, env=env, log=log
    )
    try:
        return server.start()
    except AssertionError as error:
        raise BenchError(str(error)) from error


def run(args: argparse.Namespace, plan: Plan, rounds: int, root: Path) -> int:
    config = root / "config.yaml"
    limit = plan.upload + 64 * MiB
    config.write_text(
        "uploads:\n"
        f"  max_file_size: {limit}\n  max_total_size: {limit}\n  max_files: {FILL_PER_REQUEST}\n",
        encoding="utf-8",
    )
    primer = Sizes(primer_dir=root)
    servers: list[LiveServer] = []
    weed = SeaweedFS.start(root / "seaweedfs", volume_size_mb=512, max_volumes=64)
    try:
        weed.store(BUCKET, prefix=PREFIX)  # creates the bucket
        s3_env = {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "DEER_FLOW_STORAGE_BACKEND": "s3",
            "DEER_FLOW_STORAGE_S3_ENDPOINT_URL": weed.endpoint_url,
            "DEER_FLOW_STORAGE_S3_BUCKET": BUCKET,
            "DEER_FLOW_STORAGE_S3_REGION": "us-east-1",
            "DEER_FLOW_STORAGE_S3_PREFIX": PREFIX,
        }
        (root / "shared").mkdir()
        shared_db = f"sqlite:///{root / 'shared' / 'records.sqlite3'}"
        print("starting the servers ...", flush=True)
        local = start_instance(root / "local", config, root / "local.log", None, {})
        servers.append(local)
        first = start_instance(root / "s3-a", config, root / "s3-a.log", shared_db, s3_env)
        servers.append(first)
        second = start_instance(root / "s3-b", config, root / "s3-b.log", shared_db, s3_env)
        servers.append(second)
        backends = [Backend("local", local, local), Backend("s3", first, second)]
        weed_pids = [weed.process.pid] if weed.process is not None else []

        started = time.monotonic()
        with ThreadPoolExecutor(len(backends)) as pool:  # not timed: both at once
            fills = [
                pool.submit(
                    populate_list_thread, b.writer, LIST_THREAD, LIST_FILES, AUTH, FILL_PER_REQUEST
                )
                for b in backends
            ]
            for fill in fills:
                fill.result()
        for backend in backends:
            for _, server in backend.instances():
                listed = list_uploads(server.port, LIST_THREAD, headers=AUTH) or {}
                if listed.get("count") != LIST_FILES:
                    raise BenchError(f"{backend.name} lists {listed.get('count')} files")
        print(f"list threads of {LIST_FILES:,} files filled in {time.monotonic() - started:.0f} s")

        for number in range(rounds):
            order = backends if number % 2 == 0 else backends[::-1]
            load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
            print(
                f"\nround {number + 1}/{rounds} (order: {', '.join(b.name for b in order)}; "
                f"load {load})",
                flush=True,
            )
            for backend in order:
                others = [s for s in servers if s is not backend.writer]
                line = upload_big(backend, weed_pids, others, f"r{number}-big", plan.upload, primer)
                print(f"  upload {plan.upload // MiB} MiB     {backend.name:<6} {line}", flush=True)
            line = bucket_alone(backends[1], weed, weed_pids, plan.upload)
            print(f"  bucket alone {plan.upload // MiB} MiB  boto3  {line}", flush=True)
            for backend in order:
                line = downloads(backend, f"r{number}-download", plan.download)
                print(
                    f"  download {plan.download // MiB} MiB  {backend.name:<6} {line}", flush=True
                )
            for backend in order:
                line = lists(backend, plan.lists)
                print(f"  list {LIST_FILES:,}       {backend.name:<6} {line}", flush=True)
        checks = report(backends, plan, rounds)
        out = args.json or BENCH / "results" / time.strftime("app-backends-%Y%m%d-%H%M%S.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "plan": plan.__dict__,
                    "rounds": rounds,
                    "database": "SQLite",
                    "figures": {b.name: b.figures for b in backends},
                    "checks": [{"goal": goal, "passed": passed} for goal, passed in checks],
                },
                indent=2,
            ),
            encoding="utf-8",
        )
        print(f"raw figures: {out}")
        return 0 if all(passed for _, passed in checks) else 1
    finally:
        for server in reversed(servers):
            server.kill()
        weed.close()


def rows(plan: Plan) -> list[tuple[str, str, str, str, bool]]:
    """The table: (label, figure, how rounds combine, format, whether s3/local is shown)."""
    up = f"{plan.upload // GiB} GiB" if plan.upload >= GiB else f"{plan.upload // MiB} MiB"
    down = f"{plan.download // MiB} MiB"
    files = f"{LIST_FILES:,} files"
    return [
        (f"upload {up}, MiB/s", "upload_mibs", "median", ".1f", True),
        (
            "  server peak RSS (arbiter + 2 workers), MiB",
            "upload_peak_rss_mib",
            "max",
            ".0f",
            False,
        ),
        ("  growth over idle, MiB", "upload_rss_growth_mib", "max", ".0f", False),
        ("  body streamed, s", "upload_body_s", "median", ".2f", False),
        ("    server CPU, s", "upload_body_server_cpu", "median", ".2f", False),
        ("    SeaweedFS CPU, s", "upload_body_weed_cpu", "median", ".2f", False),
        ("  after the body until the answer, s", "upload_after_s", "median", ".2f", False),
        ("    server CPU, s", "upload_after_server_cpu", "median", ".2f", False),
        ("    SeaweedFS CPU, s", "upload_after_weed_cpu", "median", ".2f", False),
        ("  the other servers' CPU meanwhile, s", "upload_others_cpu", "max", ".2f", False),
        (f"bucket alone, {up} by boto3, MiB/s", "bucket_alone_mibs", "median", ".1f", False),
        ("    SeaweedFS CPU, s", "bucket_alone_weed_cpu", "median", ".2f", False),
        (f"download {down}, first, MiB/s", "download_first_mibs", "median", ".0f", True),
        (f"download {down}, repeat, MiB/s", "download_repeat_mibs", "median", ".0f", True),
        (
            "  reader's peak RSS, first download, MiB",
            "download_first_peak_rss_mib",
            "max",
            ".0f",
            False,
        ),
        (f"list of {files}, median ms", "list_median_ms", "median", ".1f", True),
        (f"list of {files}, p99 ms", "list_samples_ms", "p99", ".1f", False),
        (
            f"list of {files}, second instance, median ms",
            "list_median_ms_second",
            "median",
            ".1f",
            False,
        ),
        (
            f"list of {files}, second instance, p99 ms",
            "list_samples_ms_second",
            "p99",
            ".1f",
            False,
        ),
    ]


COMBINE = {"median": statistics.median, "max": max, "p99": p99}


def report(backends: list[Backend], plan: Plan, rounds: int) -> list[tuple[str, bool]]:
    """Print the table and the goals; return (goal, passed)."""
    local, s3 = backends[0].figures, backends[1].figures

    def ratios(key: str) -> list[float]:
        return [b / a for a, b in zip(local[key], s3[key], strict=True) if a]

    print(f"\n{rounds} round(s); accounts on (API token), SQLite; s3 = SeaweedFS on loopback")
    print(f"{'':<50} {'local':>9} {'s3':>9} {'s3/local':>9}  (per round)")
    for label, key, how, fmt, with_ratio in rows(plan):
        cells = [
            format(COMBINE[how](side[key]), fmt) if key in side else "-" for side in (local, s3)
        ]
        ratio = spread = ""
        if with_ratio:
            each = ratios(key)
            ratio = f"{statistics.median(each):.2f}x"
            spread = "  (" + ", ".join(f"{r:.2f}" for r in each) + ")"
        print(f"{label:<50} {cells[0]:>9} {cells[1]:>9} {ratio:>9}{spread}")
    print(
        "\nlocal: both downloads from the instance that stored the file; s3: both from the "
        "second instance,\nwhose working copy lacks the file: the first streamed from the "
        "bucket and kept, the repeat sent from B's copy. "
        f"{plan.lists} list GETs per instance per round."
    )
    upload_ratio = statistics.median(ratios("upload_mibs"))
    of_bucket = statistics.median(
        a / b for a, b in zip(s3["upload_mibs"], s3["bucket_alone_mibs"], strict=True)
    )
    print(f"s3 app / bucket alone, upload: {of_bucket:.2f}x (median of rounds)")
    list_ratio = statistics.median(ratios("list_median_ms"))
    growth = max(s3["upload_rss_growth_mib"] + local["upload_rss_growth_mib"])
    checks = [
        (
            f"upload s3/local {upload_ratio:.2f}x >= {MIN_UPLOAD_RATIO}x",
            upload_ratio >= MIN_UPLOAD_RATIO,
        ),
        (
            f"list latency s3/local {list_ratio:.2f}x <= {MAX_LIST_RATIO}x (unchanged)",
            list_ratio <= MAX_LIST_RATIO,
        ),
        (
            f"server RSS growth during the upload {growth:.0f} MiB < "
            f"{MAX_RSS_GROWTH // MiB} MiB (both backends)",
            growth < MAX_RSS_GROWTH / MiB,
        ),
    ]
    print()
    for goal, passed in checks:
        print(f"{'PASS' if passed else 'FAIL'}  {goal}")
    return checks


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (--quick: 1)")
    parser.add_argument("--quick", action="store_true", help="256 MiB upload, 32 MiB download")
    parser.add_argument("--data-root", type=Path, help="parent of the temporary data dir")
    parser.add_argument("--json", type=Path, help="where to write the raw figures")
    args = parser.parse_args()
    plan = QUICK if args.quick else Plan()
    rounds = args.rounds or (1 if args.quick else 2)
    signal.signal(signal.SIGTERM, _interrupt)
    # The readiness probe's failed attempts while SeaweedFS starts are logged by the store;
    # they are expected, and its errors reach this process as exceptions anyway.
    logging.getLogger("deerflow_web").addHandler(logging.NullHandler())
    if (reason := weed_missing()) is not None:
        print(reason, file=sys.stderr)
        return 2
    root = pick_root(args.data_root)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"data under {root}; {os.cpu_count()} CPUs, load average {load}")
    started = time.monotonic()
    try:
        return run(args, plan, rounds, root)
    except (KeyboardInterrupt, BenchError) as error:
        return aborted(error)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        print(f"({time.monotonic() - started:.0f} s in all)")


if __name__ == "__main__":
    sys.exit(main())
