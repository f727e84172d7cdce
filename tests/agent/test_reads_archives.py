"""A real `create_agent` loop reads the members of an uploaded zip, then its extraction.

Only the chat model is faked. The zip holds a Word file and a PNG; the block announces the
archive with its member count, `read_file` and `grep` reach the members by virtual path
(`/mnt/user-data/uploads/reports.zip/q3/summary.docx`), converted in the real isolated
worker; after an extraction the same files are read in `workspace/reports/`.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.messages import BaseMessage
from langchain_core.messages import HumanMessage
from PIL import Image
from PIL import ImageDraw
from PIL import ImageFont

from deerflow_web.models import CONVERTIBLE_EXTENSIONS
from deerflow_web.models import IncomingFile
from deerflow_web.models import ThreadRef
from deerflow_web.services.archives.extract import ArchiveExtractor
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ArchiveLimits
from tests.support.agent_helpers import RecordingToolModel
from tests.support.agent_helpers import documents_agent
from tests.support.agent_helpers import human_with_files
from tests.support.agent_helpers import replies_from
from tests.support.agent_helpers import tool_call
from tests.support.agent_helpers import tool_messages
from tests.support.documents import make_docx

# Nothing here reads the mode: the tools, middlewares and upload service are given their
# data dir, so they serve the single-user layout in either pass (agent/runtime.py's
# `auth_required`), and every thread is named with its owner. The single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes

UPLOADS = "/mnt/user-data/uploads"
T1 = ThreadRef.single_user("t1")
WORKSPACE = "/mnt/user-data/workspace"
DOCX_WORD = "Zanzibarite"
PNG_WORDS = "Invoice total 4210 EUR"
IMAGES_CONVERT = ".png" in CONVERTIBLE_EXTENSIONS  # the converter reads images (OCR)


def _png(text: str) -> bytes:
    image = Image.new("RGB", (1200, 200), "white")
    ImageDraw.Draw(image).text((40, 60), text, fill="black", font=ImageFont.load_default(64))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _zip(tmp_path: Path) -> bytes:
    docx = make_docx(
        tmp_path / "summary.docx", title="Q3 Summary", paragraphs=(f"The {DOCX_WORD} mine.",)
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(docx, "q3/summary.docx")
        archive.writestr("q3/scan.png", _png(PNG_WORDS))
    return buffer.getvalue()


@pytest.fixture
def service(base_dir: Path) -> UploadService:
    return make_upload_service(base_dir)


def test_the_agent_reads_and_searches_zip_members_then_their_extraction(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    data = _zip(tmp_path)
    service.save_uploads(T1, [IncomingFile("reports.zip", io.BytesIO(data))])

    def after_extraction(_: list[BaseMessage]) -> AIMessage:
        ArchiveExtractor(service, ArchiveLimits()).extract(T1, "reports.zip")
        return AIMessage(
            "",
            tool_calls=[
                tool_call("read_file", "e1", path=f"{WORKSPACE}/reports/q3/summary.docx"),
                tool_call("grep", "e2", pattern=DOCX_WORD, path=WORKSPACE),
            ],
        )

    model = RecordingToolModel(messages=iter(()))
    model.messages = replies_from(
        model,
        [
            lambda _: AIMessage(
                "",
                tool_calls=[
                    tool_call("read_file", "r1", path=f"{UPLOADS}/reports.zip/q3/summary.docx"),
                    tool_call("grep", "g1", pattern=DOCX_WORD),
                    tool_call("glob", "l1", pattern="**/*.png", path=UPLOADS),
                    tool_call("read_file", "r2", path=f"{UPLOADS}/reports.zip/q3/scan.png"),
                ],
            ),
            after_extraction,
            lambda _: AIMessage("done"),
        ],
    )
    agent = documents_agent(base_dir, service, model)
    agent.invoke(
        {
            "messages": [
                human_with_files(
                    "what is in it?", {"filename": "reports.zip", "size": len(data)}, id="h1"
                )
            ]
        },
        config={"configurable": {"thread_id": "t1"}},
        context={"thread_id": "t1"},
    )

    human = next(m for m in model.received[0] if isinstance(m, HumanMessage))
    assert f"  Path: {UPLOADS}/reports.zip\n  Archive of 2 file(s)" in human.text

    first = tool_messages(model.received[1])
    read = first["r1"].content
    assert read.startswith(f"[{UPLOADS}/reports.zip/q3/summary.docx as Markdown text, lines 1-")
    assert "# Q3 Summary" in read and f"The {DOCX_WORD} mine." in read
    found = first["g1"].content
    assert f'"path": "{UPLOADS}/reports.zip/q3/summary.docx"' in found
    assert f"The {DOCX_WORD} mine." in found
    assert f"{UPLOADS}/reports.zip/q3/scan.png" in first["l1"].content
    image = first["r2"]
    if IMAGES_CONVERT:
        assert image.status == "success"
        assert "4210" in image.content and "Invoice" in image.content
    else:
        assert image.status == "error"
        assert "is a binary file" in image.content

    second = tool_messages(model.received[2])
    extracted = second["e1"].content
    assert extracted.startswith(f"[{WORKSPACE}/reports/q3/summary.docx as Markdown text")
    assert f"The {DOCX_WORD} mine." in extracted
    assert f'"path": "{WORKSPACE}/reports/q3/summary.docx"' in second["e2"].content


def test_a_refused_archive_is_named_in_the_block(base_dir: Path, service: UploadService) -> None:
    from tests.support.archives import make_overlapping_zip

    service.save_uploads(T1, [IncomingFile("bomb.zip", io.BytesIO(make_overlapping_zip()))])
    model = RecordingToolModel(messages=iter([AIMessage("ok")]))
    agent = documents_agent(base_dir, service, model)
    files: Any = {"filename": "bomb.zip", "size": 10}
    agent.invoke(
        {"messages": [human_with_files("look", files, id="h1")]},
        config={"configurable": {"thread_id": "t1"}},
        context={"thread_id": "t1"},
    )
    human = next(m for m in model.received[0] if isinstance(m, HumanMessage))
    assert (
        "  Archive refused, its members cannot be read: members 'a.txt' and 'b.txt' overlap "
        "(overlapping entries, a zip bomb)"
    ) in human.text
