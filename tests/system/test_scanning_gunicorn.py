"""Scanning under `make run`'s gevent worker: clamd reached over its socket from greenlets,
with several uploads at once, and fail-closed when clamd goes away."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.helpers import AUTH_ON
from tests.helpers import SERVER_TOKEN
from tests.helpers import uploads_dir
from tests.support.clamd import EICAR
from tests.support.clamd import EICAR_SIGNATURE
from tests.support.live_server import start_server

# Real processes, signed in: the mode changes only the gate, which tests/web covers in
# both modes; the single-user pass skips this module.
pytestmark = pytest.mark.same_in_both_modes


AUTH = {"Authorization": f"Bearer {SERVER_TOKEN}"} if AUTH_ON else {}
MIB = 1024 * 1024


def post(url: str, thread_id: str, *files: tuple[bytes, str]) -> requests.Response:
    return requests.post(
        f"{url}/api/threads/{thread_id}/uploads",
        files=[("files", (name, data)) for data, name in files],
        headers=AUTH,
        timeout=60,
    )


def test_uploads_at_once_are_scanned_and_clamd_down_refuses(
    base_dir: Path, tmp_path: Path, make_clamd: Any
) -> None:
    clamd = make_clamd()
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump({"scanning": {"clamd": clamd.address, "timeout_seconds": 30}}),
        encoding="utf-8",
    )
    with start_server(base_dir, config, log=tmp_path / "server.log") as server:
        clean = os.urandom(4 * MIB)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(
                pool.map(
                    lambda i: post(server.url, f"t{i}", (clean, "clean.bin"), (EICAR, "e.com")),
                    range(6),
                )
            )
        for answer in answers:
            assert answer.status_code == 200, server.log_tail(80)
            body = answer.json()
            assert [f["scan_state"] for f in body["files"]] == ["clean"]
            assert EICAR_SIGNATURE in body["rejected_files"][0]["found"]
        assert sorted(p.name for p in uploads_dir(base_dir, "t0").iterdir()) == ["clean.bin"]
        clamd.stop()
        refused = post(server.url, "t9", (b"hello", "hello.txt"))
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "30"
        assert not uploads_dir(base_dir, "t9").exists() or not any(
            uploads_dir(base_dir, "t9").iterdir()
        )
