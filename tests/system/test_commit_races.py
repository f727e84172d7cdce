"""Two writers, one name: the `on_conflict` rule holds at the moment of commit.

Real processes and real races: two HTTP clients, released together by a barrier, send
8 MB each under the same name to one thread, against one gunicorn server with two workers
(SQLite) and against two instances over one PostgreSQL database; each setup starts once
and serves the module's races in turn, each trial in a thread of its own. Whichever client
commits second must meet the rule it asked for as the folder is then: `rename` gets its own
name, `reject` a 409 that leaves the first file whole, `replace` wins with a record of its
own bytes. Every trial checks every stored file's sha256 against what was sent, and that each
200 answer names a file holding that very client's bytes: no bytes lost, no answer untrue.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Callable
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
import requests
import yaml

from deerflow_web.storage.paths import is_staging_name
from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import provision_server_user
from tests.helpers import uploads_dir
from tests.support.live_server import LiveServer

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
SIZE = 8 * 1000 * 1000
TUS = {"Tus-Resumable": "1.0.0"}
PENDING_CAP = 3
TRIALS = int(os.environ.get("COMMIT_RACE_TRIALS", "10"))


SETUPS = ["gunicorn-2-workers", "two-instances-postgresql"]


@contextmanager
def serving(base_dir: Path, database_url: str | None) -> Iterator[tuple]:
    """The two URLs the two clients use: one server's twice (SQLite), or one per instance
    (`database_url`, PostgreSQL)."""
    provision_server_user(base_dir, database_url=database_url)
    config = base_dir.parent / "config.yaml"
    config.write_text(yaml.safe_dump({"uploads": {"resumable_max_pending": PENDING_CAP}}))
    count = 1 if database_url is None else 2
    started = [
        LiveServer(
            base_dir,
            config=config,
            database_url=database_url,
            workers=2,
            log=base_dir.parent / f"s{n}.log",
        )
        for n in range(count)
    ]
    try:
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(LiveServer.start, started))
        yield (started[0], started[-1])
    finally:
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(LiveServer.kill, started))


@pytest.fixture(scope="module", params=SETUPS)
def shared_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[tuple, Path]]:
    """The servers and their data dir, started once per setup for the races below: each
    trial of each test writes a thread of its own, and checks only that thread."""
    base_dir = tmp_path_factory.mktemp("races") / "data"
    base_dir.mkdir()
    if request.param == "gunicorn-2-workers":
        with serving(base_dir, None) as servers:
            yield servers, base_dir
        return
    postgres = request.getfixturevalue("postgres")
    url = postgres.create_database()
    try:
        with serving(base_dir, url) as servers:
            yield servers, base_dir
    finally:
        postgres.drop_database(url)


@pytest.fixture
def servers(shared_servers: tuple[tuple, Path]) -> tuple:
    return shared_servers[0]


@pytest.fixture
def base_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The shared servers' data dir for a test that takes `servers`; else a fresh one."""
    if "servers" in request.fixturenames:
        return request.getfixturevalue("shared_servers")[1]
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture(params=SETUPS)
def fresh_servers(request: pytest.FixtureRequest, base_dir: Path) -> Iterator[tuple]:
    """Servers of this test's own, for a test that counts what the whole user has pending."""
    database_url = None
    if request.param == "two-instances-postgresql":
        database_url = request.getfixturevalue("postgres_url")
    with serving(base_dir, database_url) as servers:
        yield servers


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def together(*calls: Callable[[], requests.Response]) -> list[requests.Response]:
    """Run each call on its own thread, all released at the same moment."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], requests.Response]) -> requests.Response:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def upload(server: LiveServer, thread: str, name: str, data: bytes, on_conflict: str) -> Any:
    return lambda: requests.post(
        f"{server.url}/api/threads/{thread}/uploads",
        data={"on_conflict": on_conflict},
        files={"files": (name, data)},
        headers=AUTH,
        timeout=120,
    )


def rename(server: LiveServer, thread: str, name: str, new_name: str) -> Any:
    return lambda: requests.post(
        f"{server.url}/api/threads/{thread}/uploads/{name}/rename",
        json={"new_name": new_name},
        headers=AUTH,
        timeout=120,
    )


def stored(server: LiveServer, base_dir: Path, thread: str) -> dict[str, str]:
    """Name -> sha256 of every file in the folder, checked against the listing."""
    folder = uploads_dir(base_dir, thread)
    on_disk = {
        name: sha((folder / name).read_bytes())
        for name in os.listdir(folder)
        if not is_staging_name(name)
    }
    listing = requests.get(
        f"{server.url}/api/threads/{thread}/uploads/list", headers=AUTH, timeout=30
    ).json()["files"]
    assert {f["filename"]: f["sha256"] for f in listing} == on_disk, "records and disk differ"
    return on_disk


def answered(response: requests.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    (file,) = response.json()["files"]
    return file


def sent(n: int) -> bytes:
    return os.urandom(SIZE - 1) + bytes([n])


def test_rename_gives_each_writer_its_own_name(servers: tuple, base_dir: Path) -> None:
    for trial in range(TRIALS):
        thread, a, b = f"rename-{trial}", sent(1), sent(2)
        answers = together(
            upload(servers[0], thread, "x.bin", a, "rename"),
            upload(servers[1], thread, "x.bin", b, "rename"),
        )
        files = [answered(r) for r in answers]
        on_disk = stored(servers[0], base_dir, thread)
        assert sorted(on_disk) == ["x.bin", "x_1.bin"], trial
        assert sorted(f["filename"] for f in files) == ["x.bin", "x_1.bin"], trial
        for file, data in zip(files, (a, b), strict=True):
            assert file["sha256"] == sha(data) == on_disk[file["filename"]], trial
            expected = "x.bin" if file["filename"] == "x_1.bin" else None
            assert file["original_filename"] == expected, trial


def test_reject_refuses_the_later_writer_and_keeps_the_first(
    servers: tuple, base_dir: Path
) -> None:
    for trial in range(TRIALS):
        thread, a, b = f"reject-{trial}", sent(1), sent(2)
        answers = together(
            upload(servers[0], thread, "x.bin", a, "reject"),
            upload(servers[1], thread, "x.bin", b, "reject"),
        )
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200, 409], (trial, [r.text for r in answers])
        winner = next(data for r, data in zip(answers, (a, b), strict=True) if r.ok)
        loser = next(r for r in answers if not r.ok)
        assert loser.json() == {"detail": "A file named x.bin already exists"}
        assert stored(servers[0], base_dir, thread) == {"x.bin": sha(winner)}, trial


def test_replace_is_last_writer_wins_each_record_of_its_own_bytes(
    servers: tuple, base_dir: Path
) -> None:
    for trial in range(TRIALS):
        thread, a, b = f"replace-{trial}", sent(1), sent(2)
        answers = together(
            upload(servers[0], thread, "x.bin", a, "replace"),
            upload(servers[1], thread, "x.bin", b, "replace"),
        )
        files = [answered(r) for r in answers]
        for file, data in zip(files, (a, b), strict=True):
            assert file["filename"] == "x.bin"
            assert file["sha256"] == sha(data), trial  # its own bytes, never the winner's
        on_disk = stored(servers[0], base_dir, thread)
        assert list(on_disk) == ["x.bin"]
        assert on_disk["x.bin"] in (sha(a), sha(b)), trial


def test_a_rename_onto_a_name_a_reject_upload_is_streaming(servers: tuple, base_dir: Path) -> None:
    for trial in range(TRIALS):
        thread, old, new = f"onto-{trial}", sent(1), sent(2)
        answered(upload(servers[0], thread, "u.bin", old, "replace")())
        renamed, uploaded = together(
            rename(servers[0], thread, "u.bin", "t.bin"),
            upload(servers[1], thread, "t.bin", new, "reject"),
        )
        statuses = sorted([renamed.status_code, uploaded.status_code])
        assert statuses == [200, 409], (trial, renamed.text, uploaded.text)
        on_disk = stored(servers[0], base_dir, thread)
        if renamed.ok:  # the later commit, the upload's, lost cleanly
            assert on_disk == {"t.bin": sha(old)}, trial
        else:
            assert on_disk == {"u.bin": sha(old), "t.bin": sha(new)}, trial


def tus_create(server: LiveServer, thread: str, name: str, length: int, on_conflict: str) -> str:
    metadata = ",".join(
        f"{key} {base64.b64encode(value.encode()).decode()}"
        for key, value in (("filename", name), ("on_conflict", on_conflict))
    )
    response = requests.post(
        f"{server.url}/api/threads/{thread}/uploads/tus",
        headers={**AUTH, **TUS, "Upload-Length": str(length), "Upload-Metadata": metadata},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return urljoin(server.url, response.headers["Location"])


def tus_patch(url: str, offset: int, data: bytes) -> Any:
    return lambda: requests.patch(
        url,
        data=data,
        headers={
            **AUTH,
            **TUS,
            "Upload-Offset": str(offset),
            "Content-Type": "application/offset+octet-stream",
        },
        timeout=120,
    )


@pytest.mark.parametrize("on_conflict", ["rename", "reject"])
def test_two_resumable_uploads_finishing_together(
    servers: tuple, base_dir: Path, on_conflict: str
) -> None:
    for trial in range(TRIALS):
        thread, a, b = f"tus-{on_conflict}-{trial}", sent(1), sent(2)
        urls = [tus_create(s, thread, "x.bin", SIZE, on_conflict) for s in servers]
        half = SIZE // 2
        for url, data in zip(urls, (a, b), strict=True):
            assert tus_patch(url, 0, data[:half])().status_code == 204
        rests = zip(urls, (a[half:], b[half:]), strict=True)
        answers = together(*(tus_patch(url, half, rest) for url, rest in rests))
        on_disk = stored(servers[0], base_dir, thread)
        if on_conflict == "rename":
            assert [r.status_code for r in answers] == [204, 204], trial
            assert sorted(on_disk.values()) == sorted([sha(a), sha(b)]), trial
            assert sorted(on_disk) == ["x.bin", "x_1.bin"], trial
        else:
            assert sorted(r.status_code for r in answers) == [204, 409], trial
            winner = next(d for r, d in zip(answers, (a, b), strict=True) if r.ok)
            assert on_disk == {"x.bin": sha(winner)}, trial


def test_the_pending_uploads_cap_holds_across_processes(
    fresh_servers: tuple, base_dir: Path
) -> None:
    """Creations racing on every worker (and instance) cannot all slip under the cap."""
    servers = fresh_servers
    metadata = "filename " + base64.b64encode(b"x.bin").decode()

    def create(server: LiveServer) -> Any:
        return lambda: requests.post(
            f"{server.url}/api/threads/capped/uploads/tus",
            headers={**AUTH, **TUS, "Upload-Length": "1000", "Upload-Metadata": metadata},
            timeout=60,
        )

    answers = together(*(create(servers[n % 2]) for n in range(4 * PENDING_CAP)))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [201] * PENDING_CAP + [429] * (3 * PENDING_CAP), statuses
    folder = uploads_dir(base_dir, "capped")
    assert len([n for n in os.listdir(folder) if is_staging_name(n)]) == PENDING_CAP
