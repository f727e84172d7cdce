"""The services behind the pages, tested without Flask: sizes, listing, preview, browse."""

from __future__ import annotations

import time
from io import BytesIO
from pathlib import Path

import pytest

from deerflow_web.errors import ArtifactNotFound
from deerflow_web.errors import NotAFile
from deerflow_web.errors import PathTraversal
from deerflow_web.models import SINGLE_USER
from deerflow_web.models import ConversionState
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.models import UploadRecord
from deerflow_web.services.files.artifacts import resolve_artifact
from deerflow_web.services.files.browse import list_area
from deerflow_web.services.files.kinds import FileKind
from deerflow_web.services.files.kinds import file_kind
from deerflow_web.services.files.list_query import ListQuery
from deerflow_web.services.files.listing import SortKey
from deerflow_web.services.files.listing import build_listing
from deerflow_web.services.files.markdown_render import render_markdown
from deerflow_web.services.files.preview import PREVIEW_BYTES
from deerflow_web.services.files.preview import PreviewKind
from deerflow_web.services.files.preview import build_preview
from deerflow_web.services.files.sizes import human_size
from deerflow_web.services.prompt.chat_preview import make_chat_preview_service
from deerflow_web.services.threads.catalog import ThreadCatalog
from deerflow_web.services.threads.overview import list_threads
from deerflow_web.services.uploads.bulk_delete import delete_uploads
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


@pytest.fixture
def service(tmp_path: Path) -> UploadService:
    return make_upload_service(tmp_path / "data")


def save(service: UploadService, thread_id: str, **files: bytes) -> None:
    incoming = [IncomingFile(name, BytesIO(body)) for name, body in files.items()]
    service.save_uploads(ThreadRef.single_user(thread_id), incoming)


# ---- Sizes (SPEC 2.7) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "shown"),
    (
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (2048, "2 KiB"),
        (1280, "1.3 KiB"),  # halves round up, as JavaScript's toFixed does here
        (1024 * 1024 - 1, "1024 KiB"),
        (1024 * 1024, "1 MiB"),
        (int(2.25 * 1024**3), "2.3 GiB"),
        (5000 * 1024**3, "5000 GiB"),
    ),
)
def test_human_size(size: int, shown: str) -> None:
    assert human_size(size) == shown


# ---- Kinds, listing and query ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content_type", "kind"),
    (
        ("a.PDF", "application/pdf", FileKind.DOCUMENT),
        ("notes", "text/plain", FileKind.TEXT),
        ("x.unknown", "image/png", FileKind.IMAGE),
        ("x.unknown", "application/octet-stream", FileKind.OTHER),
        ("page.html", "text/html", FileKind.CODE),
    ),
)
def test_file_kind(name: str, content_type: str, kind: FileKind) -> None:
    assert file_kind(name, content_type) is kind


def record(name: str, sha: str = "", size: int = 1, at: float = 0.0, **extra) -> UploadRecord:
    return UploadRecord(name, size, sha or name, "text/plain", at, at, **extra)


def test_listing_groups_companions_and_marks_duplicates() -> None:
    records = [
        record("a.pdf", sha="1"),
        record("a.md", sha="2", converted_from="a.pdf"),
        record("copy.txt", sha="1"),
        record("orphan.md", sha="3", converted_from="gone.pdf"),
    ]
    listing = build_listing(records)
    assert [[r.filename for r in g.rows()] for g in listing.groups] == [
        ["a.pdf", "a.md"],
        ["copy.txt"],
        ["orphan.md"],
    ]
    rows = {r.filename: r for g in listing.groups for r in g.rows()}
    assert rows["a.pdf"].same_content_as == ("copy.txt",)
    assert rows["a.md"].same_content_as == ()
    assert listing.total_count == 4 and listing.shown_count == 4


def test_filter_keeps_a_group_when_its_companion_matches() -> None:
    records = [record("scan.pdf"), record("notes.md", converted_from="scan.pdf"), record("z.png")]
    listing = build_listing(records, query="NOTES")
    assert [g.row.filename for g in listing.groups] == ["scan.pdf"]
    assert [g.row.filename for g in build_listing(records, kind=FileKind.IMAGE).groups] == ["z.png"]


def test_sort_by_uploaded_and_pending_conversions() -> None:
    records = [
        record("old.pdf", at=1.0, conversion_state=ConversionState.CONVERTING),
        record("new.txt", at=2.0),
    ]
    listing = build_listing(records, sort=SortKey.UPLOADED, descending=True)
    assert [g.row.filename for g in listing.groups] == ["new.txt", "old.pdf"]
    assert listing.any_pending


def test_list_query_parses_toggles_and_serialises() -> None:
    query = ListQuery.from_args({"q": "  rep ", "type": "image", "sort": "size", "order": "up"})
    assert (query.q, query.kind, query.sort, query.order) == ("rep", FileKind.IMAGE, "size", "asc")
    assert query.toggled(SortKey.SIZE).as_args() == {
        "q": "rep",
        "type": "image",
        "sort": "size",
        "order": "desc",
    }
    assert ListQuery.from_args({"sort": "evil", "type": "nope"}) == ListQuery()
    assert ListQuery().toggled(SortKey.NAME).as_args() == {"order": "desc"}


# ---- Markdown ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "present", "absent"),
    (
        ("<script>alert(1)</script>", "&lt;script&gt;", "<script"),
        ("<b onmouseover=x>hi</b>", "&lt;b onmouseover=x&gt;", "<b "),
        ("[x](javascript:alert(1))", "[x](javascript:alert(1))", "href"),
        ("[x](JaVaScRiPt:alert(1))", "[x](", "href"),
        ("[x](data:text/html;base64,PHNjcmlwdD4=)", "[x](", "href"),
        ("[x](vbscript:msgbox)", "[x](", "href"),
        ("[ok](https://e.com)", 'href="https://e.com" rel="nofollow noopener noreferrer"', "<img"),
        ("[rel](other.md)", 'href="other.md"', "rel="),
        ("![r](https://e.com/a.png)", 'class="md-remote-image" href="https://e.com/a.png"', "<img"),
        ("![p](//e.com/a.png)", 'href="//e.com/a.png"', "<img"),
        ("![d](data:image/png;base64,AAAA)", "", "<img"),
        ("![up](../../etc/passwd)", '<span class="md-missing-image">up</span>', "<img"),
        ("![l](sub/p%20q.png)", 'src="URL:uploads/sub/p q.png"', "md-missing"),
        ('![a"b](x.png)', 'alt="a&#34;b"', 'alt="a"b"'),
    ),
)
def test_markdown_is_sanitised(source: str, present: str, absent: str) -> None:
    html = render_markdown(source, base_dir="uploads", image_url=lambda path: f"URL:{path}")
    assert present in html
    assert absent not in html


def test_markdown_images_without_a_resolver_never_load() -> None:
    assert "<img" not in render_markdown("![x](x.png)")


@pytest.mark.parametrize("nul", ("\x00", "&#0;", "&#x0;", "\\\x00"))
def test_a_nul_in_the_source_never_becomes_an_image(nul: str) -> None:
    """Cached HTML marks local images with NUL slots; the source cannot forge one."""
    html = render_markdown(f"a {nul}0{nul} b", image_url=lambda path: f"URL:{path}")
    assert "\x00" not in html and "<img" not in html and "md-missing-image" not in html


def test_markdown_image_lookups_are_bounded_per_view() -> None:
    from deerflow_web.services.files.markdown_render import MAX_IMAGES

    asked: list[str] = []
    source = " ".join(f"![p{n}](p{n}.png)" for n in range(MAX_IMAGES + 50)) + " ![again](p0.png)"
    html = render_markdown(source, image_url=lambda path: asked.append(path) or f"URL:{path}")
    assert len(asked) == MAX_IMAGES  # each path once, and no more than MAX_IMAGES of them
    assert html.count("<img") == MAX_IMAGES + 1  # p0.png twice
    assert '<span class="md-missing-image">p' + str(MAX_IMAGES) + "</span>" in html


def test_the_render_cache_keeps_to_its_size_least_recently_used_out_first() -> None:
    from deerflow_web.services.files.markdown_render import RenderCache
    from deerflow_web.services.files.markdown_render import _Rendered

    cache = RenderCache(max_bytes=3000)
    keys = (b"a", b"b", b"c", b"d", b"e")
    entries = {key: _Rendered(html=key.decode() * 600) for key in keys}  # 700 bytes each
    for key in keys[:4]:
        cache.put(key, entries[key])
    assert cache.get(b"a") is entries[b"a"]  # a is now the most recent
    cache.put(b"e", entries[b"e"])  # 5 x 700 > 3000: the least recent (b) goes
    assert cache.get(b"b") is None
    assert all(cache.get(key) is entries[key] for key in (b"a", b"c", b"d", b"e"))
    cache.put(b"huge", _Rendered(html="x" * 700))  # over a quarter of the cache: not kept
    assert cache.get(b"huge") is None and cache.get(b"e") is entries[b"e"]


# ---- Preview ------------------------------------------------------------------------


def preview_of(service: UploadService, name: str, body: bytes):
    save(service, "t1", **{name: body})
    artifact = resolve_artifact(
        service.folders(ThreadRef.single_user("t1")), f"/mnt/user-data/uploads/{name}"
    )
    return build_preview(artifact, user_data_path=f"uploads/{name}")


@pytest.mark.parametrize(
    ("name", "body", "kind"),
    (
        ("a.txt", b"hello", PreviewKind.TEXT),
        ("a.py", b"print(1)", PreviewKind.TEXT),
        ("a.md", b"# x", PreviewKind.MARKDOWN),
        ("a.json", b"{}", PreviewKind.JSON),
        ("a.csv", b"a,b\n1,2\n", PreviewKind.CSV),
        ("a.tsv", b"a\tb\n1\t2\n", PreviewKind.CSV),
        ("a.html", b"<p>x</p>", PreviewKind.SOURCE),
        ("a.svg", b"<svg/>", PreviewKind.SOURCE),
        ("a.png", b"\x89PNG\r\n\x1a\n", PreviewKind.IMAGE),
        ("a.tiff", b"II*\x00" + bytes(10), PreviewKind.DOWNLOAD),
        ("a.pdf", b"%PDF-1.4", PreviewKind.PDF),
        ("a.wav", b"RIFF\x00\x00\x00\x00WAVE", PreviewKind.AUDIO),
        ("a.webm", b"\x1a\x45\xdf\xa3", PreviewKind.VIDEO),
        ("a.bin", b"\x00\x01\x02", PreviewKind.DOWNLOAD),
        ("a.svgz", b"\x1f\x8b\x08\x00" + bytes(8), PreviewKind.DOWNLOAD),
        ("empty.txt", b"", PreviewKind.EMPTY),
        ("noext", b"plain words", PreviewKind.TEXT),
    ),
)
def test_preview_kind(service: UploadService, name: str, body: bytes, kind: PreviewKind) -> None:
    assert preview_of(service, name, body).kind is kind


def test_preview_reads_only_the_first_mib(service: UploadService) -> None:
    body = ("中" * (PREVIEW_BYTES // 3 + 10)).encode()  # a 3-byte character straddles the cut
    shown = preview_of(service, "big.txt", body)
    assert shown.truncated
    assert shown.shown_bytes == PREVIEW_BYTES
    assert shown.text == "中" * (PREVIEW_BYTES // 3)  # the cut character is dropped, not garbled


@pytest.mark.parametrize(
    ("body", "text", "encoding"),
    (
        ("\ufeffhello".encode(), "hello", "utf-8"),
        ("中文".encode("gb18030"), "中文", "gb18030"),
        (b"\xff\xfe\xfdabc", "\ufffd\ufffd\ufffdabc", "utf-8"),
    ),
)
def test_preview_decoding(service: UploadService, body: bytes, text: str, encoding: str) -> None:
    shown = preview_of(service, "t.txt", body)
    assert (shown.text, shown.encoding) == (text, encoding)


def test_csv_preview_stops_at_200_rows_and_drops_a_cut_line(service: UploadService) -> None:
    body = b"".join(b"%d,value\n" % i for i in range(300))
    shown = preview_of(service, "d.csv", body)
    assert len(shown.rows) == 200 and shown.more_rows
    big = b"n,v\n" + b"".join(b"%d,%s\n" % (i, b"x" * 100) for i in range(12000))
    shown = preview_of(service, "big.csv", big)
    assert shown.truncated and shown.more_rows


def test_csv_with_a_huge_field_falls_back_to_text(service: UploadService) -> None:
    body = b'a,b\n1,"' + b"x" * 200_000 + b'"\n'
    assert preview_of(service, "wide.csv", body).kind is PreviewKind.TEXT


def test_json_preview(service: UploadService) -> None:
    assert preview_of(service, "a.json", b'{"a":1}').text == '{\n  "a": 1\n}'
    broken = preview_of(service, "b.json", b"{nope")
    assert broken.invalid_json and broken.text == "{nope"


# ---- Browse ---------------------------------------------------------------------------


def test_list_area(service: UploadService) -> None:
    outputs = service.paths.area_dir(ThreadRef.single_user("t1"), "outputs")
    (outputs / "sub" / "deeper").mkdir(parents=True)
    (outputs / "b.txt").write_text("b")
    (outputs / "A.md").write_text("a")
    (outputs / "sub" / "c.csv").write_text("c")
    (outputs / ".upload-x.part").write_text("staging")
    (outputs / "link").symlink_to(outputs / "b.txt")
    listing = list_area(service.folders(ThreadRef.single_user("t1")), "outputs")
    assert [(e.name, e.is_dir) for e in listing.entries] == [
        ("sub", True),
        ("A.md", False),
        ("b.txt", False),
    ]
    sub = list_area(service.folders(ThreadRef.single_user("t1")), "outputs", "sub/")
    assert [e.user_data_path for e in sub.entries] == ["outputs/sub/deeper", "outputs/sub/c.csv"]
    assert sub.parent == "" and sub.breadcrumbs == [("sub", "sub")]
    deeper = list_area(service.folders(ThreadRef.single_user("t1")), "outputs", "sub/deeper")
    assert deeper.parent == "sub"


def test_list_area_errors(service: UploadService, tmp_path: Path) -> None:
    assert list_area(service.folders(ThreadRef.single_user("t1")), "workspace").entries == []
    outputs = service.paths.area_dir(ThreadRef.single_user("t1"), "outputs")
    outputs.mkdir(parents=True)
    (outputs / "f.txt").write_text("x")
    (outputs / "escape").symlink_to(tmp_path)
    with pytest.raises(PathTraversal):
        list_area(service.folders(ThreadRef.single_user("t1")), "outputs", "../uploads")
    with pytest.raises(PathTraversal):
        list_area(service.folders(ThreadRef.single_user("t1")), "outputs", "escape")
    with pytest.raises(ArtifactNotFound):
        list_area(service.folders(ThreadRef.single_user("t1")), "outputs", "missing")
    with pytest.raises(NotAFile):
        list_area(service.folders(ThreadRef.single_user("t1")), "outputs", "f.txt")


# ---- Threads and bulk delete ----------------------------------------------------------


def catalog_of(service: UploadService) -> ThreadCatalog:
    return ThreadCatalog(service, make_chat_preview_service(service))


def test_list_threads_newest_first_including_empty_ones(service: UploadService) -> None:
    save(service, "with-files", **{"a.txt": b"12", "b.txt": b"345"})
    catalog = catalog_of(service)
    catalog._clock = lambda: time.time() + 60  # newer than the upload, whatever the clock
    fresh, _created = catalog.create(SINGLE_USER, title="Fresh one")
    threads = list_threads(catalog, service.records, SINGLE_USER)
    assert [t.thread_id for t in threads] == [fresh.thread_id, "with-files"]
    assert (threads[1].file_count, threads[1].total_size, threads[1].title) == (2, 5, None)
    assert (threads[0].file_count, threads[0].total_size) == (0, 0)
    assert threads[0].title == "Fresh one"
    assert [
        t.thread_id for t in list_threads(catalog, service.records, SINGLE_USER, query="FRESH")
    ] == [fresh.thread_id]
    assert [
        t.thread_id for t in list_threads(catalog, service.records, SINGLE_USER, query="h-fil")
    ] == [
        "with-files"  # ids are searched too
    ]


def test_list_threads_hides_records_of_removed_folders(service: UploadService) -> None:
    save(service, "gone", **{"a.txt": b"1"})
    service.paths.delete_thread_dir(ThreadRef.single_user("gone"))
    assert list_threads(catalog_of(service), service.records, SINGLE_USER) == []


def test_bulk_delete_reports_each_name(service: UploadService) -> None:
    save(service, "t1", **{"a.txt": b"1", "b.txt": b"2"})
    result = delete_uploads(
        service, ThreadRef.single_user("t1"), ["a.txt", "a.txt", "nope.txt", "b.txt"]
    )
    assert result.deleted == ["a.txt", "b.txt"]
    assert [name for name, _ in result.failed] == ["nope.txt"]


# ---- Import boundaries (STYLE R2) ------------------------------------------------------
