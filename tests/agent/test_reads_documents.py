"""A real `create_agent` loop reads uploaded documents that nobody converted (SPEC D17).

Only the chat model is faked. The tools are built from the base dir alone, as an agent
setup outside the web app builds them; conversions run in the real isolated worker on
documents generated here, and are recorded like the Convert button's.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.messages import BaseMessage
from langchain_core.messages import HumanMessage

from deerflow_web.agent import UploadTools
from deerflow_web.agent import make_file_tools
from deerflow_web.models import ConversionState
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from tests.helpers import uploads_dir
from tests.support.agent_helpers import RecordingToolModel
from tests.support.agent_helpers import documents_agent
from tests.support.agent_helpers import human_with_files
from tests.support.agent_helpers import make_runtime
from tests.support.agent_helpers import replies_from
from tests.support.agent_helpers import save_files
from tests.support.agent_helpers import tool_call
from tests.support.agent_helpers import tool_messages
from tests.support.documents import make_docx
from tests.support.documents import make_encrypted_pdf
from tests.support.documents import make_fake_legacy_doc
from tests.support.documents import make_pdf

# Nothing here reads the mode: the tools, middlewares and upload service are given their
# data dir, so they serve the single-user layout in either pass (agent/runtime.py's
# `auth_required`), and every thread is named with its owner. The single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes

UPLOADS = "/mnt/user-data/uploads"
PDF_LINES = ("Hello PDF world", "Revenue grew in every region.")
DOCX_WORD = "Zanzibarite"  # only inside the Word file


@pytest.fixture
def service(base_dir: Path) -> UploadService:
    return make_upload_service(base_dir)


def test_the_agent_reads_and_searches_unconverted_documents(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    made = tmp_path / "made"
    made.mkdir()
    pdf = make_pdf(made / "letter.pdf", lines=PDF_LINES)
    docx = make_docx(
        made / "report.docx",
        title="Quarterly Report",
        paragraphs=(f"The {DOCX_WORD} mine reopened.",),
    )
    save_files(service, pdf, docx)
    folder = uploads_dir(base_dir, "t1", None)
    assert sorted(p.name for p in folder.iterdir()) == ["letter.pdf", "report.docx"]

    outline_line: dict[str, int] = {}

    def read_at_outline(messages: list[BaseMessage]) -> AIMessage:
        human = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        found = re.search(r"L(\d+): Summary", human.text)
        assert found is not None, human.text
        outline_line["Summary"] = int(found.group(1))
        line = outline_line["Summary"]
        return AIMessage(
            "",
            tool_calls=[
                tool_call(
                    "read_file", "r3", path=f"{UPLOADS}/report.docx", start_line=line, end_line=line
                )
            ],
        )

    model = RecordingToolModel(messages=iter(()))
    model.messages = replies_from(
        model,
        [
            lambda _: AIMessage(
                "",
                tool_calls=[
                    tool_call("read_file", "r1", path=f"{UPLOADS}/letter.pdf"),
                    tool_call("grep", "g1", pattern=DOCX_WORD),
                ],
            ),
            lambda _: AIMessage(
                "", tool_calls=[tool_call("read_file", "r2", path=f"{UPLOADS}/letter.pdf")]
            ),
            lambda _: AIMessage("turn one done"),
            read_at_outline,
            lambda _: AIMessage("turn two done"),
        ],
    )
    # Two real conversions at once on a busy machine can pass the default 20 s: this test
    # is about what the tools read, so they wait as long as a conversion can take.
    agent = documents_agent(base_dir, service, model, read_wait_seconds=230.0)
    context = {"thread_id": "t1"}
    config = {"configurable": {"thread_id": "t1"}}

    files = [
        {"filename": "letter.pdf", "size": pdf.stat().st_size},
        {"filename": "report.docx", "size": docx.stat().st_size},
    ]
    agent.invoke(
        {"messages": [human_with_files("read them", *files, id="h1")]},
        config=config,
        context=context,
    )

    # The PDF's text, numbered, under the path the block printed.
    first = tool_messages(model.received[1])
    text = first["r1"].content
    assert first["r1"].status == "success"
    assert text.startswith(f"[{UPLOADS}/letter.pdf as Markdown text, lines 1-")
    assert all(line in text for line in PDF_LINES)
    assert "%PDF" not in text and " obj" not in text

    # grep found the word only inside the Word file, reported under the document's path.
    found = first["g1"].content
    assert f'"path": "{UPLOADS}/report.docx"' in found
    assert f"The {DOCX_WORD} mine reopened." in found
    assert "report.md" not in found and "skipped" not in found

    # Both conversions are recorded: the file manager lists the companions.
    records = {r.filename: r for r in service.list_uploads(ThreadRef.single_user("t1"))}
    assert records["letter.md"].converted_from == "letter.pdf"
    assert records["report.md"].converted_from == "report.docx"
    assert records["letter.pdf"].conversion_state is ConversionState.DONE
    companion = folder / "letter.md"
    before = (
        companion.stat().st_ino,
        companion.stat().st_mtime_ns,
        records["letter.md"].uploaded_at,
    )

    # A second read reuses the companion: no new conversion.
    second = tool_messages(model.received[2])["r2"].content
    assert second == text
    records = {r.filename: r for r in service.list_uploads(ThreadRef.single_user("t1"))}
    assert (
        companion.stat().st_ino,
        companion.stat().st_mtime_ns,
        records["letter.md"].uploaded_at,
    ) == before

    # Turn two: the block's outline for the Word file, and read_file at that line.
    agent.invoke(
        {"messages": [human_with_files("the summary?", files[1], id="h2")]},
        config=config,
        context=context,
    )
    line = outline_line["Summary"]
    section = tool_messages(model.received[-1])["r3"].content
    assert (
        section
        == f"[{UPLOADS}/report.docx as Markdown text, lines {line}-{line} of "
        + section.split(" of ")[1]
    )
    assert section.endswith(f"{line:>6}\t## Summary")


def test_a_replaced_document_is_converted_again(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    made = tmp_path / "made"
    made.mkdir()
    save_files(service, make_pdf(made / "letter.pdf", lines=("First version",)))
    read = UploadTools(base_dir=base_dir).by_name()["read_file"]
    runtime = make_runtime({"thread_id": "t1"})

    assert "First version" in read.invoke({"path": f"{UPLOADS}/letter.pdf", "runtime": runtime})
    save_files(service, make_pdf(made / "letter.pdf", lines=("Second version",)))
    again = read.invoke({"path": f"{UPLOADS}/letter.pdf", "runtime": runtime})

    assert "Second version" in again and "First version" not in again
    companions = [
        r
        for r in service.list_uploads(ThreadRef.single_user("t1"))
        if r.converted_from == "letter.pdf"
    ]
    assert [c.filename for c in companions] == ["letter.md"]


def _jobs(service: UploadService) -> ConversionJobs:
    return ConversionJobs(service, ConversionSettings(timeout_seconds=120))


def test_a_slow_conversion_says_call_again_and_the_next_call_reads(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    made = tmp_path / "made"
    made.mkdir()
    save_files(service, make_pdf(made / "letter.pdf", lines=PDF_LINES))
    jobs = _jobs(service)
    read = UploadTools(base_dir=base_dir, conversion_jobs=jobs, read_wait_seconds=0.01).by_name()[
        "read_file"
    ]
    runtime = make_runtime({"thread_id": "t1"})
    args = {"path": f"{UPLOADS}/letter.pdf", "runtime": runtime}

    first = read.invoke(args)
    assert first == (
        f"{UPLOADS}/letter.pdf is still converting to text; call read_file again in a few "
        "seconds to read it."
    )
    deadline = time.monotonic() + 120
    while (
        service.get_upload(ThreadRef.single_user("t1"), "letter.pdf").conversion_state
        is not ConversionState.DONE
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)

    assert "Hello PDF world" in read.invoke(args)
    assert jobs.started_jobs == 1  # the call after the wait read the companion


def test_grep_names_a_document_that_is_still_converting(
    base_dir: Path, service: UploadService, tmp_path: Path
) -> None:
    made = tmp_path / "made"
    made.mkdir()
    save_files(service, make_pdf(made / "letter.pdf"))
    (uploads_dir(base_dir, "t1", None) / "notes.txt").write_text("Hello notes\n", encoding="utf-8")
    tools = {t.name: t for t in make_file_tools(base_dir=base_dir, read_wait_seconds=0.01)}

    result = tools["grep"].invoke(
        {"pattern": "Hello", "runtime": make_runtime({"thread_id": "t1"})}
    )

    assert result["matches"] == [{"path": f"{UPLOADS}/notes.txt", "line": 1, "text": "Hello notes"}]
    assert result["skipped"] == [
        {
            "path": f"{UPLOADS}/letter.pdf",
            "reason": f"{UPLOADS}/letter.pdf is still converting to text; call grep again in a "
            "few seconds to read it.",
        }
    ]


@pytest.mark.parametrize(
    ("name", "make", "reason"),
    (
        (
            "old.doc",
            make_fake_legacy_doc,
            "old.doc is a legacy Word (.doc) file, which is not supported",
        ),
        ("locked.pdf", make_encrypted_pdf, "locked.pdf is password-protected"),
        ("broken.pdf", lambda p: (p.write_bytes(b"%PDF-1.4 garbage"), p)[1], "broken.pdf is "),
    ),
)
def test_a_document_that_cannot_be_read_gives_the_reason(
    base_dir: Path, service: UploadService, tmp_path: Path, name: str, make: Any, reason: str
) -> None:
    made = tmp_path / "made"
    made.mkdir()
    save_files(service, make(made / name))
    read = UploadTools(base_dir=base_dir).by_name()["read_file"]

    message = read.invoke(
        {"path": f"{UPLOADS}/{name}", "runtime": make_runtime({"thread_id": "t1"})}
    )

    assert message.startswith(f"Cannot read {UPLOADS}/{name}: {reason}")
    assert [p.name for p in uploads_dir(base_dir, "t1", None).iterdir()] == [name]  # no .md
    assert (
        service.get_upload(ThreadRef.single_user("t1"), name).conversion_state
        is ConversionState.FAILED
    )


def test_a_document_under_a_hiding_name_is_not_read_as_text(base_dir: Path, tmp_path: Path) -> None:
    folder = uploads_dir(base_dir, "t1", None)
    folder.mkdir(parents=True)
    make_pdf(folder / "scan")  # a PDF without its extension: mostly ASCII bytes
    read = UploadTools(base_dir=base_dir).by_name()["read_file"]

    message = read.invoke({"path": f"{UPLOADS}/scan", "runtime": make_runtime({"thread_id": "t1"})})

    assert message.startswith(f"{UPLOADS}/scan holds a document (.pdf) under a name")
    assert "%PDF" not in message
