"""Hundreds of slow clients in one process: uploads or downloads at a fixed rate each.

    python bench/slow_clients.py upload|download --port P --clients 500 --size 1000000 \
        --rate 100000 [--thread-prefix slow] [--download-path PATH] [--deadline 120]

Run by bench_scale.py as a child process, so the load's own CPU never delays the
benchmark's latency probe (they would share one interpreter lock otherwise). Loopback
only. Each upload sends its body in 10 KB pieces at `rate` bytes/s; each download reads
10 KB pieces at that rate through a 16 KiB receive buffer, so the server really has to
wait for the reader instead of dumping the file into the kernel's buffers. Prints one JSON
line: how many succeeded, failed and why, and the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import time

PIECE = 10_000
RECEIVE_BUFFER = 16 * 1024


async def _response_status(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length) if length else b""
    return status, body


async def upload(port: int, thread_id: str, size: int, rate: float) -> str | None:
    boundary = "slowbench" + os.urandom(8).hex()
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
        f'filename="slow.bin"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    head = (
        f"POST /api/threads/{thread_id}/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(part) + size + len(tail)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + part)
        start = time.monotonic()
        sent = 0
        piece = b"u" * PIECE
        while sent < size:
            count = min(PIECE, size - sent)
            writer.write(piece[:count])
            await writer.drain()
            sent += count
            delay = start + sent / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        writer.write(tail)
        await writer.drain()
        status, body = await _response_status(reader)
        if status != 200:
            return f"status {status}"
        stored = json.loads(body)["files"][0]["size"]
        return None if stored == size else f"stored {stored} bytes"
    finally:
        writer.close()


async def download(port: int, path: str, size: int, rate: float) -> str | None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=PIECE)
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return f"status {head[:20]!r}"
        start = time.monotonic()
        received = 0
        while True:
            chunk = await reader.read(PIECE)
            if not chunk:
                break
            received += len(chunk)
            delay = start + received / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        return None if received == size else f"received {received} bytes"
    finally:
        writer.close()


async def main_async(args: argparse.Namespace) -> dict:
    async def one(index: int) -> str | None:
        await asyncio.sleep(index * args.spread / args.clients)  # not all in the same tick
        try:
            if args.mode == "upload":
                job = upload(args.port, f"{args.thread_prefix}-{index}", args.size, args.rate)
            else:
                job = download(args.port, args.download_path, args.size, args.rate)
            return await asyncio.wait_for(job, args.deadline)
        except TimeoutError:
            return "deadline"
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            return type(error).__name__

    start = time.monotonic()
    outcomes = await asyncio.gather(*(one(i) for i in range(args.clients)))
    failures: dict[str, int] = {}
    for outcome in outcomes:
        if outcome is not None:
            failures[outcome] = failures.get(outcome, 0) + 1
    return {
        "clients": args.clients,
        "ok": outcomes.count(None),
        "failures": failures,
        "wall": time.monotonic() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("upload", "download"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=100_000)
    parser.add_argument("--spread", type=float, default=1.0, help="seconds to start them all")
    parser.add_argument("--thread-prefix", default="slow")
    parser.add_argument("--download-path", default="")
    parser.add_argument("--deadline", type=float, default=120)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args))), flush=True)


if __name__ == "__main__":
    main()
