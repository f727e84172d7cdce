"""Two instances on one PostgreSQL cannot together exceed a quota (issue 27).

Two real gunicorn servers (two gevent workers each) share one data dir and one PostgreSQL
database, as two machines behind a load balancer would. Many clients upload at once to
both, to many threads of the same owner (so no thread's own lock orders them), with
multipart uploads and tus creations mixed. Afterwards: the owner stores at most the quota,
exactly as many writes were admitted as fit, every refusal was a 413 naming the quota, and
nothing a refusal touched was left on disk or in the records.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from deerflow_web.storage.paths import is_staging_name
from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import provision_server_user
from tests.helpers import threads_root
from tests.support.live_server import LiveServer

AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
FILE_BYTES = 2048
FITTING = 25
QUOTA = FILE_BYTES * FITTING
WRITES = 80


@pytest.fixture
def instances(base_dir: Path, tmp_path: Path, postgres_url: str) -> Iterator[list[LiveServer]]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"quotas": {"default_bytes": QUOTA}}))
    provision_server_user(base_dir, database_url=postgres_url)
    servers = [
        LiveServer(
            base_dir,
            config=config,
            database_url=postgres_url,
            workers=2,
            log=tmp_path / f"instance-{name}.log",
        )
        for name in "ab"
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(LiveServer.start, servers))
        yield servers
    finally:
        for server in servers:
            server.kill()


def multipart(server: LiveServer, thread_id: str, index: int) -> requests.Response:
    return requests.post(
        f"{server.url}/api/threads/{thread_id}/uploads",
        files={"files": (f"f{index}.bin", os.urandom(FILE_BYTES))},
        headers=AUTH,
        timeout=120,
    )


def tus_create(server: LiveServer, thread_id: str, index: int) -> requests.Response:
    name = base64.b64encode(f"r{index}.bin".encode()).decode()
    return requests.post(
        f"{server.url}/api/threads/{thread_id}/uploads/tus",
        headers={
            **AUTH,
            "Tus-Resumable": "1.0.0",
            "Upload-Length": str(FILE_BYTES),
            "Upload-Metadata": f"filename {name}",
        },
        timeout=120,
    )


def usage(server: LiveServer) -> dict:
    response = requests.get(f"{server.url}/api/v1/auth/me", headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def test_two_instances_never_exceed_one_quota(instances: list[LiveServer], base_dir) -> None:
    def one(index: int) -> tuple[str, requests.Response]:
        server = instances[index % 2]
        thread_id = f"t{index % 16}"
        if index % 4 == 3:
            return "tus", tus_create(server, thread_id, index)
        return "multipart", multipart(server, thread_id, index)

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(one, range(WRITES)))

    admitted = [(kind, r) for kind, r in results if r.status_code in (200, 201)]
    refused = [(kind, r) for kind, r in results if r.status_code == 413]
    assert len(admitted) + len(refused) == WRITES, [r.text for _, r in results]
    assert len(admitted) == FITTING  # every write that fitted was admitted, no more
    for _, response in refused:
        detail = response.json()["detail"]
        assert detail.startswith("Storage quota exceeded: ") and "of 50 KiB used" in detail

    for server in instances:  # both instances agree, and the owner is within the quota
        assert usage(server) == {"bytes": QUOTA, "quota_bytes": QUOTA}

    # On disk: exactly the admitted multipart files, and one staging file per admitted
    # tus upload (reserved, its bytes still to come); nothing of a refused write.
    stored = staged = 0
    for uploads in threads_root(base_dir).glob("*/user-data/uploads"):
        for name in os.listdir(uploads):
            if is_staging_name(name):
                staged += 1
            else:
                stored += 1
                assert (uploads / name).stat().st_size == FILE_BYTES
    assert stored == sum(1 for kind, _ in admitted if kind == "multipart")
    assert staged == sum(1 for kind, _ in admitted if kind == "tus")
