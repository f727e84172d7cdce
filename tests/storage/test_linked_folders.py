"""No operation follows a symlink between the data dir and a thread's files.

Each folder level (`threads/`, the thread dir, `user-data/`, each area, and the per-user
levels) is replaced by a link to an outside folder that mirrors what the app expects to
find; every operation must refuse with a clear error and leave the outside folder exactly
as it was. A hard link in `uploads/` to an outside file is neither listed, served nor read.
"""

from __future__ import annotations

import hashlib
import os
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.messages import HumanMessage
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from deerflow_web.agent import make_upload_middleware
from deerflow_web.agent.tools import make_file_tools
from deerflow_web.errors import UnsafeFolder
from deerflow_web.models import IncomingFile
from deerflow_web.storage.paths import ThreadPaths
from tests.agent.test_loop import AgentContext
from tests.agent.test_loop import RecordingToolModel
from tests.helpers import USER_ID
from tests.helpers import UploadActions
from tests.helpers import thread_ref
from tests.helpers import uploads_dir
from tests.support.agent_helpers import make_runtime

T = "T"
AREAS = ("uploads", "workspace", "outputs")
SECRET = b"OUTSIDE-SECRET\n"
# What an agent run on thread T carries: the test user's id too when accounts are on.
CONTEXT: dict[str, str] = {"thread_id": T, **({"user_id": USER_ID} if USER_ID else {})}

# The folder levels of thread T, relative to the data dir, in the layout of the test user
# (per-user with accounts on, flat without).
_ROOT = f"users/{USER_ID}/" if USER_ID else ""
LEVELS = {
    "threads": f"{_ROOT}threads",
    "thread": f"{_ROOT}threads/{T}",
    "user-data": f"{_ROOT}threads/{T}/user-data",
    "uploads": f"{_ROOT}threads/{T}/user-data/uploads",
    "workspace": f"{_ROOT}threads/{T}/user-data/workspace",
    "outputs": f"{_ROOT}threads/{T}/user-data/outputs",
}


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every entry below `folder`: its content hash (or kind) and its mtime."""
    found: dict[str, tuple[str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            kind = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            found[str(path.relative_to(folder))] = (kind, info.st_mtime_ns)
    return found


def plant_link(base_dir: Path, tmp_path: Path, level: str) -> Path:
    """Replace `level` by a link to an outside folder that holds what the app would look for
    below it (a `secret.txt` in every area); return the outside folder."""
    relative = Path(LEVELS[level])
    outside = tmp_path / "outside"
    full = Path(LEVELS["thread"]) / "user-data"
    for area in AREAS:
        area_path = full / area
        if area_path == relative or relative in area_path.parents:
            target = outside / area_path.relative_to(relative)
            target.mkdir(parents=True, exist_ok=True)
            (target / "secret.txt").write_bytes(SECRET)
    outside.mkdir(exist_ok=True)
    # the levels above the link are real folders (and the other areas exist for real)
    for area in AREAS:
        area_path = base_dir / full / area
        if not (
            relative == area_path.relative_to(base_dir)
            or relative in area_path.relative_to(base_dir).parents
        ):
            area_path.mkdir(parents=True, exist_ok=True)
    (base_dir / relative).parent.mkdir(parents=True, exist_ok=True)
    (base_dir / relative).symlink_to(outside, target_is_directory=True)
    return outside


def affects(level: str, area: str) -> bool:
    """Whether a link at `level` lies on the way to `area`."""
    return level in ("threads", "thread", "user-data") or level == area


# (name, area it reaches, request) for every operation of the app.
def _upload(client: FlaskClient) -> Any:
    return client.post(f"/api/threads/{T}/uploads", data={"files": [(BytesIO(b"new"), "new.txt")]})


def _form_upload(client: FlaskClient) -> Any:
    return client.post(f"/threads/{T}/upload", data={"files": [(BytesIO(b"new"), "new.txt")]})


OPERATIONS = {
    "list": ("uploads", lambda c: c.get(f"/api/threads/{T}/uploads/list")),
    "upload": ("uploads", _upload),
    "form-upload": ("uploads", _form_upload),
    "rename": (
        "uploads",
        lambda c: c.post(
            f"/api/threads/{T}/uploads/secret.txt/rename", json={"new_name": "moved.txt"}
        ),
    ),
    "delete": ("uploads", lambda c: c.delete(f"/api/threads/{T}/uploads/secret.txt")),
    "convert": ("uploads", lambda c: c.post(f"/api/threads/{T}/uploads/secret.txt/convert")),
    "files-page": ("uploads", lambda c: c.get(f"/threads/{T}")),
    "artifact-upload": (
        "uploads",
        lambda c: c.get(f"/api/threads/{T}/artifacts/mnt/user-data/uploads/secret.txt"),
    ),
    "preview-upload": ("uploads", lambda c: c.get(f"/threads/{T}/files/uploads/secret.txt")),
    "browse-outputs": ("outputs", lambda c: c.get(f"/threads/{T}/browse/outputs")),
    "browse-workspace": ("workspace", lambda c: c.get(f"/threads/{T}/browse/workspace")),
    "artifact-output": (
        "outputs",
        lambda c: c.get(f"/api/threads/{T}/artifacts/mnt/user-data/outputs/secret.txt"),
    ),
    "preview-workspace": (
        "workspace",
        lambda c: c.get(f"/threads/{T}/files/workspace/secret.txt"),
    ),
}

CASES = [
    pytest.param(level, operation, id=f"{level}-{operation}")
    for level in LEVELS
    for operation, (area, _) in OPERATIONS.items()
    if affects(level, area)
]


@pytest.mark.parametrize(("level", "operation"), CASES)
def test_every_operation_refuses_a_linked_folder(
    client: FlaskClient, base_dir: Path, tmp_path: Path, level: str, operation: str
) -> None:
    outside = plant_link(base_dir, tmp_path, level)
    before = snapshot(outside)
    response = OPERATIONS[operation][1](client)
    assert response.status_code == 403, response.get_data(as_text=True)
    text = response.get_data(as_text=True)
    assert "is a symbolic link or not a folder" in text
    assert "OUTSIDE-SECRET" not in text
    assert snapshot(outside) == before
    assert (base_dir / LEVELS[level]).is_symlink()  # the link itself is left alone


@pytest.mark.parametrize("level", list(LEVELS))
def test_the_api_answers_json_with_the_level_named(
    client: FlaskClient, base_dir: Path, tmp_path: Path, level: str
) -> None:
    plant_link(base_dir, tmp_path, level)
    area = level if level in AREAS else "uploads"
    response = client.get(f"/api/threads/{T}/artifacts/mnt/user-data/{area}/secret.txt")
    assert response.status_code == 403
    assert response.get_json() == {
        "detail": f"Access denied: {LEVELS[level]} is a symbolic link or not a folder, "
        "and links are never followed"
    }


@pytest.mark.parametrize("level", ["threads", "thread", "user-data", "uploads"])
def test_a_dangling_link_is_not_created_through(
    uploads: UploadActions, base_dir: Path, tmp_path: Path, level: str
) -> None:
    target = tmp_path / "nowhere"
    link = base_dir / LEVELS[level]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)
    assert uploads.upload(T, (b"x", "a.txt")).status_code == 403
    assert not target.exists()


def test_a_link_to_a_folder_inside_the_thread_is_refused_too(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(T, (b"x", "a.txt"))
    workspace = base_dir / LEVELS["workspace"]
    workspace.mkdir(parents=True)
    (workspace / "w.txt").write_bytes(b"w")
    outputs = base_dir / LEVELS["outputs"]
    outputs.symlink_to(workspace, target_is_directory=True)
    assert client.get(f"/threads/{T}/browse/outputs").status_code == 403
    assert client.get(f"/api/threads/{T}/artifacts/mnt/user-data/outputs/w.txt").status_code == 403
    inside = client.get(f"/api/threads/{T}/artifacts/mnt/user-data/workspace/w.txt")
    assert inside.status_code == 200 and inside.data == b"w"
    inside.close()


def test_other_threads_and_the_index_keep_working(
    client: FlaskClient, uploads: UploadActions, base_dir: Path, tmp_path: Path
) -> None:
    assert uploads.upload("other", (b"fine", "ok.txt")).status_code == 200
    plant_link(base_dir, tmp_path, "uploads")
    index = client.get("/")
    assert index.status_code == 200
    assert "other" in index.get_data(as_text=True)
    assert uploads.names("other") == ["ok.txt"]


TOOL_CASES = [
    pytest.param(level, tool_name, id=f"{level}-{tool_name}")
    for level in LEVELS
    for tool_name in ("list_uploaded_files", "read_file", "glob", "grep")
    if tool_name != "list_uploaded_files" or affects(level, "uploads")
]


@pytest.mark.parametrize(("level", "tool_name"), TOOL_CASES)
def test_the_agent_tools_answer_a_tool_error(
    base_dir: Path, tmp_path: Path, level: str, tool_name: str
) -> None:
    outside = plant_link(base_dir, tmp_path, level)
    before = snapshot(outside)
    area = level if level in AREAS else "uploads"
    path = f"/mnt/user-data/{area}"
    args = {
        "list_uploaded_files": {},
        "read_file": {"path": f"{path}/secret.txt"},
        "glob": {"pattern": "*", "path": path},
        "grep": {"pattern": "SECRET", "path": path},
    }[tool_name]
    tool = next(t for t in make_file_tools(base_dir=base_dir) if t.name == tool_name)
    message = tool.invoke(
        {
            "type": "tool_call",
            "id": "c1",
            "name": tool_name,
            "args": {**args, "runtime": make_runtime(CONTEXT)},
        }
    )
    assert isinstance(message, ToolMessage)
    assert message.status == "error"
    assert "is a symbolic link or not a folder" in message.content
    assert "OUTSIDE-SECRET" not in message.content
    assert snapshot(outside) == before


@pytest.mark.parametrize("level", ["thread", "user-data", "uploads"])
def test_an_agent_run_goes_on_and_its_tools_refuse(
    base_dir: Path, tmp_path: Path, level: str
) -> None:
    """In a real LangChain loop: no upload block read through the link, tool errors the
    model can read, and the outside folder untouched."""
    outside = plant_link(base_dir, tmp_path, level)
    before = snapshot(outside)
    calls = [
        {"name": "list_uploaded_files", "args": {}, "id": "c1", "type": "tool_call"},
        {
            "name": "read_file",
            "args": {"path": "/mnt/user-data/uploads/secret.txt"},
            "id": "c2",
            "type": "tool_call",
        },
    ]
    model = RecordingToolModel(messages=iter([AIMessage("", tool_calls=calls), AIMessage("ok")]))
    agent = create_agent(
        model,
        tools=make_file_tools(base_dir=base_dir),
        middleware=make_upload_middleware(base_dir=base_dir),
        context_schema=AgentContext,
        checkpointer=InMemorySaver(),
    )
    message = HumanMessage(
        "read it", id="h1", additional_kwargs={"files": [{"filename": "secret.txt", "size": 15}]}
    )
    result = agent.invoke(
        {"messages": [message]},
        config={"configurable": {"thread_id": T}},
        context=CONTEXT,
    )
    assert result["messages"][-1].content == "ok"
    tools = [m for m in model.received[1] if isinstance(m, ToolMessage)]
    assert [m.status for m in tools] == ["error", "error"]
    assert all("is a symbolic link or not a folder" in m.content for m in tools)
    everything = "\n".join(str(m.content) for batch in model.received for m in batch)
    assert "OUTSIDE-SECRET" not in everything
    assert snapshot(outside) == before


@pytest.mark.parametrize("level", ["users", "user", "user-threads", "user-thread"])
def test_the_per_user_levels_are_checked_as_well(
    base_dir: Path, tmp_path: Path, level: str
) -> None:
    relative = {
        "users": "users",
        "user": "users/u1",
        "user-threads": "users/u1/threads",
        "user-thread": f"users/u1/threads/{T}",
    }[level]
    outside = tmp_path / "outside"
    outside.mkdir()
    link = base_dir / relative
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    paths = ThreadPaths(base_dir)
    with pytest.raises(UnsafeFolder) as refused:
        paths.uploads_dir(thread_ref(T, "u1"))
    assert refused.value.relative == relative
    with pytest.raises(UnsafeFolder):
        paths.ensure_thread_dirs(thread_ref(T, "u1"))
    assert list(outside.iterdir()) == []


def test_creating_the_folders_refuses_a_planted_link(base_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (base_dir / LEVELS["thread"]).mkdir(parents=True)
    (base_dir / LEVELS["user-data"]).symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeFolder):
        ThreadPaths(base_dir).ensure_thread_dirs(thread_ref(T))
    assert list(outside.iterdir()) == []


def test_a_file_in_place_of_a_folder_is_refused(uploads: UploadActions, base_dir: Path) -> None:
    (base_dir / LEVELS["thread"]).mkdir(parents=True)
    (base_dir / LEVELS["user-data"]).write_bytes(b"not a folder")
    response = uploads.upload(T, (b"x", "a.txt"))
    assert response.status_code == 403
    assert "threads/T/user-data is a symbolic link or not a folder" in response.get_json()["detail"]


def test_the_startup_sweep_skips_linked_folders(base_dir: Path, tmp_path: Path) -> None:
    outside = plant_link(base_dir, tmp_path, "uploads")
    assert list(ThreadPaths(base_dir).iter_uploads_dirs()) == []
    assert (outside / "secret.txt").read_bytes() == SECRET


# ---- Hard links ----------------------------------------------------------------------


@pytest.fixture
def hard_linked(base_dir: Path, tmp_path: Path, uploads: UploadActions) -> Path:
    """`uploads/linked.txt` is a second name of a file outside the data dir."""
    assert uploads.upload(T, (b"mine", "mine.txt")).status_code == 200
    outside = tmp_path / "outside.txt"
    outside.write_bytes(SECRET)
    os.link(outside, uploads_dir(base_dir, T) / "linked.txt")
    return outside


def test_a_foreign_hard_link_is_not_listed_served_or_renamed(
    client: FlaskClient, uploads: UploadActions, hard_linked: Path
) -> None:
    assert uploads.names(T) == ["mine.txt"]
    artifact = client.get(f"/api/threads/{T}/artifacts/mnt/user-data/uploads/linked.txt")
    assert artifact.status_code == 404
    assert client.get(f"/threads/{T}/files/uploads/linked.txt").status_code == 404
    page = client.get(f"/threads/{T}").get_data(as_text=True)
    assert "linked.txt" not in page
    renamed = client.post(
        f"/api/threads/{T}/uploads/linked.txt/rename", json={"new_name": "adopted.txt"}
    )
    assert renamed.status_code == 404
    assert client.post(f"/api/threads/{T}/uploads/linked.txt/convert").status_code == 404
    assert uploads.names(T) == ["mine.txt"]
    assert hard_linked.read_bytes() == SECRET


@pytest.mark.parametrize("with_service", [True, False])
def test_the_agent_tools_do_not_read_a_foreign_hard_link(
    app: Any, base_dir: Path, hard_linked: Path, with_service: bool
) -> None:
    service = app.extensions["deerflow_web"].uploads if with_service else None
    tools = {t.name: t for t in make_file_tools(base_dir=base_dir, upload_service=service)}
    runtime = make_runtime(CONTEXT)

    def call(name: str, **args: Any) -> ToolMessage:
        return tools[name].invoke(
            {"type": "tool_call", "id": "c", "name": name, "args": {**args, "runtime": runtime}}
        )

    listed = call("list_uploaded_files")
    assert "linked.txt" not in listed.content and "mine.txt" in listed.content
    read = call("read_file", path="/mnt/user-data/uploads/linked.txt")
    assert read.status == "error" and read.content.startswith("File not found")
    found = call("glob", pattern="*", path="/mnt/user-data/uploads")
    assert "linked.txt" not in found.content and "mine.txt" in found.content
    grep = call("grep", pattern="OUTSIDE|mine", path="/mnt/user-data/uploads")
    assert "OUTSIDE-SECRET" not in grep.content and "mine.txt" in grep.content
    single = call("grep", pattern="SECRET", path="/mnt/user-data/uploads/linked.txt")
    assert single.status == "error"


def test_an_upload_linked_elsewhere_later_is_still_served(
    client: FlaskClient, uploads: UploadActions, base_dir: Path, tmp_path: Path
) -> None:
    uploads.upload(T, (b"report", "report.txt"))
    os.link(uploads_dir(base_dir, T) / "report.txt", tmp_path / "second-name.txt")
    assert uploads.names(T) == ["report.txt"]
    response = client.get(f"/api/threads/{T}/artifacts/mnt/user-data/uploads/report.txt")
    assert response.status_code == 200 and response.data == b"report"
    response.close()


def test_a_link_planted_while_an_upload_streams_is_refused_at_commit(
    app: Any, base_dir: Path, tmp_path: Path
) -> None:
    """The folder is checked again just before the files are renamed into place."""
    service = app.extensions["deerflow_web"].uploads
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = uploads_dir(base_dir, T)

    class SwapWhileReading:
        """A part whose reader replaces uploads/ by a link once its bytes are staged."""

        def __init__(self) -> None:
            self.sent = False

        def read(self, size: int = -1) -> bytes:
            if self.sent:
                folder.rename(folder.with_name("moved-away"))
                folder.symlink_to(outside, target_is_directory=True)
                return b""
            self.sent = True
            return b"payload"

    with pytest.raises(UnsafeFolder):
        service.save_uploads(thread_ref(T), [IncomingFile("a.txt", SwapWhileReading())])
    assert list(outside.iterdir()) == []
