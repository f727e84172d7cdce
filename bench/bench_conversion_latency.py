"""Does a running conversion slow the server down for everybody else?

Starts the server exactly as `make run` does, uploads a generated 200-page PDF, then times
small requests (the upload limits and a thread listing) three ways: with nothing else
going on, while the PDF is being converted (the convert call answers 202 at once and the
job runs in a limited child process), and again afterwards. Prints latency percentiles
per phase and the ratio of the busy phase to the idle one.

    .venv/bin/python bench/bench_conversion_latency.py [--pages 200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from bench_uploads import HOST  # noqa: E402
from bench_uploads import start_ours  # noqa: E402

THREAD = "latency"
PROBES = ("/api/threads/latency/uploads/limits", "/api/threads/latency/uploads/list")


def request(port: int, method: str, path: str) -> tuple[int, bytes, float]:
    started = time.perf_counter()
    connection = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    return response.status, body, (time.perf_counter() - started) * 1000


def upload(port: int, name: str, data: bytes) -> None:
    boundary = "latencybench"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
            f'filename="{name}"\r\n\r\n'
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    connection = http.client.HTTPConnection(HOST, port, timeout=60)
    connection.request(
        "POST",
        f"/api/threads/{THREAD}/uploads",
        body=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    response = connection.getresponse()
    assert response.status == 200, response.read()
    connection.close()


def probe(port: int, seconds: float, until: callable | None = None) -> list[float]:
    """Latencies (ms) of alternating small requests for `seconds` or until `until()`."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until and until()):
        for path in PROBES:
            status, _, elapsed = request(port, "GET", path)
            assert status == 200, (path, status)
            latencies.append(elapsed)
        time.sleep(0.01)
    return latencies


def summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p95 = ordered[int(len(ordered) * 0.95) - 1]
    return (
        f"n={len(ordered):4d}  p50 {statistics.median(ordered):6.2f} ms  "
        f"p95 {p95:6.2f} ms  max {ordered[-1]:7.2f} ms"
    )


def conversion_state(port: int) -> str | None:
    _, body, _ = request(port, "GET", PROBES[1])
    files = {f["filename"]: f for f in json.loads(body)["files"]}
    return files["big.pdf"]["conversion_state"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=200)
    args = parser.parse_args()
    from tests.support.documents import make_pdf

    with tempfile.TemporaryDirectory(prefix="deerflow-bench-") as scratch:
        root = Path(scratch)
        config = root / "config.yaml"
        config.write_text("uploads:\n  conversion_wait_seconds: 0.2\n")
        pdf = make_pdf(root / "big.pdf", filler_pages=args.pages)
        server = start_ours(root, config)
        try:
            print(f"server: {server.command}")
            print(f"document: {args.pages + 1} pages, {pdf.stat().st_size / 1e6:.2f} MB")
            upload(server.port, "big.pdf", pdf.read_bytes())
            idle = probe(server.port, 5)
            started = time.monotonic()
            status, body, elapsed = request(
                server.port, "POST", f"/api/threads/{THREAD}/uploads/big.pdf/convert"
            )
            print(
                f"convert answered {status} in {elapsed:.0f} ms: "
                f"{json.loads(body).get('conversion_state')}"
            )
            busy = probe(
                server.port, 600, until=lambda: conversion_state(server.port) in ("done", "failed")
            )
            converted = time.monotonic() - started
            after = probe(server.port, 5)
            print(
                f"conversion took {converted:.1f} s "
                f"({converted / (pdf.stat().st_size / 1e6):.1f} s per MB)"
            )
            print(f"idle        {summary(idle)}")
            print(f"converting  {summary(busy)}")
            print(f"after       {summary(after)}")
            ratio = statistics.median(busy) / statistics.median(idle)
            print(f"median latency while converting / idle: {ratio:.2f}x")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
