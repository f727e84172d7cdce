"""schemathesis against a real gunicorn server: every operation, every check, bounded.

The server is started as `make run` starts it (its gevent worker, `app:app`) on a free loopback
port over a fresh data dir, once with accounts off and once with accounts on, where every
request carries an admin's API token made with `flask --app app users create/token`.
schemathesis reads the server's own /openapi.json and runs its
phases: the documented examples, coverage of each parameter's edges, property-based fuzzing
(valid and invalid data), and stateful sequences that follow the document's links (upload,
then list, read, rename, delete what was uploaded). Any 5xx, any response that the document
does not describe, and any valid request refused or invalid request accepted fails the test.
Bounded by `--max-examples` per operation and `--max-time`, so it fits CI in a few minutes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.live_server import LiveServer

pytestmark = pytest.mark.fuzz

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("schemathesis.toml")
SEED = os.environ.get("SCHEMATHESIS_SEED", "20261130")  # fixed: a CI failure replays exactly
MAX_EXAMPLES = os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "40")
# Fuzzing and stateful runs repeat until the budget is spent: 45 s per mode in `make test`;
# a longer hunt: SCHEMATHESIS_MAX_TIME=600.
MAX_TIME = os.environ.get("SCHEMATHESIS_MAX_TIME", "45")
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}
ADMIN_EMAIL = "fuzz-admin@example.com"
ADMIN_PASSWORD = "a fuzzing passphrase"


@dataclass
class Server:
    url: str
    log: Path
    headers: list[str]  # -H values for schemathesis


def _environment(tmp_path: Path, *, accounts: bool) -> dict[str, str]:
    """A fresh data dir and the shipped defaults (never a developer's config.yaml)."""
    config = tmp_path / "config.yaml"
    # Registration open, so POST /api/v1/auth/register is exercised, not only refused.
    config.write_text("uploads: {}\nauth: {registration_enabled: true}\n", encoding="utf-8")
    env = {
        **os.environ,
        "DEER_FLOW_HOME": str(tmp_path / "data"),
        "DEER_FLOW_CONFIG_PATH": str(config),
    }
    env.pop("DEER_FLOW_AUTH_DISABLED", None)
    if not accounts:
        env["DEER_FLOW_AUTH_DISABLED"] = "1"
    return env


def _api_token(env: dict[str, str]) -> str:
    """An admin account and an API token for it, made on the command line as an operator would."""
    flask = [sys.executable, "-m", "flask", "--app", "app", "users"]
    run = {"cwd": ROOT, "env": env, "capture_output": True, "text": True, "timeout": 120}
    create = [*flask, "create", ADMIN_EMAIL, "--admin"]
    subprocess.run(create, input=ADMIN_PASSWORD + "\n", check=True, **run)
    token = subprocess.run(
        [*flask, "token", ADMIN_EMAIL, "--name", "schemathesis"], check=True, **run
    )
    return token.stdout.strip().splitlines()[-1]


@pytest.fixture(params=("accounts off", "accounts on"))
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """`make run`'s gunicorn on a free loopback port with a fresh data dir; with accounts on,
    every request carries an admin's API token."""
    if os.environ.get("DEER_FLOW_AUTH_DISABLED"):
        # This module starts both kinds of server itself; a suite pass run with accounts
        # off (make test runs one) would only repeat it.
        pytest.skip("runs in the suite pass with accounts on")
    accounts = request.param == "accounts on"
    if accounts and importlib.util.find_spec("deerflow_web.web.accounts.api") is None:
        pytest.skip("this tree has no accounts yet")
    env = _environment(tmp_path, accounts=accounts)
    headers = [f"Authorization: Bearer {_api_token(env)}"] if accounts else []
    log = tmp_path / "gunicorn.log"
    live = LiveServer(  # as `make run` serves
        tmp_path / "data",
        config=Path(env["DEER_FLOW_CONFIG_PATH"]),
        single_user=not accounts,
        workers=2,
        worker_connections=100,
        log=log,
    )
    with live.start():
        yield Server(live.url, log, headers)


def _operations(url: str) -> int:
    """The operations schemathesis tests: all the server documents but GET /openapi.json,
    the schema it reads."""
    with urllib.request.urlopen(url + "/openapi.json", timeout=10) as response:
        paths = json.load(response)["paths"]
    return sum(
        1
        for path, item in paths.items()
        for method in item
        if method in HTTP_METHODS and path != "/openapi.json"
    )


def test_schemathesis_finds_nothing(server: Server, tmp_path: Path) -> None:
    command = [
        *(sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()"),
        *("--config-file", str(CONFIG), "run", server.url + "/openapi.json"),
        *("--phases", "examples,coverage,fuzzing,stateful"),  # every check: the default
        *("--max-examples", MAX_EXAMPLES, "--max-time", MAX_TIME, "--seed", SEED),
        # One worker: concurrent scenarios drawing the same short thread id would delete each
        # other's files and report it as "created resource not found".
        *("--workers", "1", "--request-timeout", "60", "--no-color"),
        *("--report", "junit", "--report-dir", str(tmp_path / "report")),
    ]
    for header in server.headers:
        command += ["--header", header]
    result = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # for the hooks module
        capture_output=True,
        text=True,
        timeout=int(MAX_TIME) + 240,
        check=False,
    )
    output = result.stdout + result.stderr
    server_log = server.log.read_text(errors="replace")
    # The server log first, schemathesis's own report last: a truncated failure shows the end.
    assert result.returncode == 0, f"--- server log ---\n{server_log[-6000:]}\n{output}"
    expected = _operations(server.url)
    assert re.search(rf"Selected:\s+{expected}/{expected}\b", output), output
    assert re.search(rf"Tested:\s+{expected}\b", output), output
    assert re.search(r"✅\s+Stateful", output), "the stateful phase must run:\n" + output
    assert "Traceback" not in server_log, server_log
