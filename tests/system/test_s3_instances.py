"""Instances on the S3 backend as a deployment runs them: real processes, one PostgreSQL
database and one SeaweedFS bucket shared, nothing else.

Each instance is a `make run`-style gunicorn server (or a `flask --app app worker`) with
a data dir of its own, empty at first, and `storage.backend: s3` set by environment, as
on machines of their own. What one stores, the other lists, serves, converts and hands
to the agent; a process killed while pushing a file to the bucket leaves nothing listed
and an unfinished multipart upload that `files sweep` aborts; a bucket out of reach makes
uploads and fetches answer 503 and `/readyz` say so, and the same processes serve again
once it is back.

The module runs its own SeaweedFS, which one test stops: the session's server is shared
by other tests of the process.
"""

from __future__ import annotations

import hashlib
import secrets
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.messages import HumanMessage
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from deerflow_web.agent import UploadTools
from deerflow_web.storage.paths import is_staging_name
from tests.helpers import USER_ID
from tests.helpers import auth_header_line
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.agent_helpers import AgentContext
from tests.support.agent_helpers import RecordingToolModel
from tests.support.agent_helpers import tool_call
from tests.support.documents import make_docx
from tests.support.live_server import ROOT
from tests.support.live_server import LiveServer
from tests.support.live_worker import LiveWorker
from tests.support.s3_deployment import AUTH
from tests.support.s3_deployment import Cluster
from tests.support.s3_deployment import ThrottledProxy
from tests.support.s3_deployment import bucket  # noqa: F401 - fixtures
from tests.support.s3_deployment import cluster  # noqa: F401
from tests.support.s3_deployment import download
from tests.support.s3_deployment import listing
from tests.support.s3_deployment import s3_server  # noqa: F401
from tests.support.s3_deployment import two  # noqa: F401
from tests.support.s3_deployment import write_config

# Real processes, signed in with a token: the mode changes only the gate, which tests/web
# covers in both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes

MIB = 1024 * 1024
CONVERT_SECONDS = 120.0  # a small .docx on a loaded machine
SLOW_PUSH_RATE = MIB  # bytes a second from instance A to the bucket in the kill test


# --- clients -----------------------------------------------------------------------------


def upload(server: LiveServer, thread_id: str, name: str, data: bytes) -> requests.Response:
    return requests.post(
        f"{server.url}/api/threads/{thread_id}/uploads",
        files={"files": (name, data)},
        headers=AUTH,
        timeout=120,
    )


def convert(server: LiveServer, thread_id: str, name: str) -> requests.Response:
    return requests.post(
        f"{server.url}/api/threads/{thread_id}/uploads/{name}/convert", headers=AUTH, timeout=60
    )


def ready(server: LiveServer) -> requests.Response:
    return requests.get(f"{server.url}/readyz", timeout=30)


def wait_converted(server: LiveServer, thread_id: str, name: str) -> dict[str, dict]:
    def done() -> dict[str, dict] | None:
        files = listing(server, thread_id)
        state = files[name]["conversion_state"]
        assert state != "failed", files[name]
        return files if state == "done" else None

    return wait_until(done, timeout=CONVERT_SECONDS, interval=0.2)


def worker_pids(server: LiveServer) -> set[int]:
    """The gunicorn workers of a server (children of its arbiter)."""
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    return {int(pid) for pid in children}


def files_sweep(server: LiveServer, **env: str) -> subprocess.CompletedProcess[str]:
    """`flask --app app files sweep` as an operator runs it beside `server`."""
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "app", "files", "sweep"],
        cwd=ROOT,
        env={**server.environment(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def start_slow_upload(
    server: LiveServer, thread_id: str, name: str, size: int, sent: int = MIB
) -> socket.socket:
    """A multipart upload of `size` bytes of which only the first `sent` are sent: a
    client still streaming. The caller closes the socket."""
    boundary = "s3-processes-boundary"
    head = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="files"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    request = (
        f"POST /api/threads/{thread_id}/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"{auth_header_line()}Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(head) + size + len(tail)}\r\n\r\n"
    )
    sock.sendall(request.encode() + head + secrets.token_bytes(sent))
    return sock


def staging_files(server: LiveServer, thread_id: str) -> list[str]:
    folder = uploads_dir(server.base_dir, thread_id)
    return [p.name for p in folder.iterdir() if is_staging_name(p.name)] if folder.is_dir() else []


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- two instances -----------------------------------------------------------------------


def test_what_a_stores_b_lists_serves_converts_and_hands_to_the_agent(
    two: tuple[LiveServer, LiveServer],  # noqa: F811
    cluster: Cluster,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = two
    small = secrets.token_bytes(300_000)
    large = secrets.token_bytes(12 * MIB)  # above one part: a multipart push
    assert upload(a, "S", "small.bin", small).status_code == 200
    assert upload(a, "S", "large.bin", large).status_code == 200
    assert not uploads_dir(b.base_dir, "S").exists()  # nothing of B's own

    files = listing(b, "S")
    assert {name: f["size"] for name, f in files.items()} == {
        "small.bin": len(small),
        "large.bin": len(large),
    }
    assert not uploads_dir(b.base_dir, "S").exists()  # listed from the records alone
    # Streamed from the bucket by B's gunicorn, a range of it fetched alone.
    ranged = requests.get(
        f"{b.url}/api/threads/S/artifacts/mnt/user-data/uploads/large.bin",
        headers={**AUTH, "Range": "bytes=9000000-9000099"},
        timeout=60,
    )
    assert ranged.status_code == 206
    assert ranged.content == large[9_000_000:9_000_100]
    assert not uploads_dir(b.base_dir, "S").exists()
    for name, body in (("small.bin", small), ("large.bin", large)):
        served = download(b, "S", name)
        assert served.status_code == 200
        assert sha256(served.content) == sha256(body)
        # Streamed too, and kept once sent whole (when the response closes, just after
        # its last byte left): the next download comes from B's disk.
        kept = uploads_dir(b.base_dir, "S") / name
        wait_until(lambda kept=kept: kept.exists(), timeout=10)
        assert sha256(kept.read_bytes()) == sha256(body)
    assert not list(cluster.bucket.list_stale_uploads())  # every push finished

    docx = make_docx(tmp_path / "report.docx", title="Shared Report")
    assert upload(a, "S", "report.docx", docx.read_bytes()).status_code == 200
    assert convert(a, "S", "report.docx").status_code in (200, 202)
    files = wait_converted(b, "S", "report.docx")
    assert files["report.docx"]["markdown_file"] == "report.md"
    assert files["report.md"]["converted_from"] == "report.docx"
    companion = download(b, "S", "report.md")
    assert companion.status_code == 200
    assert "# Shared Report" in companion.text
    assert "Revenue grew in every region." in companion.text

    # The agent beside B: its tools are built from B's settings (data dir, database,
    # bucket), as the agent's process would be, and read through B's working copy.
    for key, value in b.environment().items():
        if key.startswith(("DEER_FLOW_", "AWS_")) or key == "DATABASE_URL":
            monkeypatch.setenv(key, value)
    # B kept the companion it sent; let go, as eviction would, the agent fetches it itself.
    kept = uploads_dir(b.base_dir, "S") / "report.md"
    wait_until(kept.exists, timeout=10)
    kept.unlink()
    model = RecordingToolModel(
        messages=iter(
            [
                AIMessage(
                    "",
                    tool_calls=[
                        tool_call("read_file", "c1", path="/mnt/user-data/uploads/report.docx")
                    ],
                ),
                AIMessage("done"),
            ]
        )
    )
    tools = UploadTools()
    agent = create_agent(
        model, tools=tools.tools, context_schema=AgentContext, checkpointer=InMemorySaver()
    )
    try:
        agent.invoke(
            {"messages": [HumanMessage("read the report", id="h1")]},
            config={"configurable": {"thread_id": "S"}},
            context={"thread_id": "S", "user_id": USER_ID},
        )
    finally:  # the engines the tools opened on B's database
        copies = tools.paths.copies
        assert copies is not None and copies.records is not None  # B's working copy
        copies.records.engine.dispose()
        tools.documents.jobs()[0].uploads.records.engine.dispose()
    [answer] = [m for m in model.received[1] if isinstance(m, ToolMessage)]
    assert "Shared Report" in answer.content, answer.content
    assert "Revenue grew in every region." in answer.content
    assert (uploads_dir(b.base_dir, "S") / "report.md").read_text(
        encoding="utf-8"
    ) == companion.text


def test_a_killed_mid_push_leaves_nothing_listed_and_the_sweep_aborts_its_upload(
    cluster: Cluster,  # noqa: F811
) -> None:
    proxy = ThrottledProxy(cluster.s3.s3_port, SLOW_PUSH_RATE)
    a = cluster.server("a", endpoint_url=proxy.endpoint_url)  # pushes at 1 MiB/s
    b = cluster.server("b")
    outcome: list[object] = []
    try:
        a.start()
        b.start()
        body = secrets.token_bytes(20 * MIB)  # parts of 8 MiB: 8 s for the first

        def send() -> None:
            try:
                outcome.append(upload(a, "K", "cut.bin", body).status_code)
            except requests.RequestException as error:
                outcome.append(error)

        # One client still streaming its file to A (on A's disk only, so far) ...
        streaming = start_slow_upload(a, "K", "streaming.bin", 50 * MIB)
        wait_until(lambda: staging_files(a, "K"), timeout=30)
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        # ... and one whose bytes are all on A's disk, A's push to the bucket begun.
        [stale] = wait_until(lambda: cluster.bucket.list_stale_uploads(), timeout=90)
        a.kill()
        sender.join(timeout=60)
        streaming.close()
        assert outcome and not isinstance(outcome[0], int), outcome  # no answer came

        assert listing(b, "K") == {}
        assert download(b, "K", "cut.bin").status_code == 404
        assert download(b, "K", "streaming.bin").status_code == 404
        assert [u.upload_id for u in cluster.bucket.list_stale_uploads()] == [stale.upload_id]

        # Younger than the age setting: kept, the sweep cannot tell it from a live one.
        kept = files_sweep(b)
        assert kept.returncode == 0, kept.stderr
        assert "0 unfinished upload(s) older than 24 h aborted" in kept.stdout
        assert cluster.bucket.list_stale_uploads() == [stale]
        swept = files_sweep(b, DEER_FLOW_STORAGE_S3_STALE_UPLOAD_HOURS="0.0001")
        assert swept.returncode == 0, swept.stderr
        assert "1 unfinished upload(s) older than 0.0001 h aborted" in swept.stdout
        assert cluster.bucket.list_stale_uploads() == []
        assert not [key for key in cluster.bucket.list_keys() if "cut" in key.key]

        # B still works; A, restarted (on the direct road), too.
        assert upload(b, "K", "after.txt", b"after the crash").status_code == 200
        a.env = cluster.environment()
        assert staging_files(a, "K")  # what the killed A was writing
        a.start()
        assert staging_files(a, "K") == []  # cleared at start
        assert download(a, "K", "after.txt").content == b"after the crash"
        again = secrets.token_bytes(9 * MIB)
        assert upload(a, "K", "cut.bin", again).status_code == 200
        assert sha256(download(b, "K", "cut.bin").content) == sha256(again)
        assert sorted(listing(b, "K")) == ["after.txt", "cut.bin"]
        assert cluster.bucket.list_stale_uploads() == []
    finally:
        a.kill()
        b.kill()
        proxy.close()


def test_a_client_cut_off_mid_body_leaves_no_upload_no_incoming_object_and_no_record(
    cluster: Cluster,  # noqa: F811
) -> None:
    """The body streams into the bucket as it arrives; a client gone mid-body takes all of
    it back out: the multipart upload aborted, no incoming object, no staging file."""
    a = cluster.server("a")
    try:
        a.start()
        cut = start_slow_upload(a, "C", "cut.bin", 50 * MIB, sent=20 * MIB)
        try:
            # Parts of 8 MiB: the first ones are in the bucket while the body streams.
            wait_until(lambda: cluster.bucket.list_stale_uploads(), timeout=60)
        finally:
            cut.close()
        wait_until(lambda: cluster.bucket.list_stale_uploads() == [], timeout=60)
        wait_until(lambda: staging_files(a, "C") == [], timeout=30)
        assert list(cluster.bucket.list_keys()) == []  # no incoming object, no blob
        assert listing(a, "C") == {}
        # The same process stores the next upload.
        body = secrets.token_bytes(20 * MIB)
        assert upload(a, "C", "whole.bin", body).status_code == 200
        assert sha256(download(a, "C", "whole.bin").content) == sha256(body)
        assert cluster.bucket.list_stale_uploads() == []
        assert [key.key.rsplit("/", 2)[-2] for key in cluster.bucket.list_keys()] == ["blobs"]
    finally:
        a.kill()


def test_with_the_bucket_down_the_same_processes_answer_503_then_serve_again(
    two: tuple[LiveServer, LiveServer],  # noqa: F811
    cluster: Cluster,  # noqa: F811
) -> None:
    a, b = two
    kept = secrets.token_bytes(200_000)
    assert upload(a, "D", "kept.bin", kept).status_code == 200
    assert ready(a).json()["bucket"] == "ok"
    pids = {server.pid: worker_pids(server) for server in (a, b)}
    cluster.s3.stop()
    try:
        refused = upload(a, "D", "new.bin", b"stored while the bucket is down")
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["Retry-After"]) > 0
        assert "storage is unavailable" in refused.json()["detail"]
        fetch = download(b, "D", "kept.bin")  # B has no copy yet: it must fetch one
        assert fetch.status_code == 503, fetch.text
        assert "Retry-After" in fetch.headers
        for server in (a, b):
            answer = ready(server)
            assert answer.status_code == 503
            body = answer.json()
            assert (body["status"], body["bucket"], body["database"]) == (
                "unavailable",
                "failed",
                "ok",
            )
            assert "bucket" in body["detail"]
            health = requests.get(f"{server.url}/healthz", timeout=10)
            assert health.status_code == 200
        assert sorted(listing(b, "D")) == ["kept.bin"]  # the records alone
        assert staging_files(a, "D") == staging_files(b, "D") == []  # nothing half-made
        assert not (uploads_dir(b.base_dir, "D") / "kept.bin").exists()
    finally:
        cluster.s3.start_again()

    for server in (a, b):
        wait_until(lambda server=server: ready(server).status_code == 200, timeout=60)
        assert ready(server).json()["bucket"] == "ok"
    assert {server.pid: worker_pids(server) for server in (a, b)} == pids  # no restart
    assert download(b, "D", "kept.bin").content == kept
    assert upload(a, "D", "new.bin", b"stored once it is back").status_code == 200
    assert download(b, "D", "new.bin").content == b"stored once it is back"
    assert sorted(listing(b, "D")) == ["kept.bin", "new.bin"]


# --- a web instance and a worker (issue 29, item 6) ----------------------------------------


def test_a_worker_with_its_own_data_dir_converts_what_the_web_instance_stored(
    cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    config = write_config(
        tmp_path / "jobs-off.yaml",
        conversion={"lease_seconds": 3, "lease_renew_seconds": 1},
        jobs={"run_in_web": False, "poll_seconds": 0.2, "stop_grace_seconds": 5},
    )
    web = cluster.server("web")
    web.config = config
    worker = LiveWorker(
        cluster.data_dir("worker"),
        tmp_path / "worker.log",
        config=config,
        database_url=cluster.database_url,
        env=cluster.environment(),
    )
    try:
        web.start()
        assert ready(web).json()["jobs"] == "off"
        worker.start()
        docx = make_docx(tmp_path / "plan.docx", title="Worker Plan")
        assert upload(web, "W", "plan.docx", docx.read_bytes()).status_code == 200
        answer = convert(web, "W", "plan.docx")
        assert answer.status_code in (200, 202), answer.text
        files = wait_converted(web, "W", "plan.docx")
        assert files["plan.docx"]["markdown_file"] == "plan.md"
        assert files["plan.md"]["converted_from"] == "plan.docx"
        companion = download(web, "W", "plan.md")
        assert companion.status_code == 200
        assert "# Worker Plan" in companion.text
        assert "Revenue grew in every region." in companion.text
        # The worker fetched the original into its own data dir and wrote the companion
        # there; the web instance streamed the companion from the bucket and, once sent
        # whole, kept it (when the response closed, just after its last byte left).
        assert (uploads_dir(worker.base_dir, "W") / "plan.docx").read_bytes() == docx.read_bytes()
        assert (uploads_dir(worker.base_dir, "W") / "plan.md").read_text(
            encoding="utf-8"
        ) == companion.text
        kept = uploads_dir(web.base_dir, "W") / "plan.md"
        wait_until(kept.exists, timeout=10)
        assert kept.read_text(encoding="utf-8") == companion.text
        assert worker.stop() == 0
    finally:
        worker.kill()
        web.kill()
    log = worker.log.read_text(errors="replace")
    assert "claimed conversion of plan.docx" in log and "converted plan.docx" in log
    assert "stale upload sweeps every" in log  # the worker runs the bucket's sweep too
