"""The HTML pages through the test client: index, file manager, forms, previews, language."""

from __future__ import annotations

import re
from dataclasses import replace
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from deerflow_web.models import IncomingFile
from deerflow_web.models import RecordSource
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.storage.records import StoredRecord
from deerflow_web.web.security import PAGE_CSP
from deerflow_web.web.wiring import EXTENSION_KEY
from tests.helpers import OFF_SITE_NEXT
from tests.helpers import UploadActions
from tests.helpers import thread_ref
from tests.helpers import uploads_dir

HOSTILE = '"><img src=x onerror=alert(1)>.txt'
PNG_1X1 = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f"
    b"\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\xff\xff?\x00\x05\xfe\x02\xfe\xa7\x35\x81\x84\x00"
    b"\x00\x00\x00IEND\xaeB`\x82"
)


def service_of(app: Flask) -> UploadService:
    return app.extensions[EXTENSION_KEY].uploads


def seed(app: Flask, thread_id: str, files: dict[str, bytes]) -> None:
    """Store files through the service (names the test client could not encode included)."""
    incoming = [IncomingFile(name, BytesIO(body)) for name, body in files.items()]
    service_of(app).save_uploads(thread_ref(thread_id), incoming)


def mark_companion(app: Flask, thread_id: str, companion: str, original: str) -> None:
    """Record `companion` as the conversion output of `original` (as conversion would)."""
    service = service_of(app)
    with service.records.locked(service.paths.scope(thread_ref(thread_id))) as txn:
        stored = txn.get(companion)
        assert stored is not None
        record = replace(stored.record, converted_from=original, source=RecordSource.CONVERSION)
        txn.put(StoredRecord(record, stored.mtime_ns, stored.inode))


def text(response: Any) -> str:
    return response.get_data(as_text=True)


def csrf_token_of(html: str) -> str:
    match = re.search(r'name="csrf-token" content="([^"]+)"', html)
    assert match is not None
    return match.group(1)


# ---- Index ------------------------------------------------------------------------


def test_index_empty_state_explains_what_to_do(client: FlaskClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert "No threads yet" in text(response)
    assert "New thread" in text(response)


def test_index_lists_threads_newest_first_with_count_and_size(
    app: Flask, client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("older", (b"x" * 1536, "a.bin"), (b"y", "b.txt"))
    uploads.upload("newer", (b"z" * 10, "c.txt"))
    html = text(client.get("/"))
    assert html.index("/threads/newer") < html.index("/threads/older")
    row = html[html.index("/threads/older") :]
    assert re.search(r">\s*2\s*<", row)
    assert "1.5 KiB" in row


def test_new_thread_creates_a_fresh_id_and_opens_it(client: FlaskClient, base_dir: Path) -> None:
    response = client.post("/threads")
    assert response.status_code == 302
    thread_id = response.headers["Location"].rsplit("/", 1)[-1]
    assert re.fullmatch(r"[0-9a-f-]{36}", thread_id)
    assert uploads_dir(base_dir, thread_id).is_dir()
    page = client.get(response.headers["Location"])
    assert "New thread created" in text(page)
    assert thread_id in text(client.get("/"))


@pytest.mark.parametrize(
    ("typed", "location"),
    (("abc_1-2", "/threads/abc_1-2"), ("  spaced  ", "/threads/spaced"), ("bad id!", "/")),
)
def test_open_thread_by_id(client: FlaskClient, typed: str, location: str) -> None:
    response = client.get("/open", query_string={"thread_id": typed})
    assert response.status_code == 302
    assert response.headers["Location"] == location


def test_invalid_thread_id_gets_an_html_error_page(client: FlaskClient) -> None:
    response = client.get("/threads/bad!id")
    assert response.status_code == 422
    assert response.mimetype == "text/html"
    assert "Thread ids use 1-64 letters, digits, hyphens or underscores." in text(response)


# ---- File manager list ------------------------------------------------------------


def test_thread_page_lists_files_with_human_sizes_and_types(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("t1", (b"x" * 2048, "data.csv"), (b"%PDF-1.4 x", "paper.pdf"))
    html = text(client.get("/threads/t1"))
    assert "data.csv" in html and "2 KiB" in html
    assert "paper.pdf" in html and "Document" in html
    assert "2 files" in html
    # Convertible files get the (script-revealed) Convert button; others do not.
    assert html.count('data-action="convert"') == 1


def test_thread_page_empty_state(client: FlaskClient) -> None:
    html = text(client.get("/threads/fresh"))
    assert "No files yet" in html


def test_duplicates_are_marked(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload("t1", (b"same", "a.txt"), (b"same", "b.txt"), (b"other", "c.txt"))
    html = text(client.get("/threads/t1"))
    assert html.count(">Duplicate<") == 2
    assert "same content as b.txt" in html
    assert "same content as a.txt" in html


def test_companion_is_shown_under_its_original(
    app: Flask, client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("t1", (b"%PDF-1.4", "report.pdf"), (b"# md", "report.md"), (b"z", "a.txt"))
    mark_companion(app, "t1", "report.md", "report.pdf")
    html = text(client.get("/threads/t1", query_string={"sort": "name"}))
    groups = re.findall(r'<tbody class="file-group" data-names="([^"]*)"', html)
    assert groups == ["a.txt", "report.pdf\nreport.md"]
    assert "Markdown of report.pdf" in html
    # The original already has its Markdown: no Convert button.
    assert 'data-action="convert"' not in html


@pytest.mark.parametrize(
    ("args", "expected"),
    (
        ({"sort": "name"}, ["a.txt", "B.txt", "c.png"]),
        ({"sort": "size"}, ["c.png", "a.txt", "B.txt"]),
        ({"sort": "size", "order": "desc"}, ["B.txt", "a.txt", "c.png"]),
        ({"sort": "type"}, ["a.txt", "B.txt", "c.png"]),
        ({"sort": "type", "order": "desc"}, ["c.png", "B.txt", "a.txt"]),
        ({"q": "a"}, ["a.txt"]),
        ({"type": "image"}, ["c.png"]),
        ({"q": "zzz"}, []),
    ),
)
def test_sort_and_filter(
    client: FlaskClient, uploads: UploadActions, args: dict[str, str], expected: list[str]
) -> None:
    uploads.upload("t1", (b"aa", "a.txt"), (b"bbbb", "B.txt"), (PNG_1X1[:1], "c.png"))
    html = text(client.get("/threads/t1", query_string=args))
    names = re.findall(r'<tbody class="file-group" data-names="([^"]*)"', html)
    assert names == expected
    if not expected:
        assert "No file matches the filter." in html


def test_sort_headers_link_and_announce_order(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload("t1", (b"a", "a.txt"))
    html = text(client.get("/threads/t1", query_string={"sort": "size"}))
    assert 'aria-sort="ascending"' in html
    # sort links name the sort, order and view even when default: the choice is remembered
    assert 'href="/threads/t1?sort=size&amp;order=desc&amp;view=list"' in html
    assert 'href="/threads/t1?sort=uploaded&amp;order=asc&amp;view=list"' in html


def test_hostile_filename_is_escaped_everywhere(app: Flask, client: FlaskClient) -> None:
    seed(app, "t1", {HOSTILE: b"boom", "报告 final.txt": b"x"})
    for url in ("/threads/t1", f"/threads/t1/files/uploads/{HOSTILE}"):
        html = text(client.get(url))
        assert "<img src=x" not in html
        assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;.txt" in html
    html = text(client.get("/threads/t1"))
    assert "报告 final.txt" in html


# ---- No-JavaScript upload form ----------------------------------------------------


def form_upload(client: FlaskClient, thread_id: str, *files: tuple[bytes, str], **fields: str):
    data: dict[str, Any] = dict(fields)
    data["files"] = [(BytesIO(body), name) for body, name in files]
    return client.post(f"/threads/{thread_id}/upload", data=data)


def test_form_upload_stores_files_and_redirects_with_a_message(
    client: FlaskClient, uploads: UploadActions
) -> None:
    response = form_upload(client, "t1", (b"one", "a.txt"), (b"two", "b.txt"))
    assert response.status_code == 302
    assert response.headers["Location"] == "/threads/t1"
    assert uploads.names("t1") == ["a.txt", "b.txt"]
    assert "Uploaded 2 files." in text(client.get("/threads/t1"))


@pytest.mark.parametrize(
    ("choice", "names", "message"),
    (
        ("replace", ["a.txt"], "Uploaded 1 file."),
        ("rename", ["a.txt", "a_1.txt"], "Uploaded 1 file."),
        ("reject", ["a.txt"], "already exists"),
    ),
)
def test_form_upload_conflict_choice(
    client: FlaskClient, uploads: UploadActions, choice: str, names: list[str], message: str
) -> None:
    uploads.upload("t1", (b"old", "a.txt"))
    form_upload(client, "t1", (b"new", "a.txt"), on_conflict=choice)
    assert uploads.names("t1") == names
    assert message in text(client.get("/threads/t1"))


def test_form_upload_limits_are_the_services(make_app: Any) -> None:
    app = make_app(uploads={"max_files": 1, "max_file_size": 4})
    client = app.test_client()
    form_upload(client, "t1", (b"12345", "big.txt"))
    html = text(client.get("/threads/t1"))
    assert "larger than 4 B" in html
    form_upload(client, "t1", (b"1", "a.txt"), (b"2", "b.txt"))
    assert "Too many files: at most 1 per upload." in text(client.get("/threads/t1"))
    assert not uploads_dir(Path(app.extensions[EXTENSION_KEY].settings.base_dir), "t1").exists()


def test_form_upload_without_a_file_asks_for_one(client: FlaskClient) -> None:
    response = client.post("/threads/t1/upload", data={"on_conflict": "replace"})
    assert response.status_code == 302
    assert "Choose a file." in text(client.get("/threads/t1"))


@pytest.fixture
def csrf_client(make_app: Any) -> FlaskClient:
    """A client of an app with CSRF protection on, as in production."""
    return make_app(WTF_CSRF_ENABLED=True).test_client()


@pytest.mark.parametrize(
    ("url", "data"),
    (
        ("/threads/t1/upload", {"files": (BytesIO(b"x"), "a.txt")}),
        ("/threads/t1/delete", {"filenames": "a.txt", "confirmed": "yes"}),
        ("/threads/t1/rename", {"filename": "a.txt", "new_name": "b.txt"}),
        ("/threads", {}),
    ),
)
def test_html_forms_refuse_posts_without_csrf_token(
    csrf_client: FlaskClient, url: str, data: dict[str, Any]
) -> None:
    response = csrf_client.post(url, data=data)
    assert response.status_code == 400
    assert response.mimetype == "text/html"
    assert "This form has expired" in text(response)


def test_html_form_with_csrf_token_is_accepted(csrf_client: FlaskClient) -> None:
    token = csrf_token_of(text(csrf_client.get("/threads/t1")))
    response = csrf_client.post(
        "/threads/t1/upload",
        data={"csrf_token": token, "files": (BytesIO(b"x"), "a.txt"), "on_conflict": "replace"},
    )
    assert response.status_code == 302
    assert "Uploaded 1 file." in text(csrf_client.get("/threads/t1"))


def multipart_body(*parts: tuple[str, str | None, bytes]) -> bytes:
    """(field name, filename or None, value) parts, in the order given."""
    body = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        body += f"--XYZ\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value
        body += b"\r\n"
    return body + b"--XYZ--\r\n"


def post_multipart(client: FlaskClient, url: str, body: bytes, **environ: str):
    return client.post(
        url,
        data=body,
        content_type="multipart/form-data; boundary=XYZ",
        environ_overrides=environ,
    )


@pytest.mark.parametrize("url", ["/threads/t1/upload", "/threads/t1/chat/upload"])
def test_form_uploads_stream_past_werkzeugs_form_parser(
    csrf_client: FlaskClient,
    uploads: UploadActions,
    url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The files are written once, as they arrive: Werkzeug never spools them."""
    token = csrf_token_of(text(csrf_client.get("/threads/t1")))

    def spool(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Werkzeug spooled an uploaded file")

    monkeypatch.setattr(Flask.request_class, "_get_file_stream", spool)
    body = multipart_body(
        ("csrf_token", None, token.encode()),
        ("on_conflict", None, b"rename"),
        ("files", "a.txt", b"first"),
        ("files", "b.txt", b"second"),
    )
    assert post_multipart(csrf_client, url, body).status_code == 302
    assert uploads.names("t1") == ["a.txt", "b.txt"]
    assert "Uploaded 2 files." in text(csrf_client.get("/threads/t1"))


def test_form_token_sent_after_the_files_is_refused_before_writing(
    csrf_client: FlaskClient, uploads: UploadActions, base_dir: Path
) -> None:
    token = csrf_token_of(text(csrf_client.get("/threads/t1")))
    body = multipart_body(("files", "a.txt", b"x" * 5000), ("csrf_token", None, token.encode()))
    response = post_multipart(csrf_client, "/threads/t1/upload", body)
    assert response.status_code == 400
    assert "This form has expired" in text(response)
    assert not uploads_dir(base_dir, "t1").exists()


def test_form_upload_too_large_for_the_server_is_an_error_page(
    make_app: Any, base_dir: Path
) -> None:
    """Refused from Content-Length alone, before any token could be read: no flash."""
    client = make_app(WTF_CSRF_ENABLED=True, uploads={"max_total_size": 1000}).test_client()
    body = multipart_body(("files", "a.txt", b"x" * 100))
    huge = str(64 * 1024 * 1024)
    response = post_multipart(client, "/threads/t1/upload", body, CONTENT_LENGTH=huge)
    assert response.status_code == 413
    assert response.mimetype == "text/html"
    assert "larger than 1000 B. Nothing was uploaded." in text(response)
    assert "Nothing was uploaded" not in text(client.get("/threads/t1"))  # no flash was left
    assert not uploads_dir(base_dir, "t1").exists()


def test_form_upload_with_an_unknown_conflict_choice_stores_nothing(
    client: FlaskClient, uploads: UploadActions
) -> None:
    body = multipart_body(("on_conflict", None, b"merge"), ("files", "a.txt", b"x"))
    assert post_multipart(client, "/threads/t1/upload", body).status_code == 302
    assert "on_conflict must be one of: replace, rename, reject" in text(client.get("/threads/t1"))
    assert uploads.names("t1") == []


def test_form_upload_with_an_empty_file_input_asks_for_a_file(
    client: FlaskClient, uploads: UploadActions
) -> None:
    """What a browser sends when no file was chosen: one nameless, empty part."""
    body = multipart_body(("on_conflict", None, b"replace"), ("files", "", b""))
    assert post_multipart(client, "/threads/t1/upload", body).status_code == 302
    assert "Choose a file." in text(client.get("/threads/t1"))
    assert uploads.names("t1") == []


# ---- Delete and rename ------------------------------------------------------------


def test_unconfirmed_delete_shows_the_names_and_changes_nothing(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("t1", (b"1", "a.txt"), (b"2", "b.txt"))
    response = client.post("/threads/t1/delete", data={"filenames": ["a.txt", "b.txt"]})
    assert response.status_code == 200
    html = text(response)
    assert "Delete these 2 files?" in html
    assert 'name="confirmed" value="yes"' in html
    assert uploads.names("t1") == ["a.txt", "b.txt"]


def test_row_delete_link_asks_first(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload("t1", (b"1", "a b#1?.txt"))
    html = text(client.get("/threads/t1"))
    assert 'href="/threads/t1/delete?filenames=a+b%231?.txt"' in html or "a+b%231%3F.txt" in html
    page = client.get("/threads/t1/delete", query_string={"filenames": "a b#1?.txt"})
    assert "Delete this file?" in text(page)
    assert 'value="a b#1?.txt"' in text(page)


def test_confirmed_bulk_delete_removes_files_and_companions(
    app: Flask, client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("t1", (b"%PDF", "r.pdf"), (b"# r", "r.md"), (b"1", "a.txt"), (b"2", "keep.txt"))
    mark_companion(app, "t1", "r.md", "r.pdf")
    response = client.post(
        "/threads/t1/delete",
        data={"filenames": ["r.pdf", "r.md", "a.txt", "gone.txt"], "confirmed": "yes"},
    )
    assert response.status_code == 302
    assert uploads.names("t1") == ["keep.txt"]
    html = text(client.get("/threads/t1"))
    assert "Deleted 3 files: r.pdf, r.md, a.txt" in html
    assert "“gone.txt” was not found" in html


def test_delete_without_selection_says_so(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload("t1", (b"1", "a.txt"))
    client.post("/threads/t1/delete", data={"confirmed": "yes"})
    assert "Select at least one file to delete." in text(client.get("/threads/t1"))


def test_rename_form_and_success(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload("t1", (b"1", "a.txt"))
    page = client.get("/threads/t1/rename", query_string={"filename": "a.txt"})
    assert page.status_code == 200
    assert 'value="a.txt"' in text(page)
    response = client.post(
        "/threads/t1/rename",
        data={"filename": "a.txt", "new_name": "报告.txt", "on_conflict": "reject"},
    )
    assert response.status_code == 302
    assert uploads.names("t1") == ["报告.txt"]
    assert "Renamed “a.txt” to “报告.txt”." in text(client.get("/threads/t1"))


def test_rename_conflict_asks_again(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload("t1", (b"1", "a.txt"), (b"2", "b.txt"))
    data = {"filename": "a.txt", "new_name": "b.txt", "on_conflict": "reject"}
    response = client.post("/threads/t1/rename", data=data)
    assert response.status_code == 409
    assert "already exists" in text(response)
    assert uploads.names("t1") == ["a.txt", "b.txt"]
    client.post("/threads/t1/rename", data={**data, "on_conflict": "rename"})
    assert uploads.names("t1") == ["b.txt", "b_1.txt"]


def test_rename_of_a_missing_file_goes_back_with_a_message(
    client: FlaskClient, uploads: UploadActions
) -> None:
    uploads.upload("t1", (b"1", "a.txt"))
    data = {"filename": "nope.txt", "new_name": "b.txt", "on_conflict": "reject"}
    response = client.post("/threads/t1/rename", data=data)
    assert response.status_code == 302
    assert "was not found" in text(client.get("/threads/t1"))
    assert client.get("/threads/t1/rename", query_string={"filename": "x"}).status_code == 404


# ---- Preview ----------------------------------------------------------------------


def preview(client: FlaskClient, path: str) -> str:
    response = client.get(f"/threads/t1/files/{path}")
    assert response.status_code == 200, text(response)
    return text(response)


def test_markdown_preview_is_sanitised(app: Flask, client: FlaskClient) -> None:
    body = (
        b"# Title\n\n<script>alert(1)</script>\n\n<img src=x onerror=alert(2)>\n\n"
        b"[bad](javascript:alert(3)) [good](https://example.com)\n\n"
        b"![remote](https://example.com/x.png) ![local](pic.png)\n"
    )
    seed(app, "t1", {"doc.md": body, "pic.png": PNG_1X1})
    html = preview(client, "uploads/doc.md")
    article = html[html.index('<article class="markdown-body">') :]
    article = article[: article.index("</article>")]
    assert "<h1>Title</h1>" in article
    assert "<script" not in article
    assert "<img src=x" not in article
    assert "&lt;img src=x onerror=alert(2)&gt;" in article
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in article
    assert 'href="javascript' not in article
    assert 'href="https://example.com" rel="nofollow noopener noreferrer"' in article
    assert 'src="https://example.com' not in article  # no remote load
    assert 'src="/api/threads/t1/artifacts/mnt/user-data/uploads/pic.png"' in article
    source = text(client.get("/threads/t1/files/uploads/doc.md?view=source"))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in source
    assert '<article class="markdown-body">' not in source


@pytest.mark.parametrize("name", ("page.html", "icon.svg", "x.xhtml"))
def test_active_content_is_shown_as_source(app: Flask, client: FlaskClient, name: str) -> None:
    seed(app, "t1", {name: b"<svg onload=alert(1)><script>alert(1)</script></svg>"})
    html = preview(client, f"uploads/{name}")
    assert "never run" in html
    assert "&lt;svg onload=alert(1)&gt;&lt;script&gt;" in html
    assert "<svg onload" not in html


def test_csv_preview_is_a_table(app: Flask, client: FlaskClient) -> None:
    seed(app, "t1", {"d.csv": b'h1,h2\n1,"a, b"\n2,<b>\n'})
    html = preview(client, "uploads/d.csv")
    assert '<th scope="col">h1</th>' in html
    assert "<td>a, b</td>" in html
    assert "<td>&lt;b&gt;</td>" in html


def test_json_preview_is_pretty_printed(app: Flask, client: FlaskClient) -> None:
    seed(app, "t1", {"c.json": b'{"a":[1,2],"b":"\xe4\xb8\xad"}', "bad.json": b"{nope"})
    assert "{\n  &#34;a&#34;: [\n    1," in preview(client, "uploads/c.json")
    assert "not valid JSON" in preview(client, "uploads/bad.json")


@pytest.mark.parametrize(
    ("name", "body", "marker"),
    (
        ("p.png", PNG_1X1, '<img src="/api/threads/t1/artifacts/mnt/user-data/uploads/p.png"'),
        ("d.pdf", b"%PDF-1.4\n", '<iframe class="pdf-frame" src="/api/threads/t1/artifacts/'),
        ("s.mp3", b"ID3\x03\x00" + bytes(64), "<audio controls"),
        ("v.mp4", b"\x00\x00\x00\x18ftypmp42" + bytes(64), "<video controls"),
        ("b.bin", bytes(range(256)), "No preview for this file"),
        ("e.txt", b"", "This file is empty."),
        ("notes.txt", "中文 <b>x</b>".encode(), "中文 &lt;b&gt;x&lt;/b&gt;"),
        ("gbk.txt", "中文".encode("gb18030"), "中文"),
    ),
)
def test_preview_kinds(app: Flask, client: FlaskClient, name: str, body: bytes, marker: str):
    seed(app, "t1", {name: body})
    assert marker in preview(client, f"uploads/{name}")


@pytest.mark.parametrize(
    ("query", "fragment"),
    (
        ("?page=3", "#page=3"),
        ("?page=100000", "#page=100000"),
        ("?page=0", ""),
        ("?page=-2", ""),
        ("?page=three", ""),
        ("?page=100001", ""),
        ("?page=3%22%3E%3Cscript%3E", ""),
        ("", ""),
    ),
)
def test_a_pdf_preview_opens_at_the_cited_page(
    app: Flask, client: FlaskClient, query: str, fragment: str
) -> None:
    """`?page=N` (an answer citing "report.pdf, page 3") opens the PDF viewer at that page;
    anything else opens it at the start."""
    seed(app, "t1", {"report.pdf": b"%PDF-1.4\n"})
    html = preview(client, f"uploads/report.pdf{query}")
    src = "/api/threads/t1/artifacts/mnt/user-data/uploads/report.pdf" + fragment
    view = "&amp;view=FitH" if fragment else "#view=FitH"  # fitted to the frame's width
    assert f'<iframe class="pdf-frame" src="{src}{view}"' in html
    assert f'<a href="{src}">' in html
    assert "<script>" not in html


def test_large_file_is_truncated_with_a_note(app: Flask, client: FlaskClient) -> None:
    seed(app, "t1", {"big.log": b"line\n" * 300_000})  # 1.4 MiB
    html = preview(client, "uploads/big.log")
    assert "This file is 1.4 MiB. Only the first 1 MiB is shown here" in html
    shown = html[html.index('<pre class="source"') :]
    assert shown.count("line") == 1024 * 1024 // 5  # exactly the first MiB: ...line\nl
    assert "\nl</code>" in shown


def test_preview_of_outputs_and_errors(app: Flask, client: FlaskClient) -> None:
    outputs = service_of(app).paths.area_dir(thread_ref("t1"), "outputs")
    (outputs / "sub").mkdir(parents=True)
    (outputs / "sub" / "r.txt").write_text("result")
    html = preview(client, "outputs/sub/r.txt")
    assert "result" in html
    assert 'href="/threads/t1/browse/outputs/sub"' in html
    assert client.get("/threads/t1/files/outputs/missing.txt").status_code == 404
    assert client.get("/threads/t1/files/outputs/sub").status_code == 400
    assert client.get("/threads/t1/files/../../etc/passwd").status_code in (403, 404)
    assert client.get("/threads/t1/files/outputs/..%2F..%2F..%2Fsecret").status_code in (403, 404)


# ---- Outputs and workspace --------------------------------------------------------


def test_browse_outputs_with_subfolders(app: Flask, client: FlaskClient) -> None:
    outputs = service_of(app).paths.area_dir(thread_ref("t1"), "outputs")
    (outputs / "charts").mkdir(parents=True)
    (outputs / "charts" / "c.png").write_bytes(PNG_1X1)
    (outputs / "summary.md").write_text("# s")
    (outputs / "link.txt").symlink_to("/etc/hostname")
    html = text(client.get("/threads/t1/browse/outputs"))
    assert 'href="/threads/t1/browse/outputs/charts"' in html
    assert 'href="/threads/t1/files/outputs/summary.md"' in html
    assert "link.txt" not in html
    sub = text(client.get("/threads/t1/browse/outputs/charts"))
    assert 'href="/threads/t1/files/outputs/charts/c.png"' in sub
    assert "Up one folder" in sub


def test_browse_empty_and_invalid(client: FlaskClient) -> None:
    assert "Nothing here yet" in text(client.get("/threads/t1/browse/workspace"))
    assert client.get("/threads/t1/browse/secrets").status_code == 404
    assert client.get("/threads/t1/browse/outputs/nope").status_code == 404
    assert client.get("/threads/t1/browse/outputs/../../..").status_code in (403, 404)
    response = client.get("/threads/t1/browse/uploads")
    assert response.headers["Location"] == "/threads/t1"


# ---- Every page: CSP, no inline code, language ------------------------------------

PAGES = (
    "/",
    "/threads/t1",
    "/threads/t1/browse/outputs",
    "/threads/t1/files/uploads/a.md",
    "/threads/t1/files/uploads/p.png",
    "/threads/t1/rename?filename=a.md",
    "/threads/t1/delete?filenames=a.md",
    "/threads/bad!",
)


@pytest.mark.parametrize("url", PAGES)
def test_pages_have_strict_csp_and_no_inline_code(app: Flask, client: FlaskClient, url: str):
    seed(app, "t1", {"a.md": b"# a", "p.png": PNG_1X1})
    response = client.get(url)
    assert response.headers["Content-Security-Policy"] == PAGE_CSP
    html = text(response)
    assert not re.search(r"\sstyle=", html)
    assert not re.search(r"\son[a-z]+=", html)
    for tag in re.findall(r"<script[^>]*>", html):
        assert 'src="/static/' in tag or 'type="application/json"' in tag
    assert "http://" not in html.replace("http://www.w3.org", "")
    assert "https://" not in html
    assert '<html lang="en">' in html
    assert 'href="/language/zh?next=' in html


def test_language_from_accept_language_query_and_cookie(client: FlaskClient) -> None:
    zh = {"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.5"}
    html = text(client.get("/", headers=zh))
    assert '<html lang="zh-Hans">' in html and "新建会话" in html
    assert "New thread" in text(client.get("/?lang=en", headers=zh))
    response = client.get("/language/zh", query_string={"next": "/threads/t1?sort=size"})
    assert response.status_code == 302
    assert response.headers["Location"] == "/threads/t1?sort=size"
    assert "lang=zh" in response.headers["Set-Cookie"]
    assert "上传文件" in text(client.get("/threads/t1"))
    client.get("/language/en")
    assert "Upload files" in text(client.get("/threads/t1", headers=zh))


@pytest.mark.parametrize("target", OFF_SITE_NEXT)
def test_language_switch_never_redirects_off_site(client: FlaskClient, target: str) -> None:
    response = client.get("/language/zh", query_string={"next": target})
    assert response.headers["Location"] == "/"


def test_flash_messages_are_translated(client: FlaskClient, uploads: UploadActions) -> None:
    uploads.upload("t1", (b"1", "a.txt"))
    client.set_cookie("lang", "zh")
    form_upload(client, "t1", (b"2", "a.txt"), on_conflict="reject")
    assert "已存在名为“a.txt”的文件" in text(client.get("/threads/t1"))


def test_unknown_language_is_404(client: FlaskClient) -> None:
    assert client.get("/language/fr").status_code == 404


def set_conversion(app: Flask, thread_id: str, name: str, state, error=None) -> None:
    """Put a conversion state on a record, as the conversion jobs do."""
    service = service_of(app)
    with service.records.locked(service.paths.scope(thread_ref(thread_id))) as txn:
        stored = txn.get(name)
        assert stored is not None
        record = replace(stored.record, conversion_state=state, conversion_error=error)
        txn.put(StoredRecord(record, stored.mtime_ns, stored.inode))


def test_conversion_state_is_shown_and_pending_pages_poll(app: Flask, client: FlaskClient):
    from deerflow_web.models import ConversionState

    seed(app, "t1", {"a.docx": b"PK\x03\x04", "b.pdf": b"%PDF-1.4"})
    set_conversion(app, "t1", "a.docx", ConversionState.CONVERTING)
    set_conversion(app, "t1", "b.pdf", ConversionState.FAILED, "The PDF is encrypted")
    html = text(client.get("/threads/t1"))
    assert 'data-pending="true"' in html
    assert "Converting…" in html
    assert "Conversion failed" in html and "The PDF is encrypted" in html
    # A running conversion offers no second Convert button; a failed one may be retried.
    assert html.count('data-action="convert"') == 1
    assert 'data-url="/api/threads/t1/uploads/b.pdf/convert"' in html


def test_preview_shows_the_outline_the_agent_gets(app, client, base_dir) -> None:
    from deerflow_web.services.conversion.jobs import ConversionJobs

    uploads = app.extensions["deerflow_web"].uploads
    from deerflow_web.models import IncomingFile

    uploads.save_uploads(thread_ref("T"), [IncomingFile("deck.pdf", BytesIO(b"%PDF-1.4 x"))])

    def convert(source, destination, **_):
        destination.write_text("# Annual <b>Report</b>\n\ntext\n## Risks\n")

    jobs = app.extensions["deerflow_web"].conversions
    ConversionJobs(uploads, jobs.settings, converter=convert).convert(thread_ref("T"), "deck.pdf")
    page = client.get("/threads/T/files/uploads/deck.pdf").get_data(as_text=True)
    assert "Document outline" in page and "deck.md" in page
    assert "L1</span> Annual &lt;b&gt;Report&lt;/b&gt;" in page
    assert "L4</span> Risks" in page
    plain = client.get("/threads/T/files/uploads/deck.md").get_data(as_text=True)
    assert "L4</span> Risks" in plain


def test_convert_without_javascript(app, client) -> None:
    from deerflow_web.models import IncomingFile

    services = app.extensions["deerflow_web"]
    services.uploads.save_uploads(
        thread_ref("T"),
        [IncomingFile("a.pdf", BytesIO(b"%PDF-1.4")), IncomingFile("b.pdf", BytesIO(b"%PDF"))],
    )

    def convert(source, destination, **_):
        if source.name == "b.pdf":
            from deerflow_web.errors import ConversionError

            raise ConversionError("b.pdf is corrupt or not a valid PDF (.pdf) file")
        destination.write_text("# Converted\n")

    services.conversions.converter = convert
    page = client.get("/threads/T").get_data(as_text=True)
    assert "<noscript>" in page and 'name="filename" value="a.pdf"' in page
    done = client.post("/threads/T/convert", data={"filename": "a.pdf"}, follow_redirects=True)
    assert "Converted a.pdf to a.md." in done.get_data(as_text=True)
    failed = client.post("/threads/T/convert", data={"filename": "b.pdf"}, follow_redirects=True)
    assert "Could not convert b.pdf: b.pdf is corrupt" in failed.get_data(as_text=True)
    missing = client.post("/threads/T/convert", data={"filename": "c.pdf"}, follow_redirects=True)
    assert "was not found" in missing.get_data(as_text=True)
    assert sorted(r.filename for r in services.uploads.list_uploads(thread_ref("T"))) == [
        "a.md",
        "a.pdf",
        "b.pdf",
    ]


def test_convert_form_needs_a_csrf_token(make_app) -> None:
    client = make_app(WTF_CSRF_ENABLED=True).test_client()
    response = client.post("/threads/T/convert", data={"filename": "a.pdf"})
    assert response.status_code == 400


# ---- Markdown render bounds and cache (issue 23 item 8) -------------------------------


@pytest.fixture
def counted_renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text markdown-it really parses (cache misses), in order; an empty cache first."""
    from deerflow_web.services.files import markdown_render

    markdown_render.RENDER_CACHE.clear()
    rendered: list[str] = []
    real = markdown_render._render_uncached

    def counting(source: str) -> Any:
        rendered.append(source)
        return real(source)

    monkeypatch.setattr(markdown_render, "_render_uncached", counting)
    return rendered


def _timed_preview(client: FlaskClient, path: str) -> tuple[str, float]:
    """A preview page and the CPU time it cost (the test client serves on this thread)."""
    import time

    started = time.thread_time()
    html = preview(client, path)
    return html, time.thread_time() - started


def test_a_megabyte_of_image_openers_previews_as_source_in_bounded_time(
    app: Flask, client: FlaskClient, counted_renders: list[str]
) -> None:
    seed(app, "t1", {"bang.md": b"![" * (512 * 1024)})

    html, cpu_seconds = _timed_preview(client, "uploads/bang.md")

    assert cpu_seconds < 1.0  # it took 14-20 s of CPU
    assert "it is shown as source text" in html and "over 512" in html
    assert '<pre class="source" tabindex="0"><code>![![![' in html
    assert '<article class="markdown-body">' not in html
    assert "Show formatted" not in html and "Show source" not in html
    assert counted_renders == []


def test_a_slow_render_stops_at_its_cpu_bound_and_is_not_tried_again(
    app: Flask, client: FlaskClient, counted_renders: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deerflow_web.services.files import markdown_render

    monkeypatch.setattr(markdown_render, "RENDER_SECONDS", 0.3)
    seed(app, "t1", {"slow.md": b"![" * (200 * 1024)})  # under the size cap, seconds to parse

    first, cpu_seconds = _timed_preview(client, "uploads/slow.md")
    second, again_seconds = _timed_preview(client, "uploads/slow.md")

    # The bound, plus up to 1 s of the request's own work under a loaded machine; a
    # full parse takes several seconds, so passing proves the render stopped at it.
    assert cpu_seconds < 0.3 + 1.0 and again_seconds < 0.3
    for html in (first, second):
        assert "took too long to format; it is shown as source text" in html
        assert '<article class="markdown-body">' not in html
    assert len(counted_renders) == 1


def test_a_second_view_reuses_the_render_and_still_sees_new_images(
    app: Flask, client: FlaskClient, counted_renders: list[str]
) -> None:
    seed(app, "t1", {"doc.md": b"# Title\n\n![pic](pic.png) ![gone](gone.png)\n"})

    before = preview(client, "uploads/doc.md")
    seed(app, "t1", {"pic.png": PNG_1X1})
    after = preview(client, "uploads/doc.md")

    assert len(counted_renders) == 1
    assert "<h1>Title</h1>" in before and "<h1>Title</h1>" in after
    assert '<span class="md-missing-image">pic</span>' in before
    assert 'src="/api/threads/t1/artifacts/mnt/user-data/uploads/pic.png"' in after
    assert '<span class="md-missing-image">gone</span>' in after


def test_the_same_text_in_two_threads_renders_once_with_each_threads_images(
    app: Flask, client: FlaskClient, counted_renders: list[str]
) -> None:
    body = b"![pic](pic.png)\n"
    seed(app, "t1", {"doc.md": body, "pic.png": PNG_1X1})
    seed(app, "t2", {"doc.md": body, "pic.png": PNG_1X1})

    first = preview(client, "uploads/doc.md")
    response = client.get("/threads/t2/files/uploads/doc.md")

    assert response.status_code == 200 and len(counted_renders) == 1
    assert 'src="/api/threads/t1/artifacts/mnt/user-data/uploads/pic.png"' in first
    assert 'src="/api/threads/t2/artifacts/mnt/user-data/uploads/pic.png"' in text(response)


def test_under_gevent_a_slow_render_is_bounded_once_and_the_loop_keeps_answering(
    tmp_path: Path,
) -> None:
    """Real gunicorn with `make run`'s worker: the render runs on the worker's thread pool
    (its CPU bound is that thread's time), other requests are answered meanwhile, and the
    verdict is cached for the next view."""
    import threading

    from tests.support.live_server import LiveServer
    from tests.support.live_server import raw_request

    base = tmp_path / "data"
    folder = uploads_dir(base, "T", None)
    folder.mkdir(parents=True)
    (folder / "slow.md").write_bytes(b"![" * (200 * 1024))  # several seconds of parsing
    (folder / "fine.md").write_bytes(b"# Fine\n")
    log = tmp_path / "server.log"
    slow_path = "/threads/T/files/uploads/slow.md"
    with LiveServer(base, single_user=True, log=log) as server:
        first: list[bytes] = []
        viewer = threading.Thread(
            target=lambda: first.append(raw_request(server.port, "GET", slow_path, timeout=120))
        )
        viewer.start()
        fine = raw_request(server.port, "GET", "/threads/T/files/uploads/fine.md", timeout=60)
        health = raw_request(server.port, "GET", "/healthz", timeout=60)
        viewer.join(120)
        again = raw_request(server.port, "GET", slow_path, timeout=60)
        server.stop()

    assert b"<h1>Fine</h1>" in fine and health.startswith(b"HTTP/1.1 200")
    for page in (first[0], again):
        assert page.startswith(b"HTTP/1.1 200")
        assert b"took too long to format; it is shown as source text" in page
    assert log.read_text().count("not formatted: over 2 s of CPU") == 1
