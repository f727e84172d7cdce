"""GET /api/threads/<tid>/artifacts/<path> (SPEC 2.5; cases 72-87)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import UploadActions
from tests.helpers import user_data_dir

# The files are put in the data dir by hand, as an agent's sandbox writes outputs/; in
# uploads/ only the local backend adopts such files (on S3 the folder is a copy of records).
pytestmark = pytest.mark.local_disk

URL = "/api/threads/T/artifacts/mnt/user-data"


def put(base_dir: Path, relative: str, data: bytes) -> Path:
    path = user_data_dir(base_dir, "T") / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def get(client, url: str, **kwargs):
    response = client.get(url, **kwargs)
    body = response.get_data()
    response.close()
    return response, body


def test_text_inline(client, base_dir: Path) -> None:
    text = "“curly” quotes ‘here’"
    put(base_dir, "outputs/note.txt", text.encode())
    response, body = get(client, f"{URL}/outputs/note.txt")
    assert response.status_code == 200
    assert body.decode() == text
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert response.headers["Accept-Ranges"] == "bytes"
    assert response.headers["Content-Disposition"] == "inline; filename*=UTF-8''note.txt"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["ETag"] and response.headers["Last-Modified"]


@pytest.mark.parametrize(
    ("query", "kind"),
    [
        ("?download=false", "inline"),
        ("?download=true", "attachment"),
        ("?download=YES", "attachment"),
        ("?download=0", "inline"),
    ],
)
def test_download_flag(client, base_dir: Path, query: str, kind: str) -> None:
    put(base_dir, "outputs/note.txt", b"x")
    response, _ = get(client, f"{URL}/outputs/note.txt{query}")
    assert response.headers["Content-Disposition"].startswith(f"{kind};")


def test_bad_download_flag_is_422(client, base_dir: Path) -> None:
    put(base_dir, "outputs/note.txt", b"x")
    response, _ = get(client, f"{URL}/outputs/note.txt?download=perhaps")
    assert response.status_code == 422
    assert response.get_json()["detail"][0]["loc"] == ["query", "download"]


MARKUP = b'<r xmlns:x="http://www.w3.org/1999/xhtml"><x:script>alert(1)</x:script></r>'
PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


@pytest.mark.parametrize(
    ("name", "data", "kind", "content_type"),
    [
        # passive kinds, inline with their own type
        ("pixel.png", PNG_HEAD, "inline", "image/png"),
        ("photo.jpg", b"\xff\xd8\xff\xe0\x00", "inline", "image/jpeg"),
        ("doc.pdf", b"%PDF-1.4\n\x00", "inline", "application/pdf"),
        ("clip.mp3", b"ID3\x00\x00binary", "inline", "audio/mpeg"),
        ("film.mp4", b"\x00\x00\x00\x18ftypmp42", "inline", "video/mp4"),
        # passive text formats keep their type (issue 25 item 9), under nosniff and sandbox
        ("note.txt", b"words", "inline", "text/plain"),
        ("data.json", b'{"a": 1}', "inline", "application/json"),
        ("DATA.JSON", b'{"a": 1}', "inline", "application/json"),
        ("html.json", b"<script>alert(1)</script>", "inline", "application/json"),
        ("table.csv", b"a,b\n1,2\n", "inline", "text/csv"),
        ("table.tsv", b"a\tb\n", "inline", "text/tab-separated-values"),
        ("notes.md", b"# <script>alert(1)</script>", "inline", "text/markdown"),
        ("events.ndjson", b'{"a": 1}\n{"a": 2}\n', "inline", "application/x-ndjson"),
        ("events.jsonl", b'{"a": 1}\n', "inline", "application/x-ndjson"),
        ("config.yaml", b"a: 1\n", "inline", "application/yaml"),
        ("config.yml", b"a: 1\n", "inline", "application/yaml"),
        # any other text, inline only as text/plain
        ("script.js", b"alert(1)", "inline", "text/plain"),
        ("style.css", b"body{}", "inline", "text/plain"),
        ("page.html.txt", b"<script>alert(1)</script>", "inline", "text/plain"),
        ("README", b"<html><script>alert(1)</script>", "inline", "text/plain"),
        # markup of every kind: never inline
        ("poc.html", b"<script>alert(1)</script>", "attachment", "text/html"),
        ("x.htm", b"<script>alert(1)</script>", "attachment", "text/html"),
        ("page.xhtml", MARKUP, "attachment", "application/xhtml+xml"),
        ("page.xht", MARKUP, "attachment", "application/xhtml+xml"),
        ("image.svg", MARKUP, "attachment", "image/svg+xml"),
        ("p.xml", MARKUP, "attachment", "application/xml"),
        ("style.xsl", MARKUP, "attachment", "application/xslt+xml"),
        ("feed.rss", MARKUP, "attachment", "application/x-rss+xml"),
        ("feed.atom", MARKUP, "attachment", "application/atom+xml"),
        ("formula.mml", MARKUP, "attachment", "application/mathml+xml"),
        ("page.mht", MARKUP, "attachment", "message/rfc822"),
        # binary of unknown kind: a download
        ("blob.bin", b"\x00\x01\x02", "attachment", "application/octet-stream"),
        ("archive.zip", b"PK\x03\x04\x00", "attachment", "application/zip"),
    ],
)
def test_only_passive_kinds_are_inline(
    client, base_dir: Path, name: str, data: bytes, kind: str, content_type: str
) -> None:
    for area in ("uploads", "outputs", "workspace"):
        put(base_dir, f"{area}/{name}", data)
        for query in ("", "?download=false"):
            response, body = get(client, f"{URL}/{area}/{name}{query}")
            assert response.status_code == 200 and body == data
            assert response.headers["Content-Disposition"].startswith(f"{kind};"), name
            assert response.mimetype == content_type
            if content_type.startswith("text/"):
                assert response.headers["Content-Type"] == f"{content_type}; charset=utf-8"
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            policy = response.headers["Content-Security-Policy"]
            assert "default-src 'none'" in policy and "sandbox" in policy
            assert "script-src" not in policy and "allow-scripts" not in policy


def test_download_keeps_the_files_own_type(client, base_dir: Path) -> None:
    put(base_dir, "outputs/data.json", b'{"a": 1}')
    response, _ = get(client, f"{URL}/outputs/data.json?download=true")
    assert response.headers["Content-Disposition"] == "attachment; filename*=UTF-8''data.json"
    assert response.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("name", "data", "policy"),
    [
        (
            "pixel.png",
            PNG_HEAD,
            "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'; "
            "img-src 'self'; style-src 'unsafe-inline'; sandbox",
        ),
        (
            "doc.pdf",
            b"%PDF-1.4\n\x00",
            "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'; "
            "sandbox",
        ),
        (
            "clip.mp3",
            b"ID3\x00",
            "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'; "
            "media-src 'self'; style-src 'unsafe-inline'; sandbox allow-same-origin",
        ),
        (
            "note.txt",
            b"x",
            "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'; "
            "style-src 'unsafe-inline'; sandbox",
        ),
        (
            "poc.html",
            b"<script>",
            "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'; "
            "sandbox",
        ),
    ],
)
def test_policy_per_kind(client, base_dir: Path, name: str, data: bytes, policy: str) -> None:
    put(base_dir, f"outputs/{name}", data)
    response, _ = get(client, f"{URL}/outputs/{name}")
    assert response.headers["Content-Security-Policy"] == policy


def test_errors_and_ranges_carry_the_policy_too(client, base_dir: Path) -> None:
    put(base_dir, "outputs/a.txt", b"abcdef")
    for url, headers, status in (
        (f"{URL}/outputs/missing.txt", {}, 404),
        (f"{URL}/outputs/a.txt", {"Range": "bytes=0-1"}, 206),
        (f"{URL}/outputs/a.txt", {"Range": "bytes=9-"}, 416),
        (f"{URL}/outputs/a.txt", {"Range": "items=0-1"}, 400),
    ):
        response, _ = get(client, url, headers=headers)
        assert response.status_code == status
        policy = response.headers["Content-Security-Policy"]
        assert policy.startswith("default-src 'none'") and "sandbox" in policy
        assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_single_ranges(client, base_dir: Path) -> None:
    data = bytes(range(256)) * 3906 + b"\x00" * 64
    assert len(data) == 1_000_000
    put(base_dir, "outputs/clip.mp3", data)
    response, body = get(client, f"{URL}/outputs/clip.mp3", headers={"Range": "bytes=500000-"})
    assert response.status_code == 206
    assert response.headers["Content-Range"] == "bytes 500000-999999/1000000"
    assert body == data[500000:]
    response, body = get(client, f"{URL}/outputs/clip.mp3", headers={"Range": "bytes=-10"})
    assert body == data[-10:]
    response, body = get(client, f"{URL}/outputs/clip.mp3")
    assert response.status_code == 200 and body == data


def test_preview_range_on_a_large_text(client, base_dir: Path) -> None:
    put(base_dir, "outputs/large.txt", b"a" * 2 * 1024 * 1024)
    response, body = get(client, f"{URL}/outputs/large.txt", headers={"Range": "bytes=0-1048575"})
    assert response.status_code == 206
    assert len(body) == 1048576
    assert response.headers["Content-Range"] == "bytes 0-1048575/2097152"
    assert response.headers["Content-Disposition"].startswith("inline;")
    response, body = get(client, f"{URL}/outputs/large.txt", headers={"Range": "bytes=2097152-"})
    assert response.status_code == 416
    assert response.headers["Content-Range"] == "bytes */2097152"


def test_range_on_an_empty_file(client, base_dir: Path) -> None:
    put(base_dir, "outputs/empty.txt", b"")
    response, _ = get(client, f"{URL}/outputs/empty.txt", headers={"Range": "bytes=0-1048575"})
    assert response.status_code == 416
    assert response.headers["Content-Range"] == "bytes */0"


def test_malformed_range_is_400(client, base_dir: Path) -> None:
    put(base_dir, "outputs/a.txt", b"abcdef")
    for header in ("bytes", "items=0-1", "bytes=5-2"):
        response, _ = get(client, f"{URL}/outputs/a.txt", headers={"Range": header})
        assert response.status_code == 400, header


def test_if_range_mismatch_sends_the_whole_file(client, base_dir: Path) -> None:
    put(base_dir, "outputs/a.txt", b"abcdef")
    response, body = get(
        client, f"{URL}/outputs/a.txt", headers={"Range": "bytes=0-1", "If-Range": '"other-etag"'}
    )
    assert response.status_code == 200 and body == b"abcdef"
    etag = get(client, f"{URL}/outputs/a.txt")[0].headers["ETag"]
    response, body = get(
        client, f"{URL}/outputs/a.txt", headers={"Range": "bytes=0-1", "If-Range": etag}
    )
    assert response.status_code == 206 and body == b"ab"


def test_text_detection(client, base_dir: Path) -> None:
    put(base_dir, "workspace/README", b"plain words")
    put(base_dir, "workspace/data.json", b'{"a": 1}')
    response, _ = get(client, f"{URL}/workspace/README")
    assert response.headers["Content-Type"].startswith("text/plain")
    response, _ = get(client, f"{URL}/workspace/data.json")  # a passive type: kept
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Content-Disposition"].startswith("inline;")


def test_errors(client, base_dir: Path, tmp_path: Path) -> None:
    put(base_dir, "outputs/x.txt", b"x")
    cases = {
        f"{URL}/outputs/missing.txt": (
            404,
            "Artifact not found: mnt/user-data/outputs/missing.txt",
        ),
        URL: (400, "Path is not a file: mnt/user-data"),
        "/api/threads/T/artifacts/mnt/other/x": (400, "Path must start with /mnt/user-data"),
        f"{URL}/../../x": (403, "Access denied: path traversal detected"),
    }
    for url, (status, detail) in cases.items():
        response, _ = get(client, url)
        assert (response.status_code, response.get_json()) == (status, {"detail": detail}), url


def test_symlink_out_of_user_data_is_403(client, base_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    link = put(base_dir, "outputs/placeholder", b"").with_name("link.txt")
    link.symlink_to(secret)
    response, body = get(client, f"{URL}/outputs/link.txt")
    assert response.status_code == 403
    assert b"secret" not in body


def test_symlink_inside_user_data_is_served(client, base_dir: Path) -> None:
    target = put(base_dir, "workspace/real.txt", b"real")
    (target.parent.parent / "outputs").mkdir()
    (target.parent.parent / "outputs" / "alias.txt").symlink_to(target)
    assert get(client, f"{URL}/outputs/alias.txt")[1] == b"real"


def test_upload_artifact_url_round_trip(uploads: UploadActions, client) -> None:
    name = "中 文#?.png"
    entry = uploads.upload("T", (b"\x89PNG\r\n\x1a\nrest", name)).get_json()["files"][0]
    assert entry["artifact_url"].endswith("/%E4%B8%AD%20%E6%96%87%23%3F.png")
    response, body = get(client, entry["artifact_url"])
    assert response.status_code == 200 and body.startswith(b"\x89PNG")
    assert (
        "filename*=UTF-8''%E4%B8%AD%20%E6%96%87%23%3F.png"
        in response.headers["Content-Disposition"]
    )


def test_other_threads_are_unreachable(uploads: UploadActions, client) -> None:
    uploads.upload("A", (b"private", "secret.txt"))
    response, body = get(client, "/api/threads/B/artifacts/mnt/user-data/uploads/secret.txt")
    assert response.status_code == 404
    response, body = get(
        client, "/api/threads/B/artifacts/mnt/user-data/../../A/user-data/uploads/secret.txt"
    )
    assert response.status_code in (403, 404) and b"private" not in body


def test_half_written_uploads_are_never_served(client, base_dir: Path) -> None:
    put(base_dir, "uploads/.upload-0123abcd.part", b"half of a file")
    response, body = get(client, f"{URL}/uploads/.upload-0123abcd.part")
    assert response.status_code == 404
    assert b"half of a file" not in body
