"""Two instances behave as one server (SPEC 9): real processes, one data dir, one database.

Two `make run`-style gunicorn servers (two gevent workers each) run on two ports over the
same data dir and the same database, as two machines behind a load balancer would run over
a shared volume; each test plays concurrent clients against both, in threads of its own.
The pair starts once per database and serves the module's tests in turn; a test that kills
an instance leaves it to be started again (as a supervisor would) before the next test.
Afterwards the records must match the bytes on disk exactly: every listed file exists with
the listed size and sha256, and no file on disk is missing from the list.
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
import time
from collections.abc import Iterator
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlencode

import pytest
import requests
import yaml

from deerflow_web.services.conversion.runner import process_start_time
from deerflow_web.storage.paths import is_staging_name
from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import TEST_EMAIL
from tests.helpers import TEST_PASSWORD
from tests.helpers import auth_header_line
from tests.helpers import needs_auth
from tests.helpers import provision_server_user
from tests.helpers import uploads_dir
from tests.helpers import wait_until
from tests.support.documents import make_docx
from tests.support.documents import make_pdf
from tests.support.documents import make_pptx
from tests.support.documents import make_spinning_pdf
from tests.support.documents import make_xlsx
from tests.support.live_server import LiveServer
from tests.support.live_worker import converters_in
from tests.support.postgres import PostgresServer

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
MIB = 1024 * 1024
# How long a job orphaned by a killed instance may take to be claimed again and finish
# (its 3 s lease, the sweep, the conversion itself on a busy machine).
RECLAIM_SECONDS = 90.0


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def instance_database_url(
    request: pytest.FixtureRequest, postgres: PostgresServer
) -> Iterator[str | None]:
    """The database both instances share: the default SQLite file in the data dir (one
    machine), or a fresh database on the suite's PostgreSQL server."""
    if request.param == "sqlite":
        yield None
        return
    url = postgres.create_database()
    try:
        yield url
    finally:
        postgres.drop_database(url)


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory, instance_database_url: str | None) -> Path:
    """The data dir both instances serve, one per database: the tests that share it each
    use threads of their own, and check only those."""
    path = tmp_path_factory.mktemp("instances") / "data"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def running_instances(
    shared_dir: Path, instance_database_url: str | None
) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Instances A and B, started at the same moment (their start-ups must not race), once
    per database for the tests of this module that take `instances`."""
    config = shared_dir.parent / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "uploads": {"conversion_wait_seconds": 0.2},
                # short leases, so a job orphaned by a killed instance is claimed again soon
                "conversion": {"lease_seconds": 3, "lease_renew_seconds": 1},
            }
        )
    )
    provision_server_user(shared_dir, database_url=instance_database_url)
    servers = tuple(
        LiveServer(
            shared_dir,
            config=config,
            database_url=instance_database_url,
            workers=2,
            log=shared_dir.parent / f"instance-{name}.log",
        )
        for name in "ab"
    )
    try:
        start_together(servers)
        yield servers  # type: ignore[misc]
    finally:
        kill_together(servers)


@pytest.fixture
def instances(
    running_instances: tuple[LiveServer, LiveServer],
) -> tuple[LiveServer, LiveServer]:
    """Both instances up: one an earlier test killed (and left down) is started again."""
    start_together([server for server in running_instances if server.process is None])
    return running_instances


@pytest.fixture
def base_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The instances' data dir for a test that takes `instances`; else a fresh one."""
    if "instances" in request.fixturenames:
        return request.getfixturevalue("shared_dir")
    path = tmp_path / "data"
    path.mkdir()
    return path


def start_together(servers: Sequence[LiveServer]) -> None:
    if servers:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(LiveServer.start, servers))


def kill_together(servers: Sequence[LiveServer]) -> None:
    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(LiveServer.kill, servers))


# --- clients -----------------------------------------------------------------------------


def upload(server: LiveServer, thread_id: str, name: str, data: bytes) -> requests.Response:
    return requests.post(
        f"{server.url}/api/threads/{thread_id}/uploads",
        files={"files": (name, data)},
        headers=AUTH,
        timeout=60,
    )


def listing(server: LiveServer, thread_id: str) -> dict[str, dict]:
    response = requests.get(
        f"{server.url}/api/threads/{thread_id}/uploads/list", headers=AUTH, timeout=30
    )
    assert response.status_code == 200, response.text
    return {f["filename"]: f for f in response.json()["files"]}


def artifact(server: LiveServer, thread_id: str, name: str) -> requests.Response:
    return requests.get(
        f"{server.url}/api/threads/{thread_id}/artifacts/mnt/user-data/uploads/{name}",
        headers=AUTH,
        timeout=30,
    )


def convert(server: LiveServer, thread_id: str, name: str) -> requests.Response:
    return requests.post(
        f"{server.url}/api/threads/{thread_id}/uploads/{name}/convert", headers=AUTH, timeout=60
    )


def assert_consistent(server: LiveServer, base_dir: Path, thread_id: str) -> dict[str, dict]:
    """Records and disk agree: the folder holds exactly the listed names besides staging
    files (which no listing shows), each with the listed size and sha256."""
    files = listing(server, thread_id)
    folder = uploads_dir(base_dir, thread_id)
    names = os.listdir(folder) if folder.exists() else []
    on_disk = sorted(name for name in names if not is_staging_name(name))
    assert on_disk == sorted(files), "records and folder differ"
    for name, record in files.items():
        data = (folder / name).read_bytes()
        assert len(data) == record["size"], name
        assert hashlib.sha256(data).hexdigest() == record["sha256"], name
    return files


# --- two instances under concurrent use --------------------------------------------------


def test_200_uploads_spread_over_both_instances(instances, base_dir: Path) -> None:
    a, b = instances
    rng = random.Random(14)
    sent = {
        (f"T{i % 2}", f"file-{i:03}.bin"): rng.randbytes(rng.randrange(1, 256 * 1024))
        for i in range(200)
    }

    def send(index_and_key: tuple[int, tuple[str, str]]) -> int:
        index, (thread_id, name) = index_and_key
        return upload(instances[index % 2], thread_id, name, sent[thread_id, name]).status_code

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(send, enumerate(sent)))
    assert statuses == [200] * 200
    for thread_id in ("T0", "T1"):
        files = assert_consistent(a, base_dir, thread_id)
        assert listing(b, thread_id) == files  # both instances see the same records
        expected = {name: data for (t, name), data in sent.items() if t == thread_id}
        assert sorted(files) == sorted(expected)
        for name, data in expected.items():
            assert files[name]["sha256"] == hashlib.sha256(data).hexdigest(), name
    # and the bytes are served by the other instance than the one that stored them
    assert artifact(b, "T0", "file-000.bin").content == sent["T0", "file-000.bin"]
    assert artifact(a, "T1", "file-001.bin").content == sent["T1", "file-001.bin"]


def test_concurrent_renames_and_deletes_of_the_same_names_through_both(
    instances, base_dir: Path
) -> None:
    """Each name is renamed through one instance and deleted (or renamed to the same
    target) through the other at the same moment: exactly one wins, the loser gets a clear
    4xx, and the records end up matching the disk."""
    a, b = instances
    count = 24
    contents = {f"n{i}.txt": f"original {i}".encode() for i in range(count)}
    contents |= {f"m{i}.txt": f"rival {i}".encode() for i in range(count)}
    for index, (name, data) in enumerate(contents.items()):
        assert upload(instances[index % 2], "R", name, data).status_code == 200

    def rename(server: LiveServer, source: str, target: str) -> requests.Response:
        return requests.post(
            f"{server.url}/api/threads/R/uploads/{source}/rename",
            json={"new_name": target, "on_conflict": "reject"},
            headers=AUTH,
            timeout=30,
        )

    def delete(server: LiveServer, name: str) -> requests.Response:
        return requests.delete(f"{server.url}/api/threads/R/uploads/{name}", headers=AUTH)

    jobs = []
    for i in range(count):
        first, other = (a, b) if i % 2 else (b, a)
        jobs.append(("rename", i, lambda s=first, i=i: rename(s, f"n{i}.txt", f"t{i}.txt")))
        jobs.append(("delete", i, lambda s=other, i=i: delete(s, f"n{i}.txt")))
        jobs.append(("rival", i, lambda s=other, i=i: rename(s, f"m{i}.txt", f"t{i}.txt")))
    random.Random(3).shuffle(jobs)
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda job: job[2](), jobs))
    outcome: dict[tuple[str, int], int] = {}
    for (kind, i, _call), response in zip(jobs, answers, strict=True):
        assert response.status_code in (200, 404, 409), (kind, i, response.text)
        if response.status_code != 200:
            assert isinstance(response.json()["detail"], str)
        outcome[kind, i] = response.status_code

    files = assert_consistent(a, base_dir, "R")
    assert listing(b, "R") == files
    for i in range(count):
        renamed, deleted, rival = (outcome[k, i] == 200 for k in ("rename", "delete", "rival"))
        assert renamed + deleted == 1, i  # the same name: renamed away or deleted, not both
        assert f"n{i}.txt" not in files
        target = (uploads_dir(base_dir, "R") / f"t{i}.txt").read_bytes()
        if rival:  # the rival took the target name first, or after the delete
            assert target == contents[f"m{i}.txt"] and f"m{i}.txt" not in files
            assert not renamed  # the target existed: a renamed n{i} would have been refused
        else:
            assert renamed and target == contents[f"n{i}.txt"]
            assert f"m{i}.txt" in files


def test_conversions_started_on_one_instance_are_polled_on_the_other(
    instances, base_dir: Path, tmp_path: Path
) -> None:
    a, b = instances
    documents = {
        "notes.docx": (make_docx(tmp_path / "notes.docx", title="Quarterly notes"), "Quarterly"),
        "sheet.xlsx": (make_xlsx(tmp_path / "sheet.xlsx"), "|"),
        "deck.pptx": (make_pptx(tmp_path / "deck.pptx"), "#"),
        "report.pdf": (make_pdf(tmp_path / "report.pdf", filler_pages=3), "Revenue grew"),
    }
    for name, (path, _expected) in documents.items():
        assert upload(a, "C", name, path.read_bytes()).status_code == 200
    for name in documents:
        assert convert(a, "C", name).status_code in (200, 202)
    for name in documents:  # the same job asked for again through the other instance
        answer = convert(b, "C", name)
        assert answer.status_code in (200, 202), answer.text

    def all_done() -> dict[str, dict] | None:
        files = listing(b, "C")
        states = {name: files[name]["conversion_state"] for name in documents}
        assert "failed" not in states.values(), files
        return files if set(states.values()) == {"done"} else None

    files = wait_until(all_done, timeout=240, interval=0.5)
    assert_consistent(b, base_dir, "C")
    for name, (_path, expected) in documents.items():
        companion = Path(name).stem + ".md"
        assert companion in files, sorted(files)  # one companion each, no second job's copy
        assert expected in artifact(b, "C", companion).text
    assert len(files) == 2 * len(documents)


def login(server: LiveServer, password: str) -> requests.Response:
    return requests.post(
        f"{server.url}/api/v1/auth/login/local",
        data=urlencode({"username": TEST_EMAIL, "password": password}),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=30,
    )


@needs_auth
def test_sessions_and_lockouts_hold_across_instances(instances) -> None:
    a, b = instances
    answer = login(b, TEST_PASSWORD)
    assert answer.status_code == 200
    session = {"Cookie": f"access_token={answer.cookies['access_token']}"}
    me = requests.get(f"{a.url}/api/v1/auth/me", headers=session, timeout=30)
    assert me.status_code == 200 and me.json()["email"] == TEST_EMAIL  # opened on B, valid on A

    for server in (a, a, b, a, b):  # five failures, spread over both instances
        assert login(server, "wrong password").status_code == 401
    for server in (a, b):
        locked = login(server, TEST_PASSWORD)
        assert locked.status_code == 429
        assert 1 <= int(locked.headers["Retry-After"]) <= 300

    assert requests.post(f"{a.url}/api/v1/auth/logout", headers=session).status_code == 200
    for server in (a, b):
        assert requests.get(f"{server.url}/api/v1/auth/me", headers=session).status_code == 401


# --- an instance killed with SIGKILL -----------------------------------------------------


def staging_names(base_dir: Path, thread_id: str) -> list[str]:
    folder = uploads_dir(base_dir, thread_id)
    return [n for n in os.listdir(folder) if is_staging_name(n)] if folder.exists() else []


def test_an_instance_killed_mid_upload(instances, base_dir: Path) -> None:
    """A streams a large upload slowly; B stores the same name meanwhile; A dies. B keeps
    answering, never lists or serves A's half-written bytes, and A's restart sweeps them."""
    a, b = instances
    head = (
        b'--XYZ\r\nContent-Disposition: form-data; name="files"; filename="big.bin"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", a.port), timeout=30)
    sock.sendall(
        f"POST /api/threads/K/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth_header_line()}"
        "Content-Type: multipart/form-data; boundary=XYZ\r\n"
        f"Content-Length: {len(head) + 100 * MIB}\r\n\r\n".encode()
        + head
    )
    try:
        for _ in range(3):  # in flight: a few MiB sent, and more still promised
            sock.sendall(b"a" * MIB)
            time.sleep(0.1)
        [staging] = wait_until(lambda: staging_names(base_dir, "K"))
        wait_until(lambda: (uploads_dir(base_dir, "K") / staging).stat().st_size >= MIB)
        assert listing(b, "K") == {}
        assert artifact(b, "K", staging).status_code in (400, 404)
        whole = os.urandom(2 * MIB)
        assert upload(b, "K", "big.bin", whole).status_code == 200
        assert upload(b, "K", "small.txt", b"small").status_code == 200

        a.kill()
    finally:
        sock.close()
    assert staging_names(base_dir, "K") == [staging]  # left behind by the dead process...
    files = listing(b, "K")
    assert sorted(files) == ["big.bin", "small.txt"]  # ...but never listed
    assert files["big.bin"]["sha256"] == hashlib.sha256(whole).hexdigest()
    assert artifact(b, "K", "big.bin").content == whole
    assert artifact(b, "K", staging).status_code in (400, 404)
    assert upload(b, "K", "after.txt", b"after").status_code == 200  # B keeps working

    a.start()  # its start-up sweep removes the dead upload's staging file
    assert staging_names(base_dir, "K") == []
    files = assert_consistent(a, base_dir, "K")
    assert sorted(files) == ["after.txt", "big.bin", "small.txt"]
    assert listing(b, "K") == files


def start_a_long_conversion(
    a: LiveServer, b: LiveServer, tmp_path: Path, thread_id: str, name: str = "long.pdf"
) -> None:
    """Upload a PDF of many pages through A and start its conversion there; return once
    B sees it converting."""
    document = make_pdf(tmp_path / name, lines=["Orphaned report"], filler_pages=20)
    assert upload(a, thread_id, name, document.read_bytes()).status_code == 200
    assert convert(a, thread_id, name).status_code == 202
    wait_until(lambda: listing(b, thread_id)[name]["conversion_state"] == "converting")


def test_an_instance_killed_mid_conversion(instances, base_dir: Path, tmp_path: Path) -> None:
    """A dies while converting: B keeps answering, no half-written companion is listed or
    on disk, and converting the file again through B finishes it."""
    a, b = instances
    start_a_long_conversion(a, b, tmp_path, "J")
    a.kill()
    files = listing(b, "J")
    assert sorted(files) == ["long.pdf"]
    assert not (uploads_dir(base_dir, "J") / "long.md").exists()
    assert artifact(b, "J", "long.md").status_code == 404
    assert upload(b, "J", "other.txt", b"still answering").status_code == 200

    answer = convert(b, "J", "long.pdf")  # A's job died with it: B runs it again
    assert answer.status_code in (200, 202), answer.text

    def converted() -> bool:
        state = listing(b, "J")["long.pdf"]["conversion_state"]
        assert state != "failed"
        return state == "done"

    wait_until(converted, timeout=240, interval=0.5)
    files = assert_consistent(b, base_dir, "J")
    assert sorted(files) == ["long.md", "long.pdf", "other.txt"]
    assert "Orphaned report" in artifact(b, "J", "long.md").text
    a.start()  # back: it sweeps the dead job's staging file and sees what B made
    assert staging_names(base_dir, "J") == []
    assert assert_consistent(a, base_dir, "J") == files


def test_a_job_orphaned_by_a_killed_instance_is_claimed_again_and_finishes(
    instances, base_dir: Path, tmp_path: Path
) -> None:
    """Nobody asks again: the surviving instance claims the job once its lease runs out."""
    a, b = instances
    start_a_long_conversion(a, b, tmp_path, "O")
    a.kill()

    def converted() -> bool:
        return listing(b, "O")["long.pdf"]["conversion_state"] == "done"

    wait_until(converted, timeout=RECLAIM_SECONDS, interval=0.5)
    files = assert_consistent(b, base_dir, "O")
    assert sorted(files) == ["long.md", "long.pdf"]
    assert "Orphaned report" in artifact(b, "O", "long.md").text


# --- a killed instance leaves no converter running and no work folder behind --------------


def test_a_killed_instance_takes_its_converter_along_and_its_folder_is_swept(
    base_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL of an instance in the middle of a conversion that would take minutes: the
    converter dies with it within seconds, and its work folder, left behind by the killed
    process, is removed when the instance starts again."""
    temp = tmp_path / "tmp"  # the server's TMPDIR, where work folders go
    temp.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"uploads": {"conversion_wait_seconds": 0.2, "conversion_timeout_seconds": 900}}
        )
    )
    provision_server_user(base_dir)
    server = LiveServer(
        base_dir, config=config, env={"TMPDIR": str(temp)}, log=tmp_path / "server.log"
    )
    server.start()
    try:
        document = make_spinning_pdf(tmp_path / "spin.pdf", operations=5_000_000)
        assert upload(server, "K", "spin.pdf", document.read_bytes()).status_code == 200
        assert convert(server, "K", "spin.pdf").status_code == 202
        [(converter, folder)] = wait_until(lambda: list(converters_in(temp).items()), timeout=60)
        server.kill()
        started = time.monotonic()
        wait_until(lambda: process_start_time(converter) is None, timeout=5)
        died_after = time.monotonic() - started
        assert folder.exists()  # the killed server could not clean up after itself
        server.start()
        assert not folder.exists(), "start-up left the dead conversion's folder"
        assert died_after < 5
    finally:
        server.kill()
