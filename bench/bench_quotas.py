"""Small-file uploads with storage quotas on and off, in the same run.

    .venv/bin/python bench/bench_quotas.py [--rounds 3] [--requests 60] [--fill 10000]

A quota is checked in the transaction of every commit: the owner's lock, their quota and
their usage read before the writes and again after them (services/quotas/policy.py). That
costs the most on the smallest uploads, so this measures requests of ten 10 KB files, as
bench_small_files.py does, on two `make run` servers with accounts on (a Bearer token):

- `quotas off`: `DEER_FLOW_QUOTAS_DEFAULT_BYTES=null`, no check at all;
- `quotas on`: the default 10 GiB quota.

Before the first round each server's user gets `--fill` files (10,000) in another thread,
so the usage sums read a user who already stores a lot, not an empty account. Rounds are
interleaved, the order alternating; the ratio is taken inside each round and its median
across rounds reported. Exit status 1 when quotas on is slower than `MAX_SLOWDOWN`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_small_files import FILE_SIZE  # noqa: E402
from bench_small_files import FILES_PER_REQUEST  # noqa: E402
from bench_small_files import Run  # noqa: E402
from bench_small_files import Server  # noqa: E402
from bench_small_files import fill  # noqa: E402
from bench_small_files import start_ours  # noqa: E402
from bench_small_files import upload_requests  # noqa: E402
from bench_uploads import REPO  # noqa: E402
from bench_uploads import BenchError  # noqa: E402
from bench_uploads import aborted  # noqa: E402
from bench_uploads import pick_root  # noqa: E402

QUOTA_ENV = "DEER_FLOW_QUOTAS_DEFAULT_BYTES"
MAX_SLOWDOWN = 1.15  # median latency with quotas on / off: "not much slower"


def start(root: Path, name: str, repo: Path, venv: Path, quota: str | None) -> Server:
    """A server with accounts on, its quota default from the environment (None: the
    built-in 10 GiB)."""
    saved = os.environ.pop(QUOTA_ENV, None)
    if quota is not None:
        os.environ[QUOTA_ENV] = quota
    try:
        (root / name).mkdir(parents=True)
        return start_ours(root / name, name, repo, venv, accounts=True)
    finally:
        os.environ.pop(QUOTA_ENV, None)
        if saved is not None:
            os.environ[QUOTA_ENV] = saved


def main() -> int:
    parser = argparse.ArgumentParser(description="Quotas on vs off (see bench/README.md).")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=60, help="requests per target per round")
    parser.add_argument("--fill", type=int, default=10_000, help="files the user stores first")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout served")
    parser.add_argument("--venv", type=Path, default=Path(sys.prefix), help="`make run`'s venv")
    parser.add_argument("--data-root", type=Path, help="parent of the temporary data dir")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    root = pick_root(args.data_root)
    servers: dict[str, Server] = {}
    try:
        print("starting the servers ...")
        repo = args.repo.resolve()
        servers["quotas off"] = start(root, "quotas-off", repo, args.venv, "null")
        servers["quotas on"] = start(root, "quotas-on", repo, args.venv, None)
        print(f"serving {repo}; {os.cpu_count()} CPUs; load {os.getloadavg()}")
        for name, server in servers.items():
            took = fill(server, "stored", args.fill)
            print(f"  {name}: {args.fill} files stored first in {took:.1f} s")
        runs: dict[str, list[Run]] = {name: [] for name in servers}
        plan = list(servers.items())
        for round_index in range(args.rounds):
            order = plan if round_index % 2 == 0 else plan[::-1]
            print(f"\nround {round_index + 1}/{args.rounds}")
            for name, server in order:
                run = upload_requests(server, f"r{round_index}", args.requests, f"r{round_index}")
                runs[name].append(run)
                print(
                    f"  {name:<12} median {run.median:6.2f} ms  p95 {run.p95:6.2f} ms  "
                    f"server CPU {run.cpu_ms_per_file():.3f} ms/file"
                )
        ratios = [
            on.median / off.median
            for off, on in zip(runs["quotas off"], runs["quotas on"], strict=True)
        ]
        cpu = [
            on.cpu_ms_per_file() / off.cpu_ms_per_file()
            for off, on in zip(runs["quotas off"], runs["quotas on"], strict=True)
            if off.server_cpu
        ]
        slowdown = statistics.median(ratios)
        print(
            f"\n{args.requests} requests of {FILES_PER_REQUEST} x {FILE_SIZE // 1000} KB per "
            f"round, the user storing {args.fill} files already"
        )
        for name, rounds in runs.items():
            print(
                f"  {name:<12} median {statistics.median(r.median for r in rounds):6.2f} ms  "
                f"p95 {statistics.median(r.p95 for r in rounds):6.2f} ms"
            )
        print(
            f"quotas on / off, median latency: {slowdown:.2f}x <= {MAX_SLOWDOWN}"
            f"  (per round: {', '.join(f'{r:.2f}' for r in ratios)})"
        )
        if cpu:
            print(f"quotas on / off, server CPU per file: {statistics.median(cpu):.2f}x")
        return 0 if slowdown <= MAX_SLOWDOWN else 1
    except (KeyboardInterrupt, BenchError) as error:
        return aborted(error)
    finally:
        for server in reversed(list(servers.values())):
            server.target.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
