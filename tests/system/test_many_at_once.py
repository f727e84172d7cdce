"""Health endpoints, the drift check that does not stat every file, pagination, bounded
buffers and CPU-bound work moved off gevent's loop (speed is measured in bench/)."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.concurrency import off_loop
from deerflow_web.concurrency import start_beside
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.models import UploadLimits
from deerflow_web.services.uploads import service as uploads_module
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.settings import load_settings
from deerflow_web.storage import local
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.paths import ThreadPaths
from deerflow_web.storage.records import DatabaseUploadRecords
from deerflow_web.web.transport import multipart
from deerflow_web.web.transport.multipart import LargeBuffers
from deerflow_web.web.transport.multipart import MultipartReader
from tests.helpers import UploadActions
from tests.helpers import uploads_dir

# --- /healthz and /readyz ------------------------------------------------------------


def test_healthz(client: FlaskClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}
    assert response.headers["Cache-Control"] == "no-store"


def test_readyz_when_all_is_well(client: FlaskClient, base_dir: Path) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.get_json() == {
        "status": "ok",
        "database": "ok",
        "storage": "ok",
        "bucket": "off",
        "scanner": "off",
        "jobs": "on",
    }
    assert not [name for name in os.listdir(base_dir) if name.startswith(".readyz-")]


def test_readyz_names_a_data_dir_that_cannot_take_a_file(
    client: FlaskClient, base_dir: Path
) -> None:
    client.get("/readyz")
    shutil.rmtree(base_dir)
    base_dir.write_text("the volume is gone and a file sits in its place")
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["status"] == "unavailable"
    assert body["storage"] == "failed"
    assert body["detail"].startswith("storage: data dir is not writable")


def test_readyz_names_an_unreachable_database(app: Flask, client: FlaskClient) -> None:
    records = app.extensions["deerflow_web"].uploads.records
    records.engine.dispose()
    path = Path(records.engine.url.database)
    for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        leftover.unlink(missing_ok=True)
    path.mkdir()  # SQLite cannot open a directory
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["database"] == "failed"
    assert body["storage"] == "ok"
    assert "database: records database unreachable" in body["detail"]


def test_health_endpoints_need_no_session_and_ignore_language(client: FlaskClient) -> None:
    response = client.get("/readyz", headers={"Accept-Language": "zh", "Accept": "text/html"})
    assert response.is_json


def test_idle_timeout_setting(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("server:\n  idle_timeout_seconds: 15\n")
    assert load_settings(tmp_path, config_path=config).idle_timeout_seconds == 15.0
    config.write_text("server:\n  idle_timeout_seconds: -3\n")
    assert load_settings(tmp_path, config_path=config).idle_timeout_seconds == 60.0
    assert load_settings(tmp_path).idle_timeout_seconds == 60.0


# --- drift checks without a stat per file --------------------------------------------


@pytest.fixture
def counted_scans(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every full folder scan the upload service makes; folders count as settled at once."""
    scans: list[Path] = []
    real = uploads_module.scan_regular_files

    def counting(folder: Path, known: Any = None) -> dict:
        scans.append(folder)
        return real(folder, known)

    monkeypatch.setattr(uploads_module, "scan_regular_files", counting)
    monkeypatch.setattr(uploads_module, "SETTLED_SECONDS", 0.0)
    return scans


def test_an_unchanged_folder_is_not_scanned_again(
    uploads: UploadActions, counted_scans: list[Path]
) -> None:
    uploads.upload("T", (b"a", "a.txt"), (b"b", "b.txt"))
    assert uploads.names("T") == ["a.txt", "b.txt"]
    scans = len(counted_scans)
    for _ in range(3):
        assert uploads.names("T") == ["a.txt", "b.txt"]
    assert len(counted_scans) == scans


def test_files_added_or_removed_behind_the_apps_back_are_noticed_at_once(
    uploads: UploadActions, base_dir: Path, counted_scans: list[Path]
) -> None:
    uploads.upload("T", (b"a", "a.txt"), (b"b", "b.txt"))
    uploads.names("T")
    folder = uploads_dir(base_dir, "T")
    (folder / "added.txt").write_bytes(b"new")
    assert uploads.names("T") == ["a.txt", "added.txt", "b.txt"]
    (folder / "a.txt").unlink()
    assert uploads.names("T") == ["added.txt", "b.txt"]
    os.rename(folder / "b.txt", folder / "c.txt")
    assert uploads.names("T") == ["added.txt", "c.txt"]


def test_an_edit_in_place_is_noticed_by_the_periodic_scan(
    uploads: UploadActions, base_dir: Path, counted_scans: list[Path], monkeypatch
) -> None:
    uploads.upload("T", (b"short", "a.txt"))
    uploads.names("T")
    (uploads_dir(base_dir, "T") / "a.txt").write_bytes(b"edited in place, longer")
    stale = uploads.list("T")["files"][0]
    assert stale["size"] == len(b"short")  # the folder itself did not change
    monkeypatch.setattr(uploads_module, "RESCAN_SECONDS", 0.0)
    assert uploads.list("T")["files"][0]["size"] == len(b"edited in place, longer")


def test_a_recently_changed_folder_is_always_scanned(
    uploads: UploadActions, base_dir: Path, monkeypatch
) -> None:
    """Within SETTLED_SECONDS of a change the folder's timestamps cannot be trusted."""
    monkeypatch.setattr(uploads_module, "SETTLED_SECONDS", 3600.0)
    uploads.upload("T", (b"short", "a.txt"))
    uploads.names("T")
    (uploads_dir(base_dir, "T") / "a.txt").write_bytes(b"edited in place, longer")
    assert uploads.list("T")["files"][0]["size"] == len(b"edited in place, longer")


def test_a_deleted_thread_folder_empties_the_list(
    uploads: UploadActions, base_dir: Path, counted_scans: list[Path]
) -> None:
    uploads.upload("T", (b"a", "a.txt"))
    uploads.names("T")
    shutil.rmtree(uploads_dir(base_dir, "T"))
    assert uploads.names("T") == []


def test_the_cached_listing_follows_every_change(uploads: UploadActions) -> None:
    uploads.upload("T", (b"a", "a.txt"))
    first = uploads.list("T")
    assert first == uploads.list("T")
    uploads.upload("T", (b"b", "a.txt"))  # replaced: same name, new content
    assert uploads.list("T")["files"][0]["size"] == 1
    assert uploads.list("T")["files"][0]["sha256"] != first["files"][0]["sha256"]
    uploads.upload("U", (b"a", "a.txt"))  # same records shape in another thread
    assert uploads.list("U")["files"][0]["artifact_url"].startswith("/api/threads/U/")


# --- the thread page, one page at a time ---------------------------------------------


def _rows(html: str) -> int:
    return html.count('class="file-row')


def test_a_large_thread_page_shows_one_page_with_a_pager(
    client: FlaskClient, base_dir: Path
) -> None:
    folder = uploads_dir(base_dir, "T")
    folder.mkdir(parents=True)
    for number in range(250):
        (folder / f"f{number:03d}.txt").write_bytes(b"%d" % number)
    first = client.get("/threads/T").get_data(as_text=True)
    assert _rows(first) == 100
    assert "f000.txt" in first and "f100.txt" not in first
    assert "Page 1 of 3" in first and 'rel="next"' in first and 'rel="prev"' not in first
    last = client.get("/threads/T?page=3").get_data(as_text=True)
    assert _rows(last) == 50
    assert "f249.txt" in last and 'rel="prev"' in last and 'rel="next"' not in last
    assert "Showing 201-250 of 250" in last
    beyond = client.get("/threads/T?page=99").get_data(as_text=True)
    assert "Page 3 of 3" in beyond
    for odd in ("0", "-2", "x", ""):
        assert "Page 1 of 3" in client.get(f"/threads/T?page={odd}").get_data(as_text=True)


def test_sorting_keeps_the_filter_and_starts_at_page_one(
    client: FlaskClient, base_dir: Path
) -> None:
    folder = uploads_dir(base_dir, "T")
    folder.mkdir(parents=True)
    for number in range(150):
        (folder / f"f{number:03d}.txt").write_bytes(b"x" * number)  # all sizes differ
    page = client.get("/threads/T?page=2&sort=size&order=desc").get_data(as_text=True)
    assert _rows(page) == 50
    assert "f049.txt" in page and "f050.txt" not in page
    assert "page=2" not in page.split('id="files-table"')[1].split("</thead>")[0]
    filtered = client.get("/threads/T?q=f14").get_data(as_text=True)
    assert _rows(filtered) == 10 and 'class="pager"' not in filtered


def test_a_small_thread_has_no_pager(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload("T", (b"a", "a.txt"))
    assert 'class="pager"' not in client.get("/threads/T").get_data(as_text=True)


# --- bounded read buffers ------------------------------------------------------------


def test_large_buffers_are_bounded_and_come_back_with_their_buffer() -> None:
    pool = LargeBuffers(2)
    first, second = pool.take(), pool.take()
    assert first is not None and second is not None and len(first) == 1024 * 1024
    assert pool.take() is None
    view = memoryview(first)[:10]
    del first
    assert pool.free == 0  # a view still points into it
    del view
    assert pool.free == 1
    del second
    assert pool.free == 2


# --- a lone fast upload hashes beside the loop ----------------------------------------


class FastBody:
    """A request body from a client that keeps up: every read is filled."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    def readinto(self, buffer: memoryview) -> int:
        count = min(len(buffer), len(self._data))
        buffer[:count] = self._data[:count]
        self._data = self._data[count:]
        return count


BOUNDARY = b"lone-fast-upload"


def multipart_body(files: dict[str, bytes]) -> bytes:
    body = b""
    for name, data in files.items():
        body += b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="files"; '
        body += f'filename="{name}"\r\n\r\n'.encode() + data + b"\r\n"
    return body + b"--" + BOUNDARY + b"--\r\n"


@pytest.fixture
def own_buffers(monkeypatch: pytest.MonkeyPatch) -> LargeBuffers:
    """A fresh pool of megabyte buffers, and a process that looks like gevent's loop."""
    pool = LargeBuffers(16)
    monkeypatch.setattr(multipart, "large_buffers", pool)
    monkeypatch.setattr(multipart, "on_event_loop", lambda: True)
    return pool


def test_a_lone_fast_uploads_chunks_stay_intact_until_their_hash_is_waited_for(
    base_dir: Path, own_buffers: LargeBuffers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each hash handed beside runs as late as it may (when the next write or the finish
    waits for it): the reader must not have read into its chunk by then."""
    handed: list[int] = []

    def as_late_as_possible(function: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        handed.append(len(args[0]))
        return lambda: function(*args)

    monkeypatch.setattr(local, "start_beside", as_late_as_possible)
    rng = random.Random(7)
    files = {
        "a.bin": rng.randbytes(3 * 1024 * 1024 + 5),
        "b.bin": rng.randbytes(1024 * 1024 + 17),
        "c.bin": rng.randbytes(300 * 1024),
    }
    limits = UploadLimits(max_files=10, max_file_size=8 * 1024 * 1024, max_total_size=1 << 30)
    paths = ThreadPaths(base_dir)
    service = UploadService(paths, DatabaseUploadRecords(open_database(base_dir)), limits)
    reader = MultipartReader(FastBody(multipart_body(files)), BOUNDARY)

    service.save_uploads(ThreadRef.single_user("T"), reader)

    assert len(handed) >= 4  # the test is about hashes that ran beside
    records = {
        s.record.filename: s.record
        for s in service.records.all(paths.scope(ThreadRef.single_user("T")))
    }
    assert {name: r.sha256 for name, r in records.items()} == {
        name: hashlib.sha256(data).hexdigest() for name, data in files.items()
    }
    folder = uploads_dir(base_dir, "T", None)
    assert {name: (folder / name).read_bytes() == data for name, data in files.items()} == {
        "a.bin": True,
        "b.bin": True,
        "c.bin": True,
    }


def first_piece(incoming: IncomingFile) -> memoryview | bytes:
    piece = incoming.stream.read()
    while len(piece) < 256 * 1024:  # past the small first chunk
        piece = incoming.stream.read()
    return piece


def test_a_second_fast_upload_takes_the_spare_buffer_back(own_buffers: LargeBuffers) -> None:
    big = bytes(4 * 1024 * 1024)
    first = next(iter(MultipartReader(FastBody(multipart_body({"a": big})), BOUNDARY)))
    first_piece(first)
    assert first.piece_outlives_next_read()
    assert own_buffers.free == 14  # two buffers, read into in turn

    second = next(iter(MultipartReader(FastBody(multipart_body({"b": big})), BOUNDARY)))
    first_piece(second)
    assert not second.piece_outlives_next_read()  # not alone: one buffer
    assert own_buffers.free == 13

    first.stream.read()  # the next read of the first upload lets its spare go
    gc.collect()
    assert not first.piece_outlives_next_read()
    assert own_buffers.free == 14


def test_under_threads_an_upload_reads_into_one_buffer(
    own_buffers: LargeBuffers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(multipart, "on_event_loop", lambda: False)
    incoming = next(
        iter(MultipartReader(FastBody(multipart_body({"a": bytes(1 << 22)})), BOUNDARY))
    )
    first_piece(incoming)
    assert not incoming.piece_outlives_next_read()
    assert own_buffers.free == 15


def test_start_beside_runs_on_a_native_thread_while_the_loop_goes_on() -> None:
    outcome = script_outcome(
        textwrap.dedent(
            """
            from gevent import monkey
            monkey.patch_all()
            import hashlib, json, threading
            import gevent
            from deerflow_web.concurrency import start_beside

            ticks = []
            def ticker():
                while True:
                    ticks.append(1)
                    gevent.sleep(0.001)

            gevent.spawn(ticker)
            data = bytes(256 * 1024 * 1024)
            def work():
                return threading.get_ident(), hashlib.sha256(data).hexdigest()

            wait = start_beside(work)
            before = len(ticks)
            ident, digest = wait()
            print(json.dumps({
                "elsewhere": ident != threading.get_ident(),
                "right": digest == hashlib.sha256(data).hexdigest(),
                "ticks_while_waiting": len(ticks) - before,
            }))
            """
        )
    )
    assert outcome["elsewhere"] and outcome["right"]
    assert outcome["ticks_while_waiting"] > 0


def test_start_beside_runs_in_place_without_gevent() -> None:
    import threading

    wait = start_beside(threading.get_ident)
    assert wait() == threading.get_ident()


# --- CPU-bound work and gevent -------------------------------------------------------


def test_off_loop_runs_in_place_without_gevent() -> None:
    import threading

    assert off_loop(threading.get_ident) == threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        off_loop(lambda: 1 / 0)


def test_a_turn_lets_connections_waiting_on_their_sockets_answer() -> None:
    """A greenlet that never waits (a fast client's upload) and steps aside at the end of
    each turn: a connection beside it answers pings all along, not only when it ends."""
    outcome = script_outcome(
        textwrap.dedent(
            """
            from gevent import monkey
            monkey.patch_all()
            import json, socket, time
            import gevent
            from deerflow_web.concurrency import Turn

            ours, theirs = socket.socketpair()
            answers = []

            def echo():
                while data := theirs.recv(1):
                    theirs.send(data)

            def ping():
                while True:
                    ours.send(b"x")
                    ours.recv(1)
                    answers.append(time.monotonic())
                    gevent.sleep(0.001)

            def stream(seconds):
                turn, end = Turn(), time.monotonic() + seconds
                while time.monotonic() < end:
                    sum(range(2000))  # a chunk's work, never waiting
                    turn.step_aside()

            gevent.spawn(echo)
            gevent.spawn(ping)
            gevent.sleep(0.01)
            before = len(answers)
            gevent.spawn(stream, 1.0).join()
            print(json.dumps({"answers_while_streaming": len(answers) - before}))
            """
        )
    )
    # One per turn at most, and a turn is 5 ms: about 200 in that second, 2 when starved.
    assert outcome["answers_while_streaming"] >= 50


def test_an_error_off_the_loop_reaches_the_caller_and_is_not_printed_as_a_crash() -> None:
    """A domain error raised in gevent's pool (a missing file answered as a 404) is the
    caller's to handle: raised there with its traceback, never printed by the pool."""
    script = textwrap.dedent(
        """
        from gevent import monkey
        monkey.patch_all()
        import json, traceback
        from deerflow_web.concurrency import off_loop, start_beside

        def missing():
            raise FileNotFoundError("report.pdf")

        caught = []
        for run in (lambda: off_loop(missing), lambda: start_beside(missing)()):
            try:
                run()
            except FileNotFoundError as error:
                caught.append("missing" in "".join(traceback.format_tb(error.__traceback__)))
        print(json.dumps({"caught": caught}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"caught": [True, True]}
    assert "Traceback" not in result.stderr and "FileNotFoundError" not in result.stderr


def script_outcome(script: str, *args: str) -> dict[str, Any]:
    """Run `script` in a fresh interpreter (gevent patches a whole process) and return the
    JSON object its last output line holds."""
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


GEVENT_SCRIPT = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import contextvars, json, sys, threading, time
    import gevent
    from deerflow_web.concurrency import off_loop

    ticks = []
    def ticker():
        while True:
            ticks.append(time.monotonic())
            gevent.sleep(0.01)

    def spin(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sum(range(1000))
        return threading.get_ident()

    var = contextvars.ContextVar("var")
    var.set("caller")
    tick = gevent.spawn(ticker)
    gevent.sleep(0.05)
    before = len(ticks)
    worker = off_loop(spin, 1.0)
    during = len(ticks) - before
    try:
        off_loop(lambda: 1 / 0)
        raised = False
    except ZeroDivisionError:
        raised = True
    before = len(ticks)
    spin(0.5)  # the same work in place: the loop stands still
    frozen = len(ticks) - before
    print(json.dumps({
        "other_thread": worker != threading.get_ident(),
        "during": during, "frozen": frozen, "raised": raised,
        "context": off_loop(var.get),
    }))
    """
)


def test_off_loop_keeps_gevents_loop_running() -> None:
    outcome = script_outcome(GEVENT_SCRIPT)
    assert outcome["other_thread"] and outcome["raised"]
    assert outcome["context"] == "caller"
    assert outcome["frozen"] <= 1  # in place, no other greenlet ran
    assert outcome["during"] >= 5  # off the loop, the ticker kept ticking


TURN_SCRIPT = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, time
    import gevent
    from deerflow_web.concurrency import Turn

    log = []
    def neighbour():  # a greenlet that always has work: it runs whenever the stream yields
        while True:
            log.append("n")
            gevent.sleep(0)

    def stream(turn, seconds):
        \"\"\"A transfer whose reads never wait: only `step_aside` lets others run.\"\"\"
        del log[:]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sum(range(200))  # one chunk's work
            log.append("s")
            turn.step_aside()
        yields = sum(1 for a, b in zip(log, log[1:]) if a == "s" and b == "n")
        return {"yields": yields, "chunks": log.count("s")}

    gevent.spawn(neighbour)
    gevent.sleep(0.01)
    print(json.dumps({"sliced": stream(Turn(0.005), 0.3), "long_turn": stream(Turn(10.0), 0.3)}))
    """
)


def test_a_streaming_greenlet_steps_aside_once_per_turn() -> None:
    outcome = script_outcome(TURN_SCRIPT)
    sliced, long_turn = outcome["sliced"], outcome["long_turn"]
    # 0.3 s in turns of 5 ms, each stepping aside for at most one more turn while the
    # neighbour keeps the loop busy: about 30 yields (fewer on a busy machine), where a
    # yield per chunk would have been thousands...
    assert 5 <= sliced["yields"] <= 70
    assert sliced["chunks"] > 20 * sliced["yields"]  # the stream kept working between
    # ...and a turn longer than the transfer never lets it run at all.
    assert long_turn["yields"] == 0


def test_turn_never_sleeps_without_gevent() -> None:
    from deerflow_web.concurrency import Turn

    turn = Turn(0.0)
    start = time.perf_counter()
    for _ in range(10_000):
        turn.step_aside()
    assert time.perf_counter() - start < 1.0  # nothing but a clock read each time


ACCEPT_SCRIPT = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, socket, gevent
    from gevent.pool import Pool
    import deerflow_web.web.transport.server as server

    def accepts_per_turn(busy):
        listener = socket.create_server(("127.0.0.1", 0))
        pool = Pool(1000)
        for _ in range(busy):
            pool.spawn(gevent.sleep, 60)  # connections already open on this worker
        turns, handled = [], []
        class Counting(server._AcceptingServer):
            def _do_read(self):  # one turn of the loop: accept what it may
                before = len(handled)
                super()._do_read()
                turns.append(len(handled) - before)
            def do_handle(self, *args):  # one connection accepted
                handled.append(args)
                super().do_handle(*args)
        accepting = Counting(listener, handle=lambda s, a: None, spawn=pool)
        accepting.max_accept = 1  # what gunicorn sets with several workers
        clients = [socket.create_connection(listener.getsockname()) for _ in range(8)]
        accepting.start()
        while len(handled) < 8:
            gevent.sleep(0.01)
        accepting.stop()
        pool.kill()
        return turns

    print(json.dumps({"quiet": accepts_per_turn(0),
                      "busy": accepts_per_turn(server.BUSY_CONNECTIONS)}))
    """
)


def test_a_quiet_worker_accepts_one_connection_per_turn_a_busy_one_a_batch() -> None:
    """One per turn spreads a burst between the workers (the other wakes too and takes its
    share); once hundreds of connections make a turn long, new ones come in a batch."""
    outcome = script_outcome(ACCEPT_SCRIPT)
    assert outcome["quiet"] == [1] * 8
    assert outcome["busy"] == [8]


SENDFILE_SCRIPT = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import os, socket, tempfile, gevent
    import deerflow_web.web.transport.server as server

    calls = []
    real = os.sendfile
    def spy(*args):
        calls.append(args[3])
        return real(*args)
    server.os.sendfile = spy

    sender, receiver = socket.socketpair()
    sender.__class__ = server._SendfileSocket
    data = os.urandom(3_000_000)
    with tempfile.TemporaryFile() as handle:
        handle.write(data)
        handle.flush()
        reader = gevent.spawn(lambda: b"".join(iter(lambda: receiver.recv(65536), b"")))
        sent = sender.sendfile(handle, 1000, 2_000_000)
        position = handle.tell()
        sender.close()
        got = reader.get()
    print(sent == 2_000_000, got == data[1000:2_001_000], position == 2_001_000, len(calls) > 0)
    """
)


def test_the_workers_sockets_send_files_with_the_kernels_sendfile() -> None:
    """gevent's own sockets copy a download through Python; the worker's use os.sendfile,
    waiting on the loop whenever the socket is full (the reader here is a greenlet)."""
    result = subprocess.run(
        [sys.executable, "-c", SENDFILE_SCRIPT], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["True", "True", "True", "True"]


EAGER_SCRIPT = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, os, socket, tempfile, time, gevent
    import deerflow_web.web.transport.server as server

    calls = []  # each sendfile call: (when, bytes sent or -1 for a full socket)
    real = os.sendfile
    def spy(*args):
        try:
            done = real(*args)
        except BlockingIOError:
            calls.append((time.monotonic(), -1))
            raise
        calls.append((time.monotonic(), done))
        return done
    server.os.sendfile = spy
    waits = []  # each wait on the loop for room in the socket
    loop_wait = server._SendfileSocket._wait
    def counted_wait(self, *args, **kwargs):
        waits.append(time.monotonic())
        return loop_wait(self, *args, **kwargs)
    server._SendfileSocket._wait = counted_wait

    data = os.urandom(20_000_000)
    handle = tempfile.TemporaryFile()
    handle.write(data)
    handle.flush()

    def serve(reader, timeout=None):
        \"\"\"Send the file to `reader(receiving socket)`; the sendfile calls and outcome.\"\"\"
        calls.clear()
        waits.clear()
        sender, receiver = socket.socketpair()
        sender.__class__ = server._SendfileSocket
        sender.settimeout(timeout)
        task = gevent.spawn(reader, receiver)
        try:
            sender.sendfile(handle, 0, len(data))
            outcome = "sent"
        except TimeoutError:
            outcome = "timed out"
        ended = time.monotonic()
        sender.close()
        got = task.get()
        receiver.close()
        return [done for _, done in calls], outcome, got, [when for when, _ in calls], ended

    def read_all(receiver):
        return b"".join(iter(lambda: receiver.recv(1 << 20), b""))

    def stall_first(receiver):
        gevent.sleep(0.5)
        return read_all(receiver)

    stalled = []
    def stall_midway(receiver):
        head = b""
        while len(head) < 5_000_000:
            head += receiver.recv(1 << 20)
        stalled.append(time.monotonic())
        gevent.sleep(1.0)
        return head

    fast, fast_outcome, fast_got, _, _ = serve(read_all)
    waits_of_fast = list(waits)
    slow, slow_outcome, slow_got, _, _ = serve(stall_first)
    _, midway_outcome, _, times, ended = serve(stall_midway, timeout=0.3)
    print(json.dumps({
        "fast_intact": fast_got == data and fast_outcome == "sent",
        "fast_full": fast.count(-1),
        "fast_waits": len(waits_of_fast),
        "slow_intact": slow_got == data and slow_outcome == "sent",
        "slow_calls_while_stalled": slow.index(next(c for c in slow[2:] if c > 0), 2),
        "midway": midway_outcome,
        "midway_calls_while_stalled": sum(1 for when in times if when > stalled[0]),
        "midway_seconds_to_drop": ended - stalled[0],
    }))
    """
)


def test_a_fast_readers_download_is_refilled_eagerly_and_a_slow_one_waits() -> None:
    """A reader that drains its buffer at once gets the next bytes after a turn of the loop;
    one that stalls costs no calls while it stalls, and the idle timeout still applies."""
    outcome = script_outcome(EAGER_SCRIPT)
    assert outcome["fast_intact"] and outcome["slow_intact"]
    # full more often than it waited: it retried after a turn of the loop instead
    assert outcome["fast_full"] > 4 * outcome["fast_waits"]
    # a reader stalled from the start: one full call, then a wait on the loop, no spinning
    assert outcome["slow_calls_while_stalled"] <= 3
    # fast, then stalled: a bounded number of retries, then the idle timeout drops it
    from deerflow_web.web.transport.server import EAGER_TURNS

    assert outcome["midway"] == "timed out"
    assert outcome["midway_calls_while_stalled"] <= EAGER_TURNS + 4
    assert 0.3 <= outcome["midway_seconds_to_drop"] < 0.9


# The start of a gevent script about SQLite's write lock: `records` on the file named by
# argv[1], and `hold_write_lock`, which has another process take that lock for a while.
SQLITE_LOCK_PRELUDE = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, subprocess, sys, time
    import gevent
    from pathlib import Path
    from deerflow_web.storage.migrate import open_database
    from deerflow_web.storage.records import DatabaseUploadRecords

    path = Path(sys.argv[1])
    records = DatabaseUploadRecords(open_database(path.parent))

    def hold_write_lock(seconds):
        holder = subprocess.Popen([sys.executable, "-c", (
            "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute('BEGIN IMMEDIATE'); print('held', flush=True); "
            "time.sleep(float(sys.argv[2])); db.execute('COMMIT')"), str(path), str(seconds)],
            stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "held"
        return holder
    """
)

LOCK_SCRIPT = SQLITE_LOCK_PRELUDE + textwrap.dedent(
    """
    holder = hold_write_lock(1.0)
    ticks = []
    def ticker():
        while True:
            ticks.append(1)
            gevent.sleep(0.01)
    gevent.spawn(ticker)
    started = time.monotonic()
    with records.locked("T") as txn:
        waited = time.monotonic() - started
        txn.delete("nothing")
    holder.wait()
    print(json.dumps({"waited": waited, "ticks": len(ticks)}))
    """
)


def test_waiting_for_another_processs_write_lock_keeps_the_loop_running(tmp_path: Path) -> None:
    """SQLite's busy handler would sleep in C and freeze every greenlet of the process."""
    outcome = script_outcome(LOCK_SCRIPT, str(tmp_path / "deerflow.sqlite3"))
    assert outcome["waited"] > 0.3  # it did wait for the other process
    assert outcome["ticks"] >= 10  # and the other greenlet ran meanwhile


QUEUE_SCRIPT = SQLITE_LOCK_PRELUDE + textwrap.dedent(
    """
    from deerflow_web.storage import database

    polled = []  # which greenlet asked SQLite for the write lock, once per try
    real_retry = database._retry_busy
    def spy(attempt):
        def counted():
            polled.append(id(gevent.getcurrent()))
            return attempt()
        return real_retry(counted)
    database._retry_busy = spy
    holder = hold_write_lock(0.6)

    def write(index):
        with records.locked(f"T{index}") as txn:
            txn.delete("nothing")
        return index

    writers = [gevent.spawn(write, i) for i in range(30)]
    gevent.sleep(0.4)  # the other process still holds the lock
    while_held = set(polled)
    done = [w.get(timeout=30) for w in writers]
    holder.wait()
    print(json.dumps({"pollers_while_held": len(while_held), "tries_while_held": len(polled),
                      "done": len(done)}))
    """
)


def test_one_writer_per_process_polls_for_sqlites_write_lock(tmp_path: Path) -> None:
    """500 uploads committing at once used to retry BEGIN IMMEDIATE each, and a fast
    client's list waited behind the retries; the others now queue in the process."""
    outcome = script_outcome(QUEUE_SCRIPT, str(tmp_path / "deerflow.sqlite3"))
    assert outcome["pollers_while_held"] == 1
    assert outcome["done"] == 30  # every writer got its turn once the lock was free


PG_WAIT_SCRIPT = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, sys, time
    import gevent
    from pathlib import Path
    from sqlalchemy import text
    from deerflow_web.storage.migrate import open_database

    engine = open_database(Path(sys.argv[2]), sys.argv[1])
    ticks = []
    def ticker():
        while True:
            ticks.append(1)
            gevent.sleep(0.01)
    gevent.spawn(ticker)
    started = time.monotonic()
    with engine.connect() as db:
        db.execute(text("SELECT pg_sleep(0.5)"))
    print(json.dumps({"waited": time.monotonic() - started, "ticks": len(ticks)}))
    engine.dispose()
    """
)


def test_waiting_for_postgresql_keeps_the_loop_running(tmp_path: Path, postgres_url: str) -> None:
    """psycopg waits for the server through gevent's loop, not inside libpq."""
    outcome = script_outcome(PG_WAIT_SCRIPT, postgres_url, str(tmp_path))
    assert outcome["waited"] >= 0.5
    assert outcome["ticks"] >= 20  # the other greenlet ran while the query waited


def test_health_probes_answer_whatever_host_they_name(client: FlaskClient) -> None:
    """A load balancer probes by the instance's address, which is no allowed host."""
    probe = {"Host": "10.1.2.3:2026"}
    assert client.get("/healthz", headers=probe).status_code == 200
    assert client.get("/readyz", headers=probe).status_code == 200
    assert client.get("/api/threads/T/uploads/list", headers=probe).status_code == 400
