"""A real `create_agent` loop reads and searches scans, screenshots and photos by OCR, and
cites PDF pages.

Only the chat model is faked. The files are made here (a scanned PDF with no text layer, a
PNG screenshot, a JPEG photo of text, a PDF mixing text and scanned pages); they are read
through the real conversion jobs and isolated worker, on demand, as the model asks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage
from langchain_core.messages import HumanMessage

from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from tests.support.agent_helpers import RecordingToolModel
from tests.support.agent_helpers import documents_agent
from tests.support.agent_helpers import replies_from
from tests.support.agent_helpers import save_files
from tests.support.agent_helpers import tool_call
from tests.support.agent_helpers import tool_messages
from tests.support.images import character_accuracy
from tests.support.images import make_mixed_pdf
from tests.support.images import make_photo_jpeg
from tests.support.images import make_scanned_pdf
from tests.support.images import make_text_png

# Nothing here reads the mode: the tools, middlewares and upload service are given their
# data dir, so they serve the single-user layout in either pass (agent/runtime.py's
# `auth_required`), and every thread is named with its owner. The single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes

UPLOADS = "/mnt/user-data/uploads"
NAMES = ("scan.pdf", "shot.png", "photo.jpg", "mixed.pdf")


@pytest.fixture
def service(base_dir: Path) -> UploadService:
    return make_upload_service(base_dir)


def _line(text: str, pattern: str) -> re.Match[str]:
    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None, (pattern, text)
    return found


def test_the_agent_reads_and_greps_images_and_scans_with_pdf_pages(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    made = tmp_path / "made"
    made.mkdir()
    files = (
        make_scanned_pdf(made / "scan.pdf"),
        make_text_png(made / "shot.png"),
        make_photo_jpeg(made / "photo.jpg"),
        make_mixed_pdf(made / "mixed.pdf"),
    )
    save_files(service, *files)
    jobs = ConversionJobs(service, ConversionSettings(timeout_seconds=240, workers=2))
    closing_line: dict[str, int] = {}

    def read_closing_page(messages: list) -> AIMessage:
        mixed = tool_messages(messages)["r-mixed.pdf"].content
        closing_line["n"] = int(_line(mixed, r"^\s+(\d+) p\.3\tTyped closing page$")[1])
        line = closing_line["n"]
        return AIMessage(
            "",
            tool_calls=[
                tool_call("read_file", "r-part", path=f"{UPLOADS}/mixed.pdf", start_line=line)
            ],
        )

    model = RecordingToolModel(messages=iter(()))
    model.messages = replies_from(
        model,
        [
            lambda _: AIMessage(
                "",
                tool_calls=[
                    tool_call("read_file", f"r-{name}", path=f"{UPLOADS}/{name}") for name in NAMES
                ],
            ),
            lambda _: AIMessage(
                "",
                tool_calls=[
                    tool_call("grep", "g-road", pattern="Harbour Road", path=UPLOADS),
                    tool_call("grep", "g-total", pattern=r"4,210\.50", path=UPLOADS),
                    tool_call("grep", "g-chinese", pattern="发票号码", path=UPLOADS),
                ],
            ),
            read_closing_page,
            lambda _: AIMessage("report.pdf, page 3"),
        ],
    )
    agent = documents_agent(base_dir, service, model, conversion_jobs=jobs, read_wait_seconds=230.0)
    try:
        agent.invoke(
            {"messages": [HumanMessage("read my scans", id="h1")]},
            config={"configurable": {"thread_id": "t1"}},
            context={"thread_id": "t1"},
        )
    finally:
        jobs.stop_keeper()

    reads = tool_messages(model.received[1])
    assert all(reads[f"r-{name}"].status == "success" for name in NAMES), reads

    # The scanned PDF: every line carries its page; the markers say it was read by OCR.
    scan = reads["r-scan.pdf"].content
    assert scan.startswith(f"[{UPLOADS}/scan.pdf as Markdown text, lines 1-")
    assert "p.N / s.N before a line: the page / slide it is on]" in scan.splitlines()[0]
    _line(scan, r"^\s+1 p\.1\t<!-- page 1 of 2: OCR, mean confidence (0\.9\d|1\.00) -->$")
    _line(scan, r"^\s+\d+ p\.1\tScanned contract page one$")
    _line(scan, r"^\s+\d+ p\.2\tSecond scanned page$")

    # The screenshot and the photo: their size in pixels, then their text (no pages).
    shot = reads["r-shot.png"].content
    _line(shot, r"^\s+1\t<!-- image: 1400 x \d+ pixels \(PNG\); OCR, mean confidence")
    assert "Invoice 2026-11 total 4,210.50 EUR" in shot and "上传文件的内容识别测试" in shot
    assert " p." not in shot
    photo = reads["r-photo.jpg"].content
    _line(photo, r"^\s+1\t<!-- image: \d+ x \d+ pixels \(JPEG\); OCR, mean confidence")
    body = "\n".join(line.split("\t", 1)[1] for line in photo.splitlines()[2:])
    right, total = character_accuracy(
        "Quarterly revenue grew by 12 percent\n发票号码 2026 年 11 月", body
    )
    assert right / total >= 0.9, body

    # The mixed PDF: text layer and OCR side by side, each on its page.
    mixed = reads["r-mixed.pdf"].content
    _line(mixed, r"^\s+\d+ p\.1\t<!-- page 1 of 3: text layer -->$")
    _line(mixed, r"^\s+\d+ p\.2\t<!-- page 2 of 3: OCR, mean confidence")
    _line(mixed, r"^\s+\d+ p\.2\tScanned signature page$")
    _line(mixed, r"^\s+\d+ p\.3\tTyped closing page$")

    # grep finds OCR text, with the page of each PDF line.
    greps = tool_messages(model.received[2])
    road = json.loads(greps["g-road"].content)["matches"]
    assert {(m["path"].rsplit("/", 1)[1], m.get("page")) for m in road} == {
        ("scan.pdf", 1),
        ("mixed.pdf", 2),
    }
    total_matches = json.loads(greps["g-total"].content)["matches"]
    assert [(m["path"], "page" in m) for m in total_matches] == [(f"{UPLOADS}/shot.png", False)]
    chinese = json.loads(greps["g-chinese"].content)["matches"]
    assert [m["path"] for m in chinese] == [f"{UPLOADS}/photo.jpg"]

    # A read that starts in the middle still knows the page it is on.
    part = tool_messages(model.received[3])["r-part"].content
    line = closing_line["n"]
    assert part.splitlines()[1] == f"{line:>6} p.3\tTyped closing page"

    # The conversions are recorded like the Convert button's: companions next to each file.
    companions = {
        r.converted_from: r.filename for r in service.list_uploads(ThreadRef.single_user("t1"))
    }
    assert {name: companions.get(name) for name in NAMES} == {
        "scan.pdf": "scan.md",
        "shot.png": "shot.md",
        "photo.jpg": "photo.md",
        "mixed.pdf": "mixed.md",
    }


def _tool(base_dir: Path, name: str):
    from deerflow_web.agent import make_file_tools

    return next(tool for tool in make_file_tools(base_dir=base_dir) if tool.name == name)


def test_slides_of_a_presentation_are_given_with_each_line(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    from tests.support.agent_helpers import make_runtime
    from tests.support.documents import make_pptx

    made = tmp_path / "made"
    made.mkdir()
    save_files(service, make_pptx(made / "deck.pptx"))
    runtime = make_runtime({"thread_id": "t1"})

    text = _tool(base_dir, "read_file").invoke({"path": f"{UPLOADS}/deck.pptx", "runtime": runtime})
    found = _tool(base_dir, "grep").invoke(
        {"pattern": "Open two new offices", "path": UPLOADS, "runtime": runtime}
    )

    _line(text, r"^\s+\d+ s\.1\t<!-- Slide number: 1 -->$")
    _line(text, r"^\s+\d+ s\.2\t.*Next Steps")
    assert [(m["path"], m["slide"]) for m in found["matches"]] == [(f"{UPLOADS}/deck.pptx", 2)]


def test_markers_in_a_markdown_file_someone_wrote_are_only_text(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    from tests.support.agent_helpers import make_runtime

    made = tmp_path / "made"
    made.mkdir()
    notes = made / "notes.md"
    notes.write_text("<!-- page 7 of 9: text layer -->\nMy own notes\n", encoding="utf-8")
    save_files(service, notes)
    runtime = make_runtime({"thread_id": "t1"})

    text = _tool(base_dir, "read_file").invoke({"path": f"{UPLOADS}/notes.md", "runtime": runtime})
    found = _tool(base_dir, "grep").invoke(
        {"pattern": "own notes", "path": UPLOADS, "runtime": runtime}
    )

    assert text == (
        f"[{UPLOADS}/notes.md, lines 1-2 of 2]\n"
        "     1\t<!-- page 7 of 9: text layer -->\n"
        "     2\tMy own notes"
    )
    assert "page" not in found["matches"][0]


def test_an_image_outside_uploads_stays_a_binary_file(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    """Only uploads are read through conversion: a chart the agent wrote is not OCR'd, and
    a search over the whole user-data neither converts nor lists it."""
    from tests.helpers import user_data_dir
    from tests.support.agent_helpers import make_runtime

    outputs = user_data_dir(base_dir, "t1", None) / "outputs"
    outputs.mkdir(parents=True)
    make_text_png(outputs / "chart.png")
    (outputs / "notes.txt").write_text("Invoice 2026-11 summary\n", encoding="utf-8")
    runtime = make_runtime({"thread_id": "t1"})

    text = _tool(base_dir, "read_file").invoke(
        {"path": "/mnt/user-data/outputs/chart.png", "runtime": runtime}
    )
    found = _tool(base_dir, "grep").invoke(
        {"pattern": "Invoice", "path": "/mnt/user-data", "runtime": runtime}
    )

    assert "chart.png is a binary file; read_file shows text only" in text
    assert [m["path"] for m in found["matches"]] == ["/mnt/user-data/outputs/notes.txt"]
    assert "skipped" not in found
    assert not (outputs / "chart.md").exists()


def test_a_fax_tiff_is_read_and_searched_with_the_page_of_each_line(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    from tests.support.agent_helpers import make_runtime
    from tests.support.images import make_fax_tiff

    made = tmp_path / "made"
    made.mkdir()
    save_files(service, make_fax_tiff(made / "fax.tif"))
    runtime = make_runtime({"thread_id": "t1"})

    text = _tool(base_dir, "read_file").invoke({"path": f"{UPLOADS}/fax.tif", "runtime": runtime})
    found = _tool(base_dir, "grep").invoke(
        {"pattern": "30 November", "path": UPLOADS, "runtime": runtime}
    )

    _line(text, r"^\s+1\t<!-- image: 3 pages of 1240 x 1753 pixels \(TIFF\); read by OCR page")
    _line(text, r"^\s+\d+ p\.1\t<!-- page 1 of 3: OCR, mean confidence (0\.9\d|1\.00) -->$")
    _line(text, r"^\s+\d+ p\.1\tFax cover sheet for the harbour office$")
    _line(text, r"^\s+\d+ p\.3\tThird fax page signed on 30 November$")
    assert [(m["path"], m["page"]) for m in found["matches"]] == [(f"{UPLOADS}/fax.tif", 3)]
