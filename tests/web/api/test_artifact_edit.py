"""`PUT` on an artifact URL edits a text file under outputs/ (SPEC 2.6, issue 25 item 6).

Each request is the one DeerFlow's artifact editor sends: `PUT` with
`Content-Type: application/json` and `{"content", "expected_sha256"}`. Every refusal leaves
the file as it was, byte for byte and inode for inode.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import USER_ID
from tests.helpers import needs_auth
from tests.helpers import user_data_dir

URL = "/api/threads/T/artifacts/mnt/user-data/outputs/"
MIB = 1024 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def outputs(base_dir: Path) -> Path:
    folder = user_data_dir(base_dir, "T") / "outputs"
    folder.mkdir(parents=True)
    return folder


def put(client, name: str, content, expected, **kwargs):
    return client.put(URL + name, json={"content": content, "expected_sha256": expected}, **kwargs)


def unchanged(path: Path, data: bytes, inode: int) -> bool:
    return path.read_bytes() == data and path.stat().st_ino == inode


def test_edit_replaces_the_file_atomically_and_keeps_its_mode(client, outputs: Path) -> None:
    report = outputs / "report.md"
    report.write_bytes(b"# Draft\n")
    report.chmod(0o640)
    before = report.stat()
    answer = put(client, "report.md", "# Final\n\n中文\n", sha(b"# Draft\n"))
    assert answer.status_code == 200, answer.get_json()
    saved = "# Final\n\n中文\n".encode()
    assert answer.get_json() == {
        "path": "/mnt/user-data/outputs/report.md",
        "sha256": sha(saved),
        "size": len(saved),
    }
    after = report.stat()
    assert report.read_bytes() == saved
    assert after.st_ino != before.st_ino  # a new file renamed into place, not a rewrite
    assert after.st_mode & 0o7777 == 0o640
    assert sorted(os.listdir(outputs)) == ["report.md"]  # no staging file or backup left
    # The answer's sha256 opens the next edit, as DeerFlow's editor uses it.
    again = put(client, "report.md", "# Final 2\n", answer.get_json()["sha256"])
    assert again.status_code == 200
    with client.get(URL + "report.md") as read:
        assert read.data == b"# Final 2\n"


def test_a_file_in_a_subfolder_and_a_leading_slash(client, outputs: Path) -> None:
    (outputs / "sub").mkdir()
    (outputs / "sub" / "a b.txt").write_bytes(b"x")
    answer = client.put(
        "/api/threads/T/artifacts//mnt/user-data/outputs/sub/a%20b.txt",
        json={"content": "y", "expected_sha256": sha(b"x")},
    )
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["path"] == "/mnt/user-data/outputs/sub/a b.txt"
    assert (outputs / "sub" / "a b.txt").read_bytes() == b"y"


def test_a_changed_file_is_412_and_untouched(client, outputs: Path) -> None:
    note = outputs / "note.txt"
    note.write_bytes(b"agent wrote this later")
    inode = note.stat().st_ino
    answer = put(client, "note.txt", "mine", sha(b"what the editor opened"))
    assert answer.status_code == 412
    assert answer.get_json() == {"detail": "Artifact changed since it was opened"}
    assert unchanged(note, b"agent wrote this later", inode)


def test_two_saves_of_the_same_version_one_wins(make_app, outputs: Path) -> None:
    """Two editors that opened the same version save at once: one is saved, the other
    is told the file changed, and the file holds exactly the winner's text."""
    app = make_app()
    note = outputs / "shared.txt"
    trials = 20
    clients = [app.test_client(), app.test_client()]

    def save(client, barrier: threading.Barrier, text: str, opened: bytes, statuses: dict) -> None:
        barrier.wait()
        statuses[text] = put(client, "shared.txt", text, sha(opened)).status_code

    for trial in range(trials):
        opened = f"version {trial}".encode()
        note.write_bytes(opened)
        barrier = threading.Barrier(2)
        statuses: dict[str, int] = {}
        threads = [
            threading.Thread(
                target=save, args=(client, barrier, f"{who} {trial}", opened, statuses)
            )
            for who, client in zip("AB", clients, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(statuses.values()) == [200, 412], statuses
        [winner] = [text for text, status in statuses.items() if status == 200]
        assert note.read_text() == winner
    assert sorted(os.listdir(outputs)) == ["shared.txt"]


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        (
            "/api/threads/T/artifacts/mnt/user-data/uploads/a.txt",
            "Only files in /mnt/user-data/outputs can be edited",
        ),
        (
            "/api/threads/T/artifacts/mnt/user-data/workspace/a.txt",
            "Only files in /mnt/user-data/outputs can be edited",
        ),
        (
            "/api/threads/T/artifacts/mnt/user-data/outputs/../uploads/a.txt",
            "Only files in /mnt/user-data/outputs can be edited",
        ),
        ("/api/threads/T/artifacts/mnt/user-data/outputs", "Only files in"),
        ("/api/threads/T/artifacts/mnt/other/a.txt", "Only files in"),
    ],
)
def test_outside_outputs_is_400(client, outputs: Path, path: str, detail: str) -> None:
    uploads = outputs.parent / "uploads"
    uploads.mkdir()
    (uploads / "a.txt").write_bytes(b"a")
    answer = client.put(path, json={"content": "b", "expected_sha256": sha(b"a")})
    assert answer.status_code == 400
    assert answer.get_json()["detail"].startswith(detail)
    assert (uploads / "a.txt").read_bytes() == b"a"


def test_a_folder_or_a_fifo_is_400_and_missing_is_404(client, outputs: Path) -> None:
    (outputs / "folder").mkdir()
    os.mkfifo(outputs / "pipe")
    for name in ("folder", "pipe"):
        answer = put(client, name, "x", sha(b""))
        assert answer.status_code == 400, name
        assert answer.get_json() == {"detail": f"Path is not a file: mnt/user-data/outputs/{name}"}
    missing = put(client, "missing.md", "x", sha(b""))
    assert missing.status_code == 404
    assert missing.get_json() == {"detail": "Artifact not found: mnt/user-data/outputs/missing.md"}
    assert not (outputs / "missing.md").exists()
    gone = put(client, "missing/deeper.md", "x", sha(b""))
    assert gone.status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"expected_sha256": "' + b"0" * 64 + b'"}',
        b'{"content": 5, "expected_sha256": "' + b"0" * 64 + b'"}',
        b'{"content": "x"}',
        b'{"content": "x", "expected_sha256": "' + b"A" * 64 + b'"}',
        b'{"content": "x", "expected_sha256": "abc"}',
        b'{"content": "x", "expected_sha256": null}',
    ],
)
def test_a_bad_body_is_400(client, outputs: Path, body: bytes) -> None:
    note = outputs / "n.txt"
    note.write_bytes(b"n")
    inode = note.stat().st_ino
    answer = client.put(URL + "n.txt", data=body, content_type="application/json")
    assert answer.status_code == 400
    assert isinstance(answer.get_json()["detail"], str)
    assert unchanged(note, b"n", inode)


def test_too_large_is_413(client, outputs: Path) -> None:
    big = outputs / "big.txt"
    big.write_bytes(b"a" * (2 * MIB + 1))
    answer = put(client, "big.txt", "small", sha(big.read_bytes()))
    assert answer.status_code == 413
    assert answer.get_json() == {"detail": "Artifact is too large to edit"}
    small = outputs / "small.txt"
    small.write_bytes(b"s")
    inode = small.stat().st_ino
    assert put(client, "small.txt", "a" * (2 * MIB), sha(b"s")).status_code == 200  # the limit
    small.write_bytes(b"s")
    inode = small.stat().st_ino
    over = put(client, "small.txt", "é" * MIB + "a", sha(b"s"))  # 2 MiB + 1 byte as UTF-8
    assert over.status_code == 413
    assert unchanged(small, b"s", inode)
    # A body far beyond anything an edit can be is refused before it is parsed.
    huge = client.put(
        URL + "small.txt", data=b"[" + b" " * (13 * MIB) + b"]", content_type="application/json"
    )
    assert huge.status_code == 413
    assert unchanged(small, b"s", inode)


def test_not_text_is_415(client, outputs: Path) -> None:
    cases = {
        "image.png": b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
        "latin1.txt": "café".encode("latin-1"),
    }
    for name, data in cases.items():
        (outputs / name).write_bytes(data)
        answer = put(client, name, "text", sha(data))
        assert answer.status_code == 415, name
        assert (outputs / name).read_bytes() == data
    assert put(client, "image.png", "x", sha(cases["image.png"])).get_json() == {
        "detail": "Binary artifacts cannot be edited"
    }
    assert put(client, "latin1.txt", "x", sha(cases["latin1.txt"])).get_json() == {
        "detail": "Only UTF-8 text artifacts can be edited"
    }
    text = outputs / "t.txt"
    text.write_bytes(b"t")
    with_nul = put(client, "t.txt", "a\0b", sha(b"t"))
    assert with_nul.status_code == 415
    assert with_nul.get_json() == {"detail": "Binary content cannot be saved as an artifact"}
    assert text.read_bytes() == b"t"


def test_a_skill_archive_and_a_symlink_are_415(client, outputs: Path) -> None:
    (outputs / "tool.skill").write_bytes(b"PK\x03\x04")
    for name in ("tool.skill", "tool.skill/SKILL.md"):
        answer = put(client, name, "x", sha(b"PK\x03\x04"))
        assert answer.status_code == 415, name
        assert answer.get_json() == {"detail": "Skill archives cannot be edited"}
    target = outputs / "target.txt"
    target.write_bytes(b"target")
    (outputs / "link.txt").symlink_to("target.txt")
    answer = put(client, "link.txt", "through the link", sha(b"target"))
    assert answer.status_code == 415
    assert answer.get_json() == {"detail": "Symlinked artifacts cannot be edited"}
    assert target.read_bytes() == b"target" and (outputs / "link.txt").is_symlink()


def test_a_linked_outputs_folder_is_403(client, base_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.txt").write_bytes(b"outside")
    user_data = user_data_dir(base_dir, "T")
    user_data.mkdir(parents=True)
    (user_data / "outputs").symlink_to(elsewhere)
    answer = put(client, "a.txt", "x", sha(b"outside"))
    assert answer.status_code == 403
    assert (elsewhere / "a.txt").read_bytes() == b"outside"


def test_a_cross_site_edit_is_403(client, outputs: Path) -> None:
    note = outputs / "n.txt"
    note.write_bytes(b"n")
    answer = put(client, "n.txt", "evil", sha(b"n"), headers={"Origin": "http://evil.example"})
    assert answer.status_code == 403
    assert note.read_bytes() == b"n"


def test_the_preview_page_offers_the_editor_only_where_a_save_would_work(
    client, outputs: Path
) -> None:
    (outputs / "plain.txt").write_bytes(b"plain <b>text</b>")
    (outputs / "crlf.txt").write_bytes(b"windows\r\nlines")
    (outputs / "big.txt").write_bytes(b"a" * (2 * MIB + 1))
    uploads = outputs.parent / "uploads"
    uploads.mkdir()
    page = client.get("/threads/T/files/outputs/plain.txt")
    assert page.status_code == 200
    assert b'id="artifact-editor"' in page.data
    assert f'data-sha256="{sha(b"plain <b>text</b>")}"'.encode() in page.data
    assert b"plain &lt;b&gt;text&lt;/b&gt;</textarea>" in page.data
    for name in ("crlf.txt", "big.txt"):  # a textarea would rewrite CRLF; over the limit
        other = client.get(f"/threads/T/files/outputs/{name}")
        assert other.status_code == 200 and b'id="artifact-editor"' not in other.data, name


@needs_auth
def test_another_users_thread_is_404_and_untouched(make_app, outputs: Path) -> None:
    app = make_app()
    services = app.extensions[EXTENSION_KEY]
    services.threads.create(USER_ID, "T")
    other = services.accounts.create_user("other@example.com", "other password")
    note = outputs / "n.txt"
    note.write_bytes(b"mine")
    answer = put(app.test_client(user_id=other.id), "n.txt", "theirs", sha(b"mine"))
    assert answer.status_code == 404
    assert answer.get_json() == {"detail": "Thread T not found"}
    assert note.read_bytes() == b"mine"
