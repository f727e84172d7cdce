"""Upload benchmark: `make run`'s server against a naive Flask baseline and the bare disk.

    .venv/bin/python bench/bench_uploads.py [--rounds 3] [--quick]

Starts the real server exactly as `make run` does (it runs `make run HOST=... PORT=...`
with DEER_FLOW_HOME pointing at a temporary data dir), starts the naive baseline in
bench/naive_app.py under Werkzeug's development server, and measures a plain write of the
same bytes to the same disk as the ceiling. Rounds are interleaved (every scenario on every
target, then the next round), `sync` runs before every measured run, and ratios are taken
inside each round before the median across rounds is reported: write speeds on these
machines swing several-fold with the state of memory, so only same-round ratios mean
anything. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
CLK_TCK = os.sysconf("SC_CLK_TCK")
RSS_INTERVAL = 0.02  # seconds between VmRSS samples of the server processes

# One random MiB, sent (or written) over and over: the client never builds a body in memory.
BLOCK = memoryview(os.urandom(MiB))
READ_BUFFER = memoryview(bytearray(MiB))

# Targets of issue #2 (checked on the full-size run; --quick only shows the same checks).
MAX_CPU_PER_GIB = 1.2
MAX_RSS_GROWTH = 64 * MiB
MAX_LIST_MS = 12.0
MIN_DOWNLOAD_MIBS = 1.5 * 1024


class BenchError(RuntimeError):
    """A server answered wrongly or did not start: the figures would mean nothing."""


@dataclass(frozen=True)
class Sizes:
    """What each scenario moves; --quick shrinks everything except the list."""

    big: int = GiB
    medium: int = 100 * MiB
    # One 10 ms CPU tick is a tenth of what one 100 MiB upload costs, so the medium file is
    # uploaded (in a request of its own each time) this many times in a row.
    medium_repeats: int = 4
    small: int = MiB
    small_count: int = 10
    small_repeats: int = 5  # the 10 x 1 MiB request is timed this many times in a row
    concurrent: int = 8
    concurrent_size: int = 10 * MiB
    downloads: int = 3  # the 100 MiB file is downloaded this many times in a row
    list_files: int = 1000
    list_requests: int = 50
    # Before each measured write, write and delete as many bytes here, on the same disk
    # (untimed), so every target starts from the same memory state ("just freed"); see
    # README. None: no primer.
    primer_dir: Path | None = None


QUICK = Sizes(
    big=256 * MiB,
    medium=32 * MiB,
    medium_repeats=2,
    small_repeats=3,
    concurrent_size=2 * MiB,
    downloads=2,
    list_requests=20,
)


# --- /proc: process tree, CPU time, resident memory -----------------------------------


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3 onwards)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, found through the ppid of every /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def cpu_ticks(pids: list[int]) -> dict[int, tuple[int, int]]:
    """(utime, stime) of each live process (all its threads, exited ones included)."""
    ticks = {}
    for pid in pids:
        if (fields := _stat_fields(pid)) is not None:
            ticks[pid] = (int(fields[11]), int(fields[12]))
    return ticks


def rss_bytes(pids: list[int]) -> int:
    """Sum of VmRSS over the processes."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as handle:
                for line in handle:
                    if line.startswith(b"VmRSS:"):
                        total += int(line.split()[1]) * KiB
                        break
        except OSError:
            continue
    return total


def client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Sample:
    """One measured run of one scenario on one target."""

    wall: float = 0.0
    bytes: int = 0
    server_cpu: float = 0.0  # seconds, whole server process tree (the writer itself for disk)
    server_sys: float = 0.0  # the part of server_cpu spent in the kernel
    client_cpu: float = 0.0
    idle_rss: int = 0
    peak_rss: int = 0
    latency_ms: float | None = None  # list scenario only: median latency

    @property
    def mibs(self) -> float:
        return self.bytes / MiB / self.wall if self.wall else 0.0

    @property
    def cpu_per_gib(self) -> float:
        return self.server_cpu / (self.bytes / GiB) if self.bytes else 0.0

    @property
    def sys_per_gib(self) -> float:
        return self.server_sys / (self.bytes / GiB) if self.bytes else 0.0

    @property
    def client_cpu_per_gib(self) -> float:
        return self.client_cpu / (self.bytes / GiB) if self.bytes else 0.0

    @property
    def rss_growth(self) -> int:
        return max(0, self.peak_rss - self.idle_rss)


@contextmanager
def measured(pids: list[int] | None) -> Iterator[Sample]:
    """Time the block and take the server tree's CPU time and peak RSS over it.

    `pids` None means there is no server (the disk ceiling): the writer's CPU is the
    benchmark process's own.
    """
    sample = Sample()
    stop = threading.Event()
    peak = [0]

    def sample_rss() -> None:
        while not stop.wait(RSS_INTERVAL):
            peak[0] = max(peak[0], rss_bytes(pids))

    sampler = None
    if pids:
        sample.idle_rss = peak[0] = rss_bytes(pids)
        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        before = cpu_ticks(pids)
    client_before = client_cpu()
    client_sys_before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    start = time.perf_counter()
    try:
        yield sample
    finally:
        sample.wall = time.perf_counter() - start
        sample.client_cpu = client_cpu() - client_before
        if pids:
            after = cpu_ticks(pids)
            user = sum(u - before.get(pid, (u, s))[0] for pid, (u, s) in after.items())
            kernel = sum(s - before.get(pid, (u, s))[1] for pid, (u, s) in after.items())
            sample.server_cpu = (user + kernel) / CLK_TCK
            sample.server_sys = kernel / CLK_TCK
            stop.set()
            sampler.join()
            sample.peak_rss = max(peak[0], rss_bytes(pids))
        else:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            sample.server_cpu = sample.client_cpu
            sample.server_sys = usage.ru_stime - client_sys_before


# --- a cheap HTTP client ----------------------------------------------------------------


def _connect(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(HOST, port, timeout=900)
    conn.connect()  # http.client sets TCP_NODELAY
    return conn


def _send_repeated(sock: socket.socket, size: int) -> None:
    full, rest = divmod(size, len(BLOCK))
    for _ in range(full):
        sock.sendall(BLOCK)
    if rest:
        sock.sendall(BLOCK[:rest])


def post_files(
    port: int,
    thread_id: str,
    files: list[tuple[str, int]],
    headers: dict[str, str] | None = None,
    on_sent: Callable[[], None] | None = None,
) -> dict:
    """POST a multipart body with one `files` part per (name, size), streamed from BLOCK.

    The body is never assembled: part headers, payload and trailer go out piece by piece
    over the raw connection after a Content-Length header, so the client costs little more
    than the kernel's copy. `on_sent` is called once the last byte is handed to the socket
    (the server has read all but what the loopback buffers hold), before the answer is
    awaited: what the server does after the body is timed from there.
    """
    boundary = "deerflowbench" + os.urandom(12).hex()
    heads = [
        (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="files"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        for name, _ in files
    ]
    tail = f"--{boundary}--\r\n".encode()
    length = sum(len(head) + size + 2 for head, (_, size) in zip(heads, files, strict=True))
    length += len(tail)
    conn = _connect(port)
    try:
        conn.putrequest("POST", f"/api/threads/{thread_id}/uploads", skip_accept_encoding=True)
        conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
        conn.putheader("Content-Length", str(length))
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        for head, (_, size) in zip(heads, files, strict=True):
            conn.sock.sendall(head)
            _send_repeated(conn.sock, size)
            conn.sock.sendall(b"\r\n")
        conn.sock.sendall(tail)
        if on_sent is not None:
            on_sent()
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise BenchError(f"upload to :{port} answered {response.status}: {body[:300]!r}")
    answer = json.loads(body)
    sizes = {f["filename"]: f["size"] for f in answer.get("files", [])}
    if sizes != dict(files):
        raise BenchError(f"upload to :{port} stored {sizes}, expected {dict(files)}")
    return answer


def download(port: int, thread_id: str, name: str, headers: dict[str, str] | None = None) -> int:
    """GET one upload into a reused buffer; return the number of bytes received."""
    conn = _connect(port)
    try:
        conn.request(
            "GET",
            f"/api/threads/{thread_id}/artifacts/mnt/user-data/uploads/{name}",
            headers=headers or {},
        )
        response = conn.getresponse()
        if response.status != 200:
            raise BenchError(f"download from :{port} answered {response.status}")
        total = 0
        while count := response.readinto(READ_BUFFER):
            total += count
    finally:
        conn.close()
    return total


def list_uploads(
    port: int, thread_id: str, parse: bool = True, headers: dict[str, str] | None = None
) -> dict | None:
    """GET the list over a new connection (as curl would); parse=False only reads it."""
    conn = _connect(port)
    try:
        conn.request("GET", f"/api/threads/{thread_id}/uploads/list", headers=headers or {})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise BenchError(f"list on :{port} answered {response.status}: {body[:300]!r}")
    return json.loads(body) if parse else None


# --- targets --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@dataclass
class Target:
    """One thing under test: a server (ours, naive) or the bare disk."""

    name: str
    data_dir: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    log: Path | None = None
    skip_root: bool = False  # the root is `make`, not part of the server
    command: str = ""

    @property
    def is_server(self) -> bool:
        return self.proc is not None

    def pids(self) -> list[int] | None:
        if self.proc is None:
            return None
        tree = process_tree(self.proc.pid)
        return tree[1:] if self.skip_root else tree

    def thread_dir(self, thread_id: str) -> Path:
        return self.data_dir / "threads" / thread_id

    def drop_thread(self, thread_id: str) -> None:
        """Remove a measured thread's files (outside any timing) to keep the disk small."""
        shutil.rmtree(self.thread_dir(thread_id), ignore_errors=True)

    def launch(self, command: list[str], env: dict[str, str]) -> None:
        """Start the server in its own process group (so `stop` ends all of it), logging."""
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited at start-up:\n{self.log_tail()}")
            try:
                list_uploads(self.port, "bench-ready")
                return
            except (OSError, http.client.HTTPException, BenchError):
                time.sleep(0.2)
        raise BenchError(f"{self.name} did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return ""

    def stop(self) -> None:
        """End the process group this benchmark started (make and gunicorn, or the baseline)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 40), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def server_env(data_dir: Path, config: Path) -> dict[str, str]:
    """The environment of a measured server: its own data dir and config, single-user mode.

    The single-user mode (SPEC 7.1) keeps the flat layout that `Target.thread_dir` reads and
    lets the clients send no credentials; with accounts on, a request costs one indexed
    token lookup more, which none of these figures is about.
    """
    return dict(
        os.environ,
        DEER_FLOW_HOME=str(data_dir),
        DEER_FLOW_CONFIG_PATH=str(config),
        DEER_FLOW_AUTH_DISABLED="1",
    )


def start_ours(root: Path, config: Path) -> Target:
    """`make run HOST=127.0.0.1 PORT=<free>` with the data dir in DEER_FLOW_HOME."""
    target = Target("ours", root / "ours", port=free_port(), log=root / "ours.log", skip_root=True)
    env = server_env(target.data_dir, config)
    target.launch(
        ["make", "--no-print-directory", "run", f"HOST={HOST}", f"PORT={target.port}"], env
    )
    first_use = not (REPO / ".venv" / ".runtime").exists()
    target.wait_ready(600 if first_use else 90)
    target.command = " ".join(_cmdline(pid) for pid in process_tree(target.proc.pid)[1:2])
    return target


def start_naive(root: Path) -> Target:
    """bench/naive_app.py under Werkzeug's threaded development server."""
    target = Target("naive", root / "naive", port=free_port(), log=root / "naive.log")
    spool = root / "naive-tmp"  # where request.files spools: same disk, cleaned up with root
    spool.mkdir()
    env = dict(os.environ, TMPDIR=str(spool))
    command = [
        sys.executable,
        str(REPO / "bench" / "naive_app.py"),
        "--host",
        HOST,
        "--port",
        str(target.port),
        "--data-dir",
        str(target.data_dir),
    ]
    target.launch(command, env)
    target.wait_ready(60)
    target.command = " ".join(command)
    return target


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


# --- scenarios ------------------------------------------------------------------------


def disk_write(path: Path, size: int) -> None:
    """Write `size` bytes in 1 MiB pieces, no fsync: what the servers do, minus HTTP."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        full, rest = divmod(size, len(BLOCK))
        for view in [BLOCK] * full + ([BLOCK[:rest]] if rest else []):
            while view:
                view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def prepare_write(sizes: Sizes, size: int) -> None:
    """Before a measured write: the primer (if on), then `sync`."""
    if sizes.primer_dir is not None:
        path = sizes.primer_dir / "primer.bin"
        disk_write(path, size)
        path.unlink()
    os.sync()


def upload_each(
    target: Target, thread_ids: list[str], size: int, sizes: Sizes, keep_first: bool = False
) -> Sample:
    """One file of `size` bytes in one request per thread, in turn (the disk: one plain
    write each). The threads are dropped afterwards, but for the first if `keep_first`."""
    prepare_write(sizes, size * len(thread_ids))
    if not target.is_server:
        paths = [target.data_dir / f"{thread_id}.bin" for thread_id in thread_ids]
        with measured(None) as sample:
            for path in paths:
                disk_write(path, size)
        for path in paths:
            path.unlink()
    else:
        with measured(target.pids()) as sample:
            for thread_id in thread_ids:
                post_files(target.port, thread_id, [("payload.bin", size)])
        for thread_id in thread_ids[1 if keep_first else 0 :]:
            target.drop_thread(thread_id)
    sample.bytes = size * len(thread_ids)
    return sample


def upload_many(target: Target, thread_id: str, sizes: Sizes) -> Sample:
    """`small_count` files of `small` bytes in one request, `small_repeats` times in a row."""
    files = [(f"part-{i:02d}.bin", sizes.small) for i in range(sizes.small_count)]
    prepare_write(sizes, sizes.small * sizes.small_count * sizes.small_repeats)
    with measured(target.pids()) as sample:
        for repeat in range(sizes.small_repeats):
            post_files(target.port, f"{thread_id}-{repeat}", files)
    for repeat in range(sizes.small_repeats):
        target.drop_thread(f"{thread_id}-{repeat}")
    sample.bytes = sizes.small * sizes.small_count * sizes.small_repeats
    return sample


def download_medium(target: Target, thread_id: str, sizes: Sizes) -> Sample:
    """Download the file the medium upload left, `downloads` times in a row."""
    os.sync()
    with measured(target.pids()) as sample:
        for _ in range(sizes.downloads):
            got = download(target.port, thread_id, "payload.bin")
            if got != sizes.medium:
                raise BenchError(f"{target.name} sent {got} bytes, expected {sizes.medium}")
    sample.bytes = sizes.medium * sizes.downloads
    return sample


def list_thread(target: Target, thread_id: str, sizes: Sizes) -> Sample:
    """Median latency of `list_requests` sequential lists of the populated thread."""
    answer = list_uploads(target.port, thread_id)  # not timed: checks the thread is whole
    if answer.get("count") != sizes.list_files:
        raise BenchError(f"{target.name} lists {answer.get('count')} files, not {sizes.list_files}")
    latencies = []
    os.sync()
    with measured(target.pids()) as sample:
        for _ in range(sizes.list_requests):
            start = time.perf_counter()
            list_uploads(target.port, thread_id, parse=False)
            latencies.append((time.perf_counter() - start) * 1000)
    sample.latency_ms = statistics.median(latencies)
    return sample


def upload_concurrent(target: Target, thread_id: str, sizes: Sizes) -> Sample:
    """`concurrent` uploads of `concurrent_size` bytes at once, one client thread each."""
    barrier = threading.Barrier(sizes.concurrent + 1)
    errors: list[BaseException] = []

    def one(index: int) -> None:
        barrier.wait()
        try:
            post_files(target.port, thread_id, [(f"c{index}.bin", sizes.concurrent_size)])
        except BaseException as error:  # reported after the join
            errors.append(error)

    workers = [threading.Thread(target=one, args=(i,)) for i in range(sizes.concurrent)]
    for worker in workers:
        worker.start()
    prepare_write(sizes, sizes.concurrent * sizes.concurrent_size)
    with measured(target.pids()) as sample:
        barrier.wait()
        for worker in workers:
            worker.join()
    if errors:
        raise BenchError(f"{target.name}: concurrent upload failed: {errors[0]}")
    target.drop_thread(thread_id)
    sample.bytes = sizes.concurrent * sizes.concurrent_size
    return sample


def populate_list_thread(
    target: Target,
    thread_id: str,
    count: int,
    headers: dict[str, str] | None = None,
    per_request: int = 10,
) -> None:
    """Fill a thread with `count` small files through the API, `per_request` per request
    (the default `uploads.max_files`)."""
    names = [f"doc-{i:04d}.txt" for i in range(count)]
    for start in range(0, count, per_request):
        batch = [(name, 2 * KiB) for name in names[start : start + per_request]]
        post_files(target.port, thread_id, batch, headers)


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    run: Callable[[Target, int], Sample]
    with_disk: bool = False
    latency: bool = False


def scenarios(sizes: Sizes) -> list[Scenario]:
    def mib(n: int) -> str:
        return f"{n / GiB:g} GiB" if n >= GiB else f"{n / MiB:g} MiB"

    return [
        Scenario(
            "upload_big",
            f"upload 1 x {mib(sizes.big)}",
            lambda t, r: upload_each(t, [f"r{r}-big"], sizes.big, sizes),
            with_disk=True,
        ),
        Scenario(
            "upload_medium",
            f"upload 1 x {mib(sizes.medium)} (x{sizes.medium_repeats})",
            lambda t, r: upload_each(
                t,
                [f"r{r}-medium"] + [f"r{r}-medium-{i}" for i in range(1, sizes.medium_repeats)],
                sizes.medium,
                sizes,
                keep_first=True,
            ),
            with_disk=True,
        ),
        Scenario(
            "download_medium",
            f"download {mib(sizes.medium)} (x{sizes.downloads})",
            lambda t, r: download_medium(t, f"r{r}-medium", sizes),
        ),
        Scenario(
            "upload_small",
            f"upload {sizes.small_count} x {mib(sizes.small)} per request (x{sizes.small_repeats})",
            lambda t, r: upload_many(t, f"r{r}-small", sizes),
        ),
        Scenario(
            "list",
            f"list {sizes.list_files} files (median of {sizes.list_requests})",
            lambda t, r: list_thread(t, "list-thread", sizes),
            latency=True,
        ),
        Scenario(
            "concurrent",
            f"{sizes.concurrent} concurrent uploads x {mib(sizes.concurrent_size)}",
            lambda t, r: upload_concurrent(t, f"r{r}-concurrent", sizes),
        ),
    ]


# --- the run --------------------------------------------------------------------------


@dataclass
class Results:
    """Samples by scenario key, then target name, one per round."""

    samples: dict[str, dict[str, list[Sample]]] = field(default_factory=dict)

    def add(self, key: str, target: str, sample: Sample) -> None:
        self.samples.setdefault(key, {}).setdefault(target, []).append(sample)

    def get(self, key: str, target: str) -> list[Sample]:
        return self.samples.get(key, {}).get(target, [])


def speed(scenario: Scenario, sample: Sample) -> float:
    """Higher is better: MiB/s, or lists per second for the latency scenario."""
    return 1000 / sample.latency_ms if scenario.latency else sample.mibs


def round_ratios(scenario: Scenario, results: Results, other: str) -> list[float]:
    """ours/other of each round's speed (>1: ours is faster)."""
    ours, theirs = results.get(scenario.key, "ours"), results.get(scenario.key, other)
    return [speed(scenario, a) / speed(scenario, b) for a, b in zip(ours, theirs, strict=False)]


def run_rounds(targets: list[Target], sizes: Sizes, rounds: int) -> Results:
    results = Results()
    plan = scenarios(sizes)
    for round_index in range(rounds):
        shift = round_index % len(targets)
        order = targets[shift:] + targets[:shift]  # nobody always goes first
        print(f"\nround {round_index + 1}/{rounds} (order: {', '.join(t.name for t in order)})")
        for scenario in plan:
            for target in order:
                if not target.is_server and not scenario.with_disk:
                    continue
                sample = scenario.run(target, round_index)
                results.add(scenario.key, target.name, sample)
                print(f"  {scenario.title:<52} {target.name:<6} {_short(scenario, sample)}")
            if scenario.key == "download_medium":
                for target in targets:
                    if target.is_server:
                        target.drop_thread(f"r{round_index}-medium")
    return results


def _short(scenario: Scenario, sample: Sample) -> str:
    first = f"{sample.latency_ms:8.2f} ms" if scenario.latency else f"{sample.mibs:8.0f} MiB/s"
    text = f"{first}  cpu {sample.server_cpu:6.2f} s (sys {sample.server_sys:5.2f})"
    if sample.peak_rss:
        text += f"  rss +{sample.rss_growth / MiB:.1f} MiB"
    return text


# --- report ---------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _spread(values: list[float], fmt: str) -> str:
    if len(values) < 2:
        return ""
    return f" [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def report(results: Results, sizes: Sizes, rounds: int, quick: bool) -> list[tuple[str, bool]]:
    """Print the table and the issue's targets; return (target text, passed)."""
    plan = scenarios(sizes)
    line = "-" * 124
    print(f"\n{line}")
    print(
        f"{'scenario':<42}{'target':<12}{'speed':<26}{'server CPU-s/GiB':>20}"
        f"{'peak RSS':>10}{'growth':>8}{'client':>8}"
    )
    print(
        f"{'':<42}{'':<12}{'median [min-max]':<26}{'(list: ms/request)':>20}"
        f"{'MiB':>10}{'MiB':>8}{'s/GiB':>8}"
    )
    print(line)
    for scenario in plan:
        title = scenario.title
        for name in ("disk", "naive", "ours"):
            samples = results.get(scenario.key, name)
            if not samples:
                continue
            if scenario.latency:
                values = [s.latency_ms for s in samples]
                shown = f"{_med(values):.2f} ms{_spread(values, '.2f')}"
                per_request = 1000 / sizes.list_requests
                cpu = _med([s.server_cpu * per_request for s in samples])
                kernel = _med([s.server_sys * per_request for s in samples])
                client = ""
            else:
                values = [s.mibs for s in samples]
                shown = f"{_med(values):.0f} MiB/s{_spread(values, '.0f')}"
                cpu = _med([s.cpu_per_gib for s in samples])
                kernel = _med([s.sys_per_gib for s in samples])
                client = f"{_med([s.client_cpu_per_gib for s in samples]):.2f}"
            if name == "disk":
                rss = growth = "-"
                cpu_text = f"writer {cpu:.2f}"
            else:
                rss = f"{max(s.peak_rss for s in samples) / MiB:.0f}"
                growth = f"{max(s.rss_growth for s in samples) / MiB:.1f}"
                cpu_text = f"{cpu:.2f} (sys {kernel:.2f})"
            print(f"{title:<42}{name:<12}{shown:<26}{cpu_text:>20}{rss:>10}{growth:>8}{client:>8}")
            title = ""
        for other in ("naive", "disk"):
            ratios = round_ratios(scenario, results, other)
            if not ratios:
                continue
            per_round = ", ".join(f"{r:.2f}" for r in ratios)
            label = f"ours/{other}"
            print(f"{'':<42}{label:<12}{_med(ratios):.2f}x  (per round: {per_round})")
        print(line)

    checks: list[tuple[str, bool]] = []
    for key in ("upload_big", "upload_medium"):
        scenario = next(s for s in plan if s.key == key)
        ratios = round_ratios(scenario, results, "naive")
        disk = round_ratios(scenario, results, "disk")
        cpu = _med([s.cpu_per_gib for s in results.get(key, "ours")])
        checks.append(
            (
                f"{scenario.title}: ours/naive median {_med(ratios):.2f}x >= 1.00 "
                f"(min {min(ratios):.2f}x; ours/disk {_med(disk):.2f}x)",
                _med(ratios) >= 1.0,
            )
        )
        checks.append(
            (
                f"{scenario.title}: {cpu:.2f} server CPU-s/GiB <= {MAX_CPU_PER_GIB}",
                cpu <= MAX_CPU_PER_GIB,
            )
        )
    growth = max(s.rss_growth for s in results.get("upload_big", "ours"))
    checks.append(
        (
            f"peak RSS growth over idle during the {plan[0].title}: "
            f"{growth / MiB:.1f} MiB < {MAX_RSS_GROWTH // MiB} MiB",
            growth < MAX_RSS_GROWTH,
        )
    )
    list_ms = _med([s.latency_ms for s in results.get("list", "ours")])
    checks.append(
        (
            f"list of {sizes.list_files} files: median {list_ms:.2f} ms < {MAX_LIST_MS:g} ms",
            list_ms < MAX_LIST_MS,
        )
    )
    down = _med([s.mibs for s in results.get("download_medium", "ours")])
    checks.append(
        (
            f"download: {down:.0f} MiB/s ({down / 1024:.2f} GiB/s) >= 1.5 GiB/s",
            down >= MIN_DOWNLOAD_MIBS,
        )
    )
    heading = "targets of issue #2"
    if quick:
        heading += " (--quick: reduced sizes, indicative only)"
    print(f"\n{heading}, medians over {rounds} round(s), ratios taken inside each round:")
    for text, passed in checks:
        print(f"  {'PASS' if passed else 'FAIL'}  {text}")
    return checks


def describe(root: Path, targets: list[Target]) -> dict:
    """What ran where, printed first and kept with the results."""

    def run(*command: str) -> str:
        try:
            return subprocess.run(
                command, cwd=REPO, capture_output=True, text=True, check=False
            ).stdout.strip()
        except OSError:
            return "?"

    dirty = " (with uncommitted changes)" if run("git", "status", "--porcelain") else ""
    versions = run(
        sys.executable,
        "-c",
        "import importlib.metadata as m;"
        "print(', '.join(f'{p} {m.version(p)}' for p in ('flask', 'werkzeug', 'gunicorn')))",
    )
    info = {
        "commit": run("git", "rev-parse", "--short", "HEAD") + dirty,
        "python": platform.python_version(),
        "packages": versions,
        "cpus": os.cpu_count(),
        "data_dir": str(root),
        "filesystem": " ".join(
            run("df", "--output=source,fstype,avail", "-h", str(root)).split()[3:]
        ),
        "servers": {t.name: t.command for t in targets if t.is_server},
    }
    print(f"commit {info['commit']}; Python {info['python']}; {info['packages']}")
    print(f"{info['cpus']} CPUs; data on {info['filesystem']} at {root}")
    for name, command in info["servers"].items():
        print(f"  {name}: {command}")
    return info


def pick_root(requested: Path | None) -> Path:
    """A temp dir on the same filesystem as the repo: /tmp if it is, else beside the repo."""
    if requested is not None:
        requested.mkdir(parents=True, exist_ok=True)
        parent = requested
    else:
        parent = Path(tempfile.gettempdir())
        if os.stat(parent).st_dev != os.stat(REPO).st_dev:
            parent = REPO.parent
    return Path(tempfile.mkdtemp(prefix="deerflow-bench-", dir=parent))


def aborted(error: KeyboardInterrupt | BenchError) -> int:
    """The exit status of a run stopped early, after saying why: 130 when interrupted
    (Ctrl-C, SIGTERM), 2 when a server answered wrongly or did not start."""
    if isinstance(error, KeyboardInterrupt):
        print("\ninterrupted; cleaning up", file=sys.stderr)
        return 130
    print(f"\nbenchmark aborted: {error}", file=sys.stderr)
    return 2


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description="Upload benchmark (see bench/README.md).")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    parser.add_argument("--data-root", type=Path, help="parent of the temporary data dir")
    parser.add_argument("--json", type=Path, help="also write the samples here")
    parser.add_argument(
        "--no-primer",
        action="store_true",
        help="measure writes from whatever memory state the previous step left",
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    rounds = args.rounds or (1 if args.quick else 3)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)

    root = pick_root(args.data_root)
    if not args.no_primer:
        sizes = replace(sizes, primer_dir=root)
    config = root / "config.yaml"
    limit = 2 * sizes.big + 64 * MiB
    config.write_text(
        f"uploads:\n  max_file_size: {limit}\n  max_total_size: {limit}\n", encoding="utf-8"
    )
    disk = Target("disk", root / "disk")
    disk.data_dir.mkdir()
    targets: list[Target] = [disk]
    started = time.monotonic()
    try:
        print("starting the servers ...")
        targets.append(start_naive(root))
        targets.append(start_ours(root, config))
        info = describe(root, targets)
        for target in targets[1:]:
            populate_list_thread(target, "list-thread", sizes.list_files)
        results = run_rounds(targets, sizes, rounds)
        checks = report(results, sizes, rounds, args.quick)
        elapsed = time.monotonic() - started
        print(f"\n{rounds} round(s) in {elapsed:.0f} s")
        out = args.json or REPO / "bench" / "results" / time.strftime("uploads-%Y%m%d-%H%M%S.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "info": info,
                    "sizes": asdict(sizes),
                    "rounds": rounds,
                    "samples": {
                        key: {name: [asdict(s) for s in ss] for name, ss in by.items()}
                        for key, by in results.samples.items()
                    },
                    "checks": [{"target": t, "passed": p} for t, p in checks],
                },
                indent=2,
                default=str,
            ),
            encoding="utf-8",
        )
        print(f"samples written to {out}")
        return 0 if all(passed for _, passed in checks) else 1
    except (KeyboardInterrupt, BenchError) as error:
        return aborted(error)
    finally:
        for target in reversed(targets):
            target.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
