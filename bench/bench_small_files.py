"""Many small files: requests of ten 10 KB files, ours against the naive Flask baseline.

    .venv/bin/python bench/bench_small_files.py [--rounds 3] [--requests 60] [--fill 10000]

What a request of small files costs is the server's own work per file (parsing, naming,
the commit and its records), not the bytes, so this case shows what the large uploads of
`bench_uploads.py` hide. In one run, rounds interleaved, the order rotating:

- `naive`: bench/naive_app.py, the baseline;
- `ours`: `make run`'s server in the single-user mode (accounts off), each round into a
  new, empty thread;
- `ours+token`: a second `make run` server with accounts on, each request carrying a
  Bearer API token of a user provisioned in its data dir before it starts;
- `ours, full thread`: the `ours` server again, into a thread filled with `--fill` files
  (10,000) before the first round: the cost of one upload must not grow with its thread.

Every request is timed on its own (a new connection each, as curl does); each target's
figures are the median and p95 over its requests, and the server's CPU per file. Ratios
are taken inside each round, then the median across rounds is reported. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_uploads import HOST  # noqa: E402
from bench_uploads import REPO  # noqa: E402
from bench_uploads import BenchError  # noqa: E402
from bench_uploads import Target  # noqa: E402
from bench_uploads import _cmdline  # noqa: E402
from bench_uploads import aborted  # noqa: E402
from bench_uploads import free_port  # noqa: E402
from bench_uploads import list_uploads  # noqa: E402
from bench_uploads import measured  # noqa: E402
from bench_uploads import pick_root  # noqa: E402
from bench_uploads import post_files  # noqa: E402
from bench_uploads import process_tree  # noqa: E402
from bench_uploads import start_naive  # noqa: E402

FILE_SIZE = 10 * 1000
FILES_PER_REQUEST = 10
EMAIL = "bench@example.com"
PASSWORD = "bench-password-not-secret-9"

# Goals of issue #24 (same-run ratios; >1 means ours is faster).
MIN_RATIO_OPEN = 1.0  # accounts off, ours/naive
MIN_RATIO_TOKEN = 0.8  # accounts on with a token, ours/naive
MAX_FULL_OVER_EMPTY = 1.2  # median latency into the full thread / into an empty one

# Creates the user and a token in a data dir before its server starts; run with the served
# checkout's own code, so a before/after comparison provisions each the way it knows.
PROVISION = f"""
import sys
from pathlib import Path
from deerflow_web.services.accounts.service import AccountService
from deerflow_web.storage.migrate import open_database
engine = open_database(Path(sys.argv[1]))
accounts = AccountService(engine)
user = accounts.create_user({EMAIL!r}, {PASSWORD!r}, role="admin")
print(accounts.create_token(user.id, "bench").secret)
engine.dispose()
"""


@dataclass
class Run:
    """One target's requests in one round."""

    latencies_ms: list[float] = field(default_factory=list)
    server_cpu: float = 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.latencies_ms)

    @property
    def p95(self) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]

    def cpu_ms_per_file(self) -> float:
        return self.server_cpu * 1000 / (len(self.latencies_ms) * FILES_PER_REQUEST)


@dataclass
class Server:
    target: Target
    token: str | None = None


def start_ours(root: Path, name: str, repo: Path, venv: Path, accounts: bool) -> Server:
    """`make run` on a free port with its own data dir, serving `repo` from `venv`.

    `-o .runtime` tells make the venv is up to date: a benchmark never installs anything.
    """
    target = Target(name, root / name, port=free_port(), log=root / f"{name}.log", skip_root=True)
    target.data_dir.mkdir(parents=True)
    config = root / "config.yaml"  # the fill sends a hundred files per request
    config.write_text("uploads:\n  max_files: 100\n", encoding="utf-8")
    env = dict(
        os.environ,
        DEER_FLOW_HOME=str(target.data_dir),
        DEER_FLOW_CONFIG_PATH=str(config),
        PYTHONPATH=str(repo),
    )
    env.pop("DATABASE_URL", None)
    env.pop("DEER_FLOW_AUTH_DISABLED", None)
    token = None
    if accounts:
        made = subprocess.run(
            [str(venv / "bin" / "python"), "-c", PROVISION, str(target.data_dir)],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            raise BenchError(f"could not provision the bench user:\n{made.stderr[-2000:]}")
        token = made.stdout.strip().splitlines()[-1]
    else:
        env["DEER_FLOW_AUTH_DISABLED"] = "1"
    runtime = venv / ".runtime"
    command = ["make", "--no-print-directory", "-o", str(runtime), "run"]
    command += [f"VENV={venv}", f"HOST={HOST}", f"PORT={target.port}"]
    with open(target.log, "wb") as log:
        target.proc = subprocess.Popen(
            command,
            cwd=repo,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(target, token)
    deadline = time.monotonic() + 90
    while True:
        if target.proc.poll() is not None:
            raise BenchError(f"{name} exited at start-up:\n{target.log_tail()}")
        try:
            list_uploads(target.port, "bench-ready", headers=_auth(server))
            break
        except (OSError, BenchError):
            if time.monotonic() > deadline:
                raise BenchError(f"{name} did not answer:\n{target.log_tail()}") from None
            time.sleep(0.2)
    target.command = " ".join(_cmdline(pid) for pid in process_tree(target.proc.pid)[1:2])
    return server


def _auth(server: Server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}"} if server.token else {}


def upload_requests(server: Server, thread_id: str, requests: int, tag: str) -> Run:
    """`requests` sequential requests of ten new 10 KB files each, each timed on its own."""
    run = Run()
    headers = _auth(server)
    with measured(server.target.pids()) as sample:
        for index in range(requests):
            files = [(f"{tag}-{index:03d}-{n}.txt", FILE_SIZE) for n in range(FILES_PER_REQUEST)]
            started = time.perf_counter()
            post_files(server.target.port, thread_id, files, headers=headers)
            run.latencies_ms.append((time.perf_counter() - started) * 1000)
    run.server_cpu = sample.server_cpu
    return run


def fill(server: Server, thread_id: str, count: int) -> float:
    """Put `count` files into a thread through the API, a hundred per request."""
    started = time.perf_counter()
    per_request = 100
    for start in range(0, count, per_request):
        files = [(f"fill-{n:05d}.txt", 2000) for n in range(start, min(count, start + per_request))]
        post_files(server.target.port, thread_id, files, headers=_auth(server))
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description="Small-files benchmark (see bench/README.md).")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=60, help="requests per target per round")
    parser.add_argument("--fill", type=int, default=10_000, help="files in the full thread")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout `ours` serves")
    parser.add_argument(
        "--venv", type=Path, default=Path(sys.prefix), help="the venv `make run` uses"
    )
    parser.add_argument("--data-root", type=Path, help="parent of the temporary data dir")
    parser.add_argument("--json", type=Path, help="also write the per-request samples here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    root = pick_root(args.data_root)
    servers: list[Server] = []
    try:
        print("starting the servers ...")
        naive = Server(start_naive(root))
        servers.append(naive)
        ours = start_ours(root, "ours", args.repo.resolve(), args.venv, accounts=False)
        servers.append(ours)
        token = start_ours(root, "ours+token", args.repo.resolve(), args.venv, accounts=True)
        servers.append(token)
        for server in servers:
            print(f"  {server.target.name}: {server.target.command}")
        print(f"serving {args.repo.resolve()}; {os.cpu_count()} CPUs; load {os.getloadavg()}")
        took = fill(ours, "full-thread", args.fill)
        print(f"filled a thread with {args.fill} files in {took:.1f} s")

        plan = [
            ("naive", naive, lambda r: f"r{r}"),
            ("ours", ours, lambda r: f"r{r}-empty"),
            ("ours+token", token, lambda r: f"r{r}"),
            ("ours, full thread", ours, lambda r: "full-thread"),
        ]
        runs: dict[str, list[Run]] = {name: [] for name, _, _ in plan}
        for round_index in range(args.rounds):
            shift = round_index % len(plan)
            order = plan[shift:] + plan[:shift]
            print(f"\nround {round_index + 1}/{args.rounds}")
            for name, server, thread in order:
                run = upload_requests(server, thread(round_index), args.requests, f"r{round_index}")
                runs[name].append(run)
                print(
                    f"  {name:<18} median {run.median:6.2f} ms  p95 {run.p95:6.2f} ms  "
                    f"server CPU {run.cpu_ms_per_file():.3f} ms/file"
                )
        checks = report(runs, args)
        if args.json:
            args.json.write_text(
                json.dumps({k: [r.__dict__ for r in v] for k, v in runs.items()}, indent=2)
            )
        return 0 if all(passed for _, passed in checks) else 1
    except (KeyboardInterrupt, BenchError) as error:
        return aborted(error)
    finally:
        for server in reversed(servers):
            server.target.stop()
        shutil.rmtree(root, ignore_errors=True)


def report(runs: dict[str, list[Run]], args: argparse.Namespace) -> list[tuple[str, bool]]:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    def ratio(name: str, other: str) -> list[float]:
        """other/name of each round's median latency: >1 when `name` is faster."""
        return [b.median / a.median for a, b in zip(runs[name], runs[other], strict=True)]

    print(f"\n{args.requests} requests of {FILES_PER_REQUEST} x {FILE_SIZE // 1000} KB per round")
    print(f"{'target':<20}{'median ms':>12}{'p95 ms':>10}{'server CPU ms/file':>20}")
    for name, rounds in runs.items():
        print(
            f"{name:<20}{median([r.median for r in rounds]):>12.2f}"
            f"{median([r.p95 for r in rounds]):>10.2f}"
            f"{median([r.cpu_ms_per_file() for r in rounds]):>20.3f}"
        )
    open_ratio = ratio("ours", "naive")
    token_ratio = ratio("ours+token", "naive")
    full = [1 / r for r in ratio("ours", "ours, full thread")]
    checks = [
        (
            f"ours/naive (accounts off) {median(open_ratio):.2f}x >= {MIN_RATIO_OPEN}"
            f"  (per round: {', '.join(f'{r:.2f}' for r in open_ratio)})",
            median(open_ratio) >= MIN_RATIO_OPEN,
        ),
        (
            f"ours+token/naive (accounts on) {median(token_ratio):.2f}x >= {MIN_RATIO_TOKEN}"
            f"  (per round: {', '.join(f'{r:.2f}' for r in token_ratio)})",
            median(token_ratio) >= MIN_RATIO_TOKEN,
        ),
        (
            f"full thread ({args.fill} files) / empty thread latency {median(full):.2f}x <= "
            f"{MAX_FULL_OVER_EMPTY}  (per round: {', '.join(f'{r:.2f}' for r in full)})",
            median(full) <= MAX_FULL_OVER_EMPTY,
        ),
    ]
    cpu = [
        full_run.cpu_ms_per_file() / empty.cpu_ms_per_file()
        for empty, full_run in zip(runs["ours"], runs["ours, full thread"], strict=True)
        if empty.server_cpu
    ]
    if cpu:  # steadier than latency on a busy machine: what the server itself spent
        print(
            f"\nserver CPU per file, full thread / empty thread: {median(cpu):.2f}x"
            f"  (per round: {', '.join(f'{r:.2f}' for r in cpu)})"
        )
    # The ratios are same-run, but a machine busy with other work widens their spread:
    # the load at the end says how busy it was while the rounds ran.
    print(f"\nload average at the end (1, 5, 15 min): {os.getloadavg()}")
    print("\ngoals of issue #24, medians over the rounds, ratios taken inside each round:")
    for text, passed in checks:
        print(f"  {'PASS' if passed else 'FAIL'}  {text}")
    return checks


if __name__ == "__main__":
    sys.exit(main())
