"""`agent.sandbox.materialise` on the local backend: the thread's own folder, always live.
(On the S3 backend, a copy fetched from the bucket: tests/web/api/test_s3_backend.py.)"""

from __future__ import annotations

from pathlib import Path

from deerflow_web.agent.sandbox import materialise
from deerflow_web.models import ThreadRef
from deerflow_web.storage.paths import ThreadPaths
from tests.helpers import USER_ID
from tests.helpers import UploadActions
from tests.helpers import user_data_dir


def test_the_local_backend_hands_out_the_thread_folder_itself(
    uploads: UploadActions, base_dir: Path
) -> None:
    ref = ThreadRef("t1", USER_ID) if USER_ID else ThreadRef.single_user("t1")
    empty = materialise(ref, ThreadPaths(base_dir))
    assert empty.live and empty.uploads == 0
    assert empty.path == user_data_dir(base_dir, "t1").resolve()
    assert (empty.path / "uploads").is_dir()  # a sandbox mounts a folder that exists
    assert uploads.upload("t1", (b"a", "a.txt"), (b"b", "b.txt")).status_code == 200
    assert materialise(ref, ThreadPaths(base_dir)).uploads == 2
