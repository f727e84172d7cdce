"""The multipart reader alone: MiB per CPU-second over an in-memory body, no sockets, no disk.

    .venv/bin/python bench/bench_multipart.py [--rounds 7] [--size-mib 256]
    .venv/bin/python bench/bench_multipart.py --baseline OTHER_CHECKOUT/.../multipart.py

What `bench_uploads.py` measures end to end, less the network and the disk: the body comes
from memory in the reads a server makes (1 MiB at most), and the consumer takes every
piece of every part as the upload service does, either only touching it (`parse`: the
reader's own cost) or hashing it too (`parse+sha256`, what an upload pays in Python).
With `--baseline` another checkout's multipart.py is measured in the same rounds, in
turn with this one, and the ratio (this / baseline) is taken inside each round: only
same-round ratios mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MiB = 1024 * 1024
BOUNDARY = b"----benchboundary7MA4YWxkTrZu0gW"


class MemoryBody:
    """A request body read from memory, at most `READ` bytes a call, as a socket gives."""

    READ = MiB

    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._position = 0

    def readinto(self, buffer: memoryview) -> int:
        count = min(len(buffer), self.READ, len(self._data) - self._position)
        buffer[:count] = self._data[self._position : self._position + count]
        self._position += count
        return count


def body_of(parts: list[tuple[str, int]]) -> memoryview:
    block = os.urandom(MiB)
    out = bytearray()
    for name, size in parts:
        out += b"--" + BOUNDARY + b"\r\n"
        out += f'Content-Disposition: form-data; name="files"; filename="{name}"\r\n'.encode()
        out += b"Content-Type: application/octet-stream\r\n\r\n"
        whole, part = divmod(size, MiB)
        out += block * whole + block[:part] + b"\r\n"
    out += b"--" + BOUNDARY + b"--\r\n"
    return memoryview(bytes(out))


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(module: ModuleType, body: memoryview, expected: int, hashing: bool) -> float:
    """Seconds to read every part of `body` with `module`'s reader."""
    started = time.process_time()
    reader = module.MultipartReader(MemoryBody(body), BOUNDARY)
    received = 0
    for incoming in reader:
        digest = hashlib.sha256() if hashing else None
        while piece := incoming.stream.read():
            received += len(piece)
            if digest is not None:
                digest.update(piece)
    seconds = time.process_time() - started
    if received != expected:
        raise SystemExit(f"{module.__name__} read {received} bytes of file data, not {expected}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--baseline", type=Path, help="another checkout's multipart.py")
    args = parser.parse_args()
    ours = load(REPO / "deerflow_web" / "web" / "transport" / "multipart.py", "multipart_ours")
    targets = {"ours": ours}
    if args.baseline is not None:
        targets["baseline"] = load(args.baseline.resolve(), "multipart_baseline")
    size = args.size_mib * MiB
    bodies = {
        f"1 x {args.size_mib} MiB": body_of([("big.bin", size)]),
        f"{args.size_mib} x 1 MiB": body_of([(f"{i}.bin", MiB) for i in range(args.size_mib)]),
    }
    print(f"python {sys.version.split()[0]}, {args.rounds} rounds, {len(bodies)} bodies")
    figures: dict[tuple[str, str, bool], list[float]] = {}
    for round_index in range(args.rounds):
        order = list(targets.items())
        if round_index % 2:
            order.reverse()  # nobody always goes first
        for label, body in bodies.items():
            for hashing in (False, True):
                for name, module in order:
                    seconds = run(module, body, size, hashing)
                    figures.setdefault((label, name, hashing), []).append(len(body) / MiB / seconds)
    print(f"{'body':<16}{'consumer':<16}{'target':<10}{'MiB/CPU-s':>14}{'ratio':>22}")
    for label in bodies:
        for hashing in (False, True):
            consumer = "parse+sha256" if hashing else "parse"
            for name in targets:
                speeds = figures[(label, name, hashing)]
                ratio = ""
                if name == "ours" and "baseline" in targets:
                    base = figures[(label, "baseline", hashing)]
                    ratios = [a / b for a, b in zip(speeds, base, strict=True)]
                    ratio = f"{statistics.median(ratios):.3f} [{min(ratios):.2f}-{max(ratios):.2f}]"
                median = statistics.median(speeds)
                print(f"{label:<16}{consumer:<16}{name:<10}{median:>14.0f}{ratio:>22}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
