"""SPEC 4.2: outlines and previews of Markdown companions."""

from __future__ import annotations

from pathlib import Path

import pytest

from deerflow_web.models import ThreadRef
from deerflow_web.services.prompt.outline import extract_outline
from deerflow_web.services.prompt.outline import outline_for_file


def _md(tmp_path: Path, text: str, name: str = "doc.md") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _titles(outline: list[dict]) -> list[str]:
    return [entry["title"] for entry in outline if "title" in entry]


def test_hash_headings_keep_their_line_numbers(tmp_path: Path) -> None:
    path = _md(tmp_path, "# PART I\n\ntext\n## ITEM 1. BUSINESS\n###NoSpace\n#\n")
    assert extract_outline(path) == [
        {"title": "PART I", "line": 1},
        {"title": "ITEM 1. BUSINESS", "line": 4},
        {"title": "NoSpace", "line": 5},
    ]


@pytest.mark.parametrize(
    ("line", "title"),
    [
        (
            "## **UNITED STATES** **SECURITIES AND EXCHANGE COMMISSION**",
            "UNITED STATES SECURITIES AND EXCHANGE COMMISSION",
        ),
        ("# **Bold title**", "Bold title"),
        ("   # Indented   ", "Indented"),
        ("**ITEM 1A. RISK FACTORS**", "ITEM 1A. RISK FACTORS"),
        ("**PART II**", "PART II"),
        ("**3.1** **Encoder and Decoder Stacks**", "3.1 Encoder and Decoder Stacks"),
        ("**A** **Appendix** **Extra**", "A Appendix Extra"),
    ],
)
def test_heading_styles(tmp_path: Path, line: str, title: str) -> None:
    assert _titles(extract_outline(_md(tmp_path, f"{line}\n"))) == [title]


@pytest.mark.parametrize(
    "line",
    [
        "**WASHINGTON, DC 20549**",
        "**SIGNATURES**",
        "**TESLA, INC.**",
        "**2023** **2022** **2021**",
        "Revenue grew **strongly** in **2023**.",
        "**Item 1. lower case keyword**",
    ],
)
def test_lines_that_are_not_headings(tmp_path: Path, line: str) -> None:
    assert extract_outline(_md(tmp_path, f"{line}\n")) == []


def test_fifty_headings_have_no_sentinel(tmp_path: Path) -> None:
    path = _md(tmp_path, "".join(f"# H{i}\n" for i in range(50)))
    outline = extract_outline(path)
    assert len(outline) == 50
    assert {"truncated": True} not in outline


def test_the_fifty_first_heading_becomes_the_sentinel(tmp_path: Path) -> None:
    path = _md(tmp_path, "".join(f"# H{i}\n" for i in range(55)))
    outline = extract_outline(path)
    assert len(outline) == 51
    assert outline[-1] == {"truncated": True}
    assert outline[-2] == {"title": "H49", "line": 50}


def test_a_decode_error_discards_the_whole_outline(tmp_path: Path) -> None:
    path = tmp_path / "bad.md"
    path.write_bytes(b"# Good heading\n# Bad \xff\xfe heading\n")
    assert extract_outline(path) == []


def test_missing_and_empty_files_give_no_outline(tmp_path: Path) -> None:
    assert extract_outline(tmp_path / "missing.md") == []
    assert extract_outline(_md(tmp_path, "")) == []


def test_outline_for_file_reads_the_sibling_companion(tmp_path: Path) -> None:
    _md(tmp_path, "# Heading 1\n## Heading 2\n", "report.md")
    outline, preview = outline_for_file(tmp_path / "report.pdf")
    assert _titles(outline) == ["Heading 1", "Heading 2"]
    assert preview == []


def test_outline_for_a_markdown_upload_reads_the_file_itself(tmp_path: Path) -> None:
    _md(tmp_path, "# Own\n", "notes.md")
    assert _titles(outline_for_file(tmp_path / "notes.md")[0]) == ["Own"]


def test_outline_for_a_file_without_suffix_reads_name_dot_md(tmp_path: Path) -> None:
    _md(tmp_path, "# Readme\n", "README.md")
    assert _titles(outline_for_file(tmp_path / "README")[0]) == ["Readme"]


def test_without_headings_the_first_five_lines_are_the_preview(tmp_path: Path) -> None:
    _md(tmp_path, "Annual Financial Report 2024\n\n  line 2  \nl3\nl4\nl5\nl6\n", "r.md")
    assert outline_for_file(tmp_path / "r.pdf") == (
        [],
        ["Annual Financial Report 2024", "line 2", "l3", "l4", "l5"],
    )


def test_no_companion_gives_nothing(tmp_path: Path) -> None:
    assert outline_for_file(tmp_path / "image.png") == ([], [])


def test_a_symlinked_companion_is_never_read(tmp_path: Path) -> None:
    outside = _md(tmp_path, "# Secret outside\n", "outside.md")
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    (uploads / "doc.md").symlink_to(outside)
    assert outline_for_file(uploads / "doc.pdf") == ([], [])


def test_an_explicit_companion_wins_over_the_sibling(tmp_path: Path) -> None:
    _md(tmp_path, "# Sibling\n", "a.md")
    _md(tmp_path, "# Converted\n", "a_1.md")
    outline, _ = outline_for_file(tmp_path / "a.pdf", tmp_path / "a_1.md")
    assert _titles(outline) == ["Converted"]


def test_upload_outline_follows_the_recorded_companion(tmp_path: Path) -> None:
    import io

    from deerflow_web.models import IncomingFile
    from deerflow_web.services.conversion.jobs import ConversionJobs
    from deerflow_web.services.prompt.outline import upload_outline
    from deerflow_web.services.uploads.service import make_upload_service
    from deerflow_web.settings import ConversionSettings

    service = make_upload_service(tmp_path)
    service.save_uploads(
        ThreadRef.single_user("t"),
        [
            IncomingFile("a.md", io.BytesIO(b"# Mine\n")),
            IncomingFile("a.pdf", io.BytesIO(b"%PDF-1.4")),
            IncomingFile("b.pdf", io.BytesIO(b"%PDF-1.4")),
        ],
    )

    def convert(source: Path, destination: Path, **_: object) -> None:
        destination.write_text("# Converted\n\n## Part Two\n")

    ConversionJobs(service, ConversionSettings(), converter=convert).convert(
        ThreadRef.single_user("t"), "a.pdf"
    )
    records = service.list_uploads(ThreadRef.single_user("t"))
    by_name = {r.filename: r for r in records}
    folder = service.uploads_dir(ThreadRef.single_user("t"))
    assert upload_outline(folder, by_name["a.pdf"], records) == (
        "a_1.md",
        [{"title": "Converted", "line": 1}, {"title": "Part Two", "line": 3}],
    )
    assert upload_outline(folder, by_name["a.md"], records) == (
        "a.md",
        [{"title": "Mine", "line": 1}],
    )
    assert upload_outline(folder, by_name["b.pdf"], records) == (None, [])
