"""`flask --app app files sweep`: one retention sweep now (issue 27)."""

from __future__ import annotations

import io
import os
import time
from typing import Any

from sqlalchemy import update

from deerflow_web.models import SINGLE_USER
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.storage.database import threads
from deerflow_web.storage.database import trashed_files
from deerflow_web.storage.database import uploads
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import USER_ID


def _age(app: Any, ref: ThreadRef, days: float) -> None:
    services = app.extensions[EXTENSION_KEY]
    then = time.time() - days * 86400
    with services.engine.begin() as db:
        db.execute(update(threads).values(updated_at=then, created_at=then))
        db.execute(update(uploads).values(uploaded_at=then, mtime_ns=int(then * 1e9)))
        db.execute(update(trashed_files).values(deleted_at=then))
    root = services.uploads.paths.thread_dir(ref)
    for path in [root, *root.rglob("*")]:
        os.utime(path, (then, then), follow_symlinks=False)


def test_the_sweep_command_removes_expired_threads(make_app: Any) -> None:
    app = make_app(retention={"thread_days": 7})
    services = app.extensions[EXTENSION_KEY]
    ref = ThreadRef("old", USER_ID or SINGLE_USER)
    services.threads.create(ref.user_id, "old")
    services.uploads.save_uploads(ref, [IncomingFile("a.txt", io.BytesIO(b"x"))])
    _age(app, ref, 10)
    result = app.test_cli_runner().invoke(args=["files", "sweep"])
    assert result.exit_code == 0, result.output
    assert "1 thread(s) moved to the trash, 0 removed" in result.output
    assert services.uploads.list_uploads(ref) == []
    assert [e.filename for e in services.history.trash_bin.list(ref)] == ["a.txt"]

    _age(app, ref, 40)  # past the trash's 30 days too
    result = app.test_cli_runner().invoke(args=["files", "sweep"])
    assert result.exit_code == 0, result.output
    assert "0 thread(s) moved to the trash, 1 removed" in result.output
    assert services.threads.find(ref) is None


def test_the_sweep_command_says_when_retention_is_off(make_app: Any) -> None:
    result = make_app().test_cli_runner().invoke(args=["files", "sweep"])
    assert result.exit_code != 0
    assert "Retention is off: set retention.thread_days" in result.output
