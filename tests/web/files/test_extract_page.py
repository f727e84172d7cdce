"""The file manager's Extract button (issue 26: archives extracted on request)."""

from __future__ import annotations

import html
from io import BytesIO
from pathlib import Path

from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.models import IncomingFile
from tests.helpers import thread_ref
from tests.helpers import user_data_dir
from tests.support.archives import make_overlapping_zip
from tests.support.archives import make_zip


def _seed(app: Flask, **files: bytes) -> None:
    uploads = app.extensions["deerflow_web"].uploads
    uploads.save_uploads(
        thread_ref("T"), [IncomingFile(name, BytesIO(data)) for name, data in files.items()]
    )


def test_archives_get_an_extract_button_and_other_files_none(
    app: Flask, client: FlaskClient
) -> None:
    _seed(app, **{"r.zip": make_zip({"a.txt": b"a"}), "notes.txt": b"n"})
    page = client.get("/threads/T").get_data(as_text=True)
    assert page.count('data-action="extract"') == 1
    assert 'name="filename" value="r.zip"' in page


def test_extract_writes_the_folder_and_says_what_was_refused(
    app: Flask, client: FlaskClient, base_dir: Path
) -> None:
    _seed(app, **{"r.zip": make_zip({"q/a.txt": b"a", "../evil": b"x"})})
    done = client.post("/threads/T/extract", data={"filename": "r.zip"}, follow_redirects=True)
    page = html.unescape(done.get_data(as_text=True))
    assert "Extracted 1 file(s) from r.zip into /mnt/user-data/workspace/r." in page
    assert "1 member(s) of r.zip were not extracted: member '../evil' leaves the archive" in page
    assert (user_data_dir(base_dir, "T") / "workspace/r/q/a.txt").read_bytes() == b"a"


def test_a_refused_archive_is_flashed_and_writes_nothing(
    app: Flask, client: FlaskClient, base_dir: Path
) -> None:
    _seed(app, **{"bomb.zip": make_overlapping_zip()})
    done = client.post("/threads/T/extract", data={"filename": "bomb.zip"}, follow_redirects=True)
    page = html.unescape(done.get_data(as_text=True))
    assert "bomb.zip is refused: members 'a.txt' and 'b.txt' overlap" in page
    assert not (user_data_dir(base_dir, "T") / "workspace").exists()


def test_extract_form_needs_a_csrf_token(make_app) -> None:
    client = make_app(WTF_CSRF_ENABLED=True).test_client()
    assert client.post("/threads/T/extract", data={"filename": "r.zip"}).status_code == 400
