"""Many people at once: slow clients, no regression, lists at scale (see bench/README.md).

    .venv/bin/python bench/bench_scale.py [--rounds 10] [--quick] [--compare-slow]

Targets, all started by this script on free loopback ports with their own data dirs:

- `new`: `make run` exactly as it is (today: the gevent worker of web/transport/server.py);
- `gthread`: the previous `make run` (gunicorn gthread, 2 workers x 8 threads), the
  reference for the no-regression ratios;
- `naive`: bench/naive_app.py (listdir + stat) for the list baseline.

Scenarios and goals (PASS/FAIL at the end):

1. 500 slow uploads (1 MB each at 100 KB/s) on `new`: all stored, a fast client's list
   p99 < 100 ms meanwhile, server RSS < 300 MiB; the same with 500 slow downloads.
   `--compare-slow` runs them on `gthread` too (capped, it cannot finish them in time).
2. Same rounds, new/gthread: 1 GiB upload >= 1.0x, 100 MiB download >= 1.0x, 8 concurrent
   10 MiB uploads >= 1.0x. The rounds come in pairs, one in each order; a pair's ratio is
   the geometric mean of its two, and the goal is checked on the median pair.
3. `uploads/list` of 1,000 files: new <= 0.5x naive's latency (same rounds); 10,000 files
   < 50 ms; the thread page of 10,000 files < 300 ms.

The slow clients run in a child process (bench/slow_clients.py) so their CPU never delays
the latency probe's own clock. File descriptors are raised to the hard limit first.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import bench_uploads as bu

REPO = bu.REPO
MiB = bu.MiB
GiB = bu.GiB

SLOW_CLIENTS = 500
SLOW_SIZE = 1_000_000
SLOW_RATE = 100_000
PROBE_INTERVAL = 0.05
MAX_PROBE_P99_MS = 100.0
MAX_SLOW_RSS = 300 * MiB
MAX_LIST_RATIO = 0.5
MAX_LIST_10K_MS = 50.0
MAX_PAGE_MS = 300.0

PREVIOUS_RUN = [  # `make run` before the gevent worker, for the same-round ratios
    "--worker-class",
    "gthread",
    "--workers",
    "2",
    "--threads",
    "8",
    "--timeout",
    "600",
    "--graceful-timeout",
    "30",
    "--no-control-socket",
    "--access-logfile",
    "-",
    "app:app",
]


@dataclass(frozen=True)
class Sizes:
    big: int = GiB
    medium: int = 100 * MiB
    medium_downloads: int = 10  # per round: one 100 MiB download lasts only ~30 ms
    concurrent: int = 10 * MiB
    concurrent_clients: int = 8
    concurrent_bursts: int = 5  # per round
    slow_clients: int = SLOW_CLIENTS
    list_gets: int = 30
    page_gets: int = 10


QUICK = Sizes(big=256 * MiB, medium=32 * MiB, slow_clients=100, list_gets=10, page_gets=5)


def start_previous(root: Path, config: Path) -> bu.Target:
    target = bu.Target("gthread", root / "gthread", port=bu.free_port(), log=root / "gt.log")
    env = bu.server_env(target.data_dir, config)
    command = [str(REPO / ".venv" / "bin" / "gunicorn"), "--bind", f"{bu.HOST}:{target.port}"]
    command += PREVIOUS_RUN
    target.launch(command, env)
    target.wait_ready(90)
    target.command = " ".join(command)
    return target


def start_new(root: Path, config: Path) -> bu.Target:
    target = bu.start_ours(root, config)
    target.name = "new"
    return target


# --- slow clients ----------------------------------------------------------------------


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def slow_scenario(target: bu.Target, mode: str, sizes: Sizes, cap: float) -> dict:
    """Run the slow clients against `target` while probing a small list every 50 ms."""
    command = [
        sys.executable,
        str(REPO / "bench" / "slow_clients.py"),
        mode,
        "--port",
        str(target.port),
        "--clients",
        str(sizes.slow_clients),
        "--size",
        str(SLOW_SIZE),
        "--rate",
        str(SLOW_RATE),
        "--thread-prefix",
        f"slow-{int(time.time())}",
        "--download-path",
        "/api/threads/slow-dl/artifacts/mnt/user-data/uploads/one-mb.bin",
        "--deadline",
        str(cap),
    ]
    latencies: list[float] = []
    at: list[float] = []  # when each probe started, seconds after the clients
    errors = 0
    with bu.measured(target.pids()) as sample:
        load = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        launched = time.perf_counter()
        time.sleep(1.5)  # let the clients connect first
        while load.poll() is None:
            started = time.perf_counter()
            try:
                bu.list_uploads(target.port, "probe", parse=False)
                latencies.append((time.perf_counter() - started) * 1000)
                at.append(started - launched)
            except (OSError, bu.BenchError):
                errors += 1
            time.sleep(PROBE_INTERVAL)
        outcome = json.loads(load.stdout.read().strip().splitlines()[-1])
    outcome.update(
        probes=len(latencies),
        probe_errors=errors,
        p50=statistics.median(latencies) if latencies else float("nan"),
        p99=percentile(latencies, 0.99) if latencies else float("nan"),
        max=max(latencies) if latencies else float("nan"),
        slowest=sorted(zip(latencies, at, strict=True), reverse=True)[:3],  # (ms, s in)
        peak_rss=sample.peak_rss,
        idle_rss=sample.idle_rss,
    )
    return outcome


def prepare_slow(target: bu.Target) -> None:
    bu.post_files(target.port, "probe", [(f"p{i:02d}.txt", 1000 + i) for i in range(10)])
    bu.post_files(target.port, "probe", [(f"q{i:02d}.txt", 2000 + i) for i in range(10)])
    bu.post_files(target.port, "slow-dl", [("one-mb.bin", SLOW_SIZE)])
    time.sleep(2.5)  # past the folder's settling time: lists answer from the records


# --- no regression ---------------------------------------------------------------------


def warm_page_cache(folder: Path, size: int) -> None:
    """Write and delete `size` bytes, so the next large write finds its memory warm.

    This machine is a virtual one whose host backs guest memory lazily: the first GiB
    written after other work spent a third of its time in the kernel's copy into the page
    cache (perf: `copy_folio_from_iter_atomic` 33% of samples, 8% when warm), and cost
    whichever server went first in a round up to 45% of its speed. Pages freed by a
    deleted file are the next ones handed out, so both servers start from the same state.
    """
    scratch = folder / "warm.bin"
    with open(scratch, "wb", buffering=0) as handle:
        for _ in range(size // len(bu.BLOCK)):
            handle.write(bu.BLOCK)
    scratch.unlink()


def upload_big(target: bu.Target, sizes: Sizes, round_no: int) -> tuple[float, float]:
    """MiB/s of one large upload, and the server's CPU seconds per GiB for it.

    The CPU figure is the steadier one on a shared machine: a neighbour's burst stretches
    the wall time, not the work the server did.
    """
    thread = f"big-{round_no}"
    warm_page_cache(target.data_dir.parent, sizes.big)
    subprocess.run(["sync"], check=False)
    with bu.measured(target.pids()) as sample:
        bu.post_files(target.port, thread, [("big.bin", sizes.big)])
    target.drop_thread(thread)
    return sizes.big / MiB / sample.wall, sample.server_cpu * GiB / sizes.big


def download_medium(target: bu.Target, sizes: Sizes) -> float:
    start = time.perf_counter()
    count = sizes.medium_downloads
    total = sum(bu.download(target.port, "medium", "medium.bin") for _ in range(count))
    return total / MiB / (time.perf_counter() - start)


def upload_concurrent(target: bu.Target, sizes: Sizes, round_no: int) -> float:
    """MiB/s of `concurrent_bursts` bursts of concurrent uploads, timed from each burst's
    start to its last upload's answer (one burst lasts about a tenth of a second here)."""
    megabytes = wall = 0.0
    for burst in range(sizes.concurrent_bursts):
        megabytes_burst, wall_burst = _concurrent_burst(target, sizes, f"conc-{round_no}-{burst}")
        megabytes += megabytes_burst
        wall += wall_burst
    return megabytes / wall


def _concurrent_burst(target: bu.Target, sizes: Sizes, thread: str) -> tuple[float, float]:
    barrier = threading.Barrier(sizes.concurrent_clients + 1)
    errors: list[BaseException] = []

    def client(index: int) -> None:
        barrier.wait()
        try:
            bu.post_files(target.port, f"{thread}-{index}", [("c.bin", sizes.concurrent)])
        except BaseException as error:  # reported below
            errors.append(error)

    workers = [threading.Thread(target=client, args=(i,)) for i in range(sizes.concurrent_clients)]
    for worker in workers:
        worker.start()
    warm_page_cache(target.data_dir.parent, sizes.concurrent * sizes.concurrent_clients)
    subprocess.run(["sync"], check=False)
    barrier.wait()
    start = time.perf_counter()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - start
    for index in range(sizes.concurrent_clients):
        target.drop_thread(f"{thread}-{index}")
    if errors:
        raise bu.BenchError(f"concurrent upload failed: {errors[0]}")
    return sizes.concurrent * sizes.concurrent_clients / MiB, wall


# --- lists -----------------------------------------------------------------------------


def populate_on_disk(target: bu.Target, thread: str, count: int) -> None:
    """Files written straight into the folder; the server's first list records them."""
    folder = target.thread_dir(thread) / "user-data" / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        (folder / f"file-{index:05d}.txt").write_bytes(b"line %d\n" % index)


def timed_gets(port: int, path: str, count: int) -> float:
    """Median latency in ms of `count` GETs, each on a new connection, body read."""
    import http.client

    samples = []
    for _ in range(count):
        start = time.perf_counter()
        conn = http.client.HTTPConnection(bu.HOST, port, timeout=120)
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        conn.close()
        if response.status != 200:
            raise bu.BenchError(f"GET {path} on :{port} answered {response.status}")
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


# --- report ----------------------------------------------------------------------------


SECTIONS = ("slow", "speed", "lists")


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def paired(ratios: list[float]) -> list[float]:
    """One ratio per pair of rounds run in opposite orders (their geometric mean).

    Going first or second in a round is not neutral here (the page cache and the allocator
    remember the upload before), and with an odd number of rounds a median of single
    rounds lands on the side of whoever went first more often.
    """
    return [statistics.geometric_mean(ratios[i : i + 2]) for i in range(0, len(ratios) - 1, 2)]


def run(args: argparse.Namespace) -> int:
    sizes = QUICK if args.quick else Sizes()
    rounds = args.rounds or (1 if args.quick else 10)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    root = bu.pick_root(args.data_root)
    config = root / "config.yaml"
    limit = 2 * sizes.big + 64 * MiB
    # 500 clients from one loopback address: more than the default per-address cap.
    config.write_text(
        f"uploads:\n  max_file_size: {limit}\n  max_total_size: {limit}\n"
        "server:\n  max_connections_per_address: 0\n",
        encoding="utf-8",
    )
    targets: list[bu.Target] = []
    checks: list[tuple[str, bool]] = []
    results: dict = {"sizes": sizes.__dict__, "rounds": rounds}
    try:
        print(f"open files limit raised to {hard}; data under {root}")
        new = start_new(root, config)
        targets.append(new)
        old = start_previous(root, config)
        targets.append(old)
        naive = bu.start_naive(root)
        targets.append(naive)
        for target in targets:
            print(f"  {target.name:8} {target.command}")

        if "slow" in args.only:
            # 1. slow clients
            print(f"\n== {sizes.slow_clients} slow clients, 1 MB each at 100 KB/s ==")
            slow_targets = [new, old] if args.compare_slow else [new]
            for target in slow_targets:
                prepare_slow(target)
            for target in slow_targets:
                cap = 120.0 if target is new else 40.0
                for mode in ("upload", "download"):
                    outcome = slow_scenario(target, mode, sizes, cap)
                    results[f"slow-{mode}-{target.name}"] = outcome
                    print(
                        f"  {target.name:8} {mode:8}: {outcome['ok']}/{outcome['clients']} ok "
                        f"{outcome['failures'] or ''} in {outcome['wall']:.1f} s; list probe "
                        f"n={outcome['probes']} p50 {outcome['p50']:.1f} ms, p99 "
                        f"{outcome['p99']:.1f} ms, max {outcome['max']:.1f} ms, errors "
                        f"{outcome['probe_errors']}; server RSS peak "
                        f"{outcome['peak_rss'] / MiB:.0f} MiB "
                        f"(idle {outcome['idle_rss'] / MiB:.0f}); slowest probes "
                        + ", ".join(f"{ms:.0f} ms at {t:.1f} s" for ms, t in outcome["slowest"])
                    )
                    if target is new:
                        everyone = outcome["ok"] == outcome["clients"]
                        checks.append((f"slow {mode}s: all {outcome['clients']} succeed", everyone))
                        checks.append(
                            (
                                f"slow {mode}s: list p99 {outcome['p99']:.1f} ms < 100 ms",
                                outcome["p99"] < MAX_PROBE_P99_MS and not outcome["probe_errors"],
                            )
                        )
                        checks.append(
                            (
                                f"slow {mode}s: server RSS {outcome['peak_rss'] / MiB:.0f} MiB "
                                "< 300 MiB",
                                outcome["peak_rss"] < MAX_SLOW_RSS,
                            )
                        )

        if "speed" in args.only:
            # 2. no regression, rounds interleaved in pairs of opposite order
            speed_rounds = rounds + rounds % 2
            print(f"\n== no regression: {speed_rounds} rounds (pairs of opposite order) ==")
            for target in (new, old):
                bu.post_files(target.port, "medium", [("medium.bin", sizes.medium)])
            speeds: dict[str, dict[str, list[float]]] = {
                name: {"new": [], "gthread": []} for name in ("big", "download", "concurrent")
            }
            big_cpu: dict[str, list[float]] = {"new": [], "gthread": []}
            for round_no in range(speed_rounds):
                order = [new, old] if round_no % 2 == 0 else [old, new]
                for target in order:
                    speed, cpu = upload_big(target, sizes, round_no)
                    speeds["big"][target.name].append(speed)
                    big_cpu[target.name].append(cpu)
                for target in order:
                    speeds["download"][target.name].append(download_medium(target, sizes))
                for target in order:
                    speeds["concurrent"][target.name].append(
                        upload_concurrent(target, sizes, round_no)
                    )
            labels = {
                "big": f"upload 1 x {sizes.big // MiB} MiB",
                "download": f"download {sizes.medium // MiB} MiB (x{sizes.medium_downloads})",
                "concurrent": (
                    f"{sizes.concurrent_clients} concurrent x {sizes.concurrent // MiB} MiB"
                ),
            }
            for name, by in speeds.items():
                ratios = [n / o for n, o in zip(by["new"], by["gthread"], strict=True)]
                pairs = paired(ratios)
                ratio = med(pairs)
                print(
                    f"  {labels[name]:28} new {med(by['new']):7.0f} MiB/s  gthread "
                    f"{med(by['gthread']):7.0f} MiB/s  new/gthread {ratio:.2f} "
                    f"pairs [{', '.join(f'{r:.2f}' for r in pairs)}] "
                    f"rounds [{', '.join(f'{r:.2f}' for r in ratios)}]"
                )
                checks.append((f"{labels[name]}: new/gthread {ratio:.3f} >= 1.0", ratio >= 1.0))
            print(
                f"  {labels['big']} server CPU-s/GiB: new {med(big_cpu['new']):.2f}  gthread "
                f"{med(big_cpu['gthread']):.2f}"
            )
            results["speeds"] = speeds
            results["big_upload_cpu_per_gib"] = big_cpu

        if "lists" in args.only:
            # 3. lists at scale
            print("\n== lists at scale ==")
            for target in (new, old, naive):
                populate_on_disk(target, "list1k", 1000)
                populate_on_disk(target, "list10k", 10000)
            for target in (new, old):  # the first list records what it finds, hashing each file
                bu.list_uploads(target.port, "list1k", parse=False)
                bu.list_uploads(target.port, "list10k", parse=False)
            time.sleep(2.5)  # past the folders' settling time
            lists: dict[str, dict[str, list[float]]] = {"1k": {}, "10k": {}, "page": {}}
            for _ in range(rounds):
                for target in (new, old, naive):
                    for key, thread in (("1k", "list1k"), ("10k", "list10k")):
                        path = f"/api/threads/{thread}/uploads/list"
                        latency = timed_gets(target.port, path, sizes.list_gets)
                        lists[key].setdefault(target.name, []).append(latency)
                    if target is not naive:
                        latency = timed_gets(target.port, "/threads/list10k", sizes.page_gets)
                        lists["page"].setdefault(target.name, []).append(latency)
            ratios = [n / b for n, b in zip(lists["1k"]["new"], lists["1k"]["naive"], strict=True)]
            for key, label in (("1k", "list 1,000 files"), ("10k", "list 10,000 files")):
                print(
                    f"  {label:20} "
                    + "  ".join(f"{name} {med(v):6.1f} ms" for name, v in lists[key].items())
                )
            print(
                "  page 10,000 files    "
                + "  ".join(f"{name} {med(v):6.1f} ms" for name, v in lists["page"].items())
            )
            ratio = med(ratios)
            print(
                f"  list 1,000: new/naive latency {ratio:.2f} "
                f"[{', '.join(f'{r:.2f}' for r in ratios)}]"
            )
            checks.append(
                (f"list 1,000 files: new/naive {ratio:.2f} <= 0.5", ratio <= MAX_LIST_RATIO)
            )
            ten_k = med(lists["10k"]["new"])
            checks.append((f"list 10,000 files: {ten_k:.1f} ms < 50 ms", ten_k < MAX_LIST_10K_MS))
            page = med(lists["page"]["new"])
            checks.append((f"page of 10,000 files: {page:.1f} ms < 300 ms", page < MAX_PAGE_MS))
            results["lists"] = lists

        print("\n== goals ==")
        for label, passed in checks:
            print(f"  {'PASS' if passed else 'FAIL'}  {label}")
        out = args.json or REPO / "bench" / "results" / time.strftime("scale-%Y%m%d-%H%M%S.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
        print(f"figures written to {out}")
        return 0 if all(passed for _, passed in checks) else 1
    except (KeyboardInterrupt, bu.BenchError) as error:
        return bu.aborted(error)
    finally:
        for target in reversed(targets):
            target.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="Many clients at once (see bench/README.md).")
    parser.add_argument("--rounds", type=int, default=None, help="default 10 (--quick: 1)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, 100 slow clients")
    parser.add_argument("--compare-slow", action="store_true", help="slow clients on gthread too")
    parser.add_argument("--data-root", type=Path, help="parent of the temporary data dir")
    parser.add_argument("--json", type=Path, help="where to write the figures")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS,
        default=SECTIONS,
        help="run only these parts: slow clients, no-regression speeds, lists at scale",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, bu._interrupt)
    signal.signal(signal.SIGHUP, bu._interrupt)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
