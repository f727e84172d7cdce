"""GET /threads/<id>/zip: a selection or a tab as one zip, with the download's own rules."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from flask.testing import FlaskClient

from tests.helpers import UploadActions
from tests.helpers import thread_dir
from tests.helpers import uploads_dir

THREAD = "zip-thread"


def unzip(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_a_selection_comes_back_as_one_zip(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload(THREAD, (b"one", "a.txt"), (b"two", "报告.txt"), (b"three", "c.txt"))
    response = client.get(f"/threads/{THREAD}/zip?filenames=a.txt&filenames=报告.txt")
    assert response.status_code == 200
    assert response.mimetype == "application/zip"
    assert response.headers["Content-Disposition"] == f"attachment; filename*=UTF-8''{THREAD}.zip"
    assert "sandbox" in response.headers["Content-Security-Policy"]
    assert unzip(response.get_data()) == {"a.txt": b"one", "报告.txt": b"two"}


def test_the_whole_uploads_tab(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload(THREAD, (b"one", "a.txt"), (b"two", "b.txt"))
    response = client.get(f"/threads/{THREAD}/zip?area=uploads")
    assert unzip(response.get_data()) == {"a.txt": b"one", "b.txt": b"two"}


def test_a_whole_outputs_tab_with_subfolders(
    client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    uploads.upload(THREAD, (b"one", "a.txt"))
    outputs = thread_dir(base_dir, THREAD) / "user-data" / "outputs"
    (outputs / "charts").mkdir(parents=True)
    (outputs / "report.md").write_bytes(b"# r")
    (outputs / "charts" / "c.csv").write_bytes(b"1,2")
    response = client.get(f"/threads/{THREAD}/zip?area=outputs")
    assert unzip(response.get_data()) == {"report.md": b"# r", "charts/c.csv": b"1,2"}


def test_an_unknown_name_fails_whole_and_sends_nothing(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload(THREAD, (b"one", "a.txt"))
    response = client.get(f"/threads/{THREAD}/zip?filenames=a.txt&filenames=missing.txt")
    assert response.status_code == 404
    assert response.mimetype != "application/zip"


def test_a_link_in_uploads_is_refused_as_its_download_is(
    client: FlaskClient, uploads: UploadActions, base_dir: Path, tmp_path: Path
) -> None:
    uploads.upload(THREAD, (b"one", "a.txt"))
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"secret")
    (uploads_dir(base_dir, THREAD) / "link.txt").symlink_to(secret)
    single = client.get(f"/api/threads/{THREAD}/artifacts/mnt/user-data/uploads/link.txt")
    response = client.get(f"/threads/{THREAD}/zip?filenames=link.txt")
    assert single.status_code == response.status_code == 403
    assert b"secret" not in response.get_data()


def test_traversal_and_bad_input(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload(THREAD, (b"one", "a.txt"))
    assert client.get(f"/threads/{THREAD}/zip?path=uploads/../../x").status_code in (400, 403, 404)
    assert client.get(f"/threads/{THREAD}/zip?area=elsewhere").status_code == 422
    assert client.get(f"/threads/{THREAD}/zip?filenames=a.txt&filenames=a.txt").status_code == 422
    assert client.get(f"/threads/{THREAD}/zip?area=outputs").status_code == 422  # empty tab


def test_another_users_or_unknown_thread_is_404(client: FlaskClient) -> None:
    assert client.get("/threads/nobody-has-it/zip?filenames=a.txt").status_code == 404
