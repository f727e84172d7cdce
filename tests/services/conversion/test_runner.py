"""The isolated document → Markdown converter, against real generated documents."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deerflow_web.errors import ConversionError
from deerflow_web.errors import ConversionTimedOut
from deerflow_web.errors import NotConvertible
from deerflow_web.services.conversion.runner import MarkdownConversion
from deerflow_web.services.conversion.runner import convert_to_markdown
from deerflow_web.services.conversion.runner import process_start_time
from deerflow_web.services.conversion.runner import sweep_stale_work_folders
from tests.helpers import wait_until
from tests.support.documents import make_blank_docx
from tests.support.documents import make_corrupt_pdf
from tests.support.documents import make_docx
from tests.support.documents import make_empty_file
from tests.support.documents import make_encrypted_pdf
from tests.support.documents import make_fake_legacy_doc
from tests.support.documents import make_pdf
from tests.support.documents import make_pptx
from tests.support.documents import make_random_bytes
from tests.support.documents import make_xlsx

# Nothing here reads the mode (no app, no account): the single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    """A folder holding only what a test puts there, so leftovers are easy to see."""
    folder = tmp_path / "docs"
    folder.mkdir()
    return folder


def convert(
    source: Path,
    *,
    timeout_seconds: float = 60.0,
    memory_limit_mb: int = 2048,
    **options: Any,
) -> MarkdownConversion:
    """Convert next to the source, as the upload service does with companions."""
    return convert_to_markdown(
        source,
        source.with_suffix(".md"),
        timeout_seconds=timeout_seconds,
        memory_limit_mb=memory_limit_mb,
        **options,
    )


def stand_in(code: str) -> list[str]:
    """A worker command that runs `code` with the real worker's arguments in sys.argv."""
    return [sys.executable, "-c", code]


def is_running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for its reaper counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] not in {"Z", "X"}


def test_docx_keeps_headings_paragraphs_and_table(docs: Path) -> None:
    source = make_docx(docs / "report.docx")

    result = convert(source)

    markdown = (docs / "report.md").read_text(encoding="utf-8")
    lines = markdown.splitlines()
    assert "# Quarterly Report" in lines
    assert "## Summary" in lines
    assert "Revenue grew in every region." in lines
    assert "| Region | Revenue |" in lines
    assert "| North | 1200 |" in lines
    assert result.destination == docs / "report.md"
    assert result.characters == len(markdown)
    assert markdown.endswith("\n")


def test_xlsx_keeps_sheet_and_table(docs: Path) -> None:
    convert(make_xlsx(docs / "sales.xlsx"))

    lines = (docs / "sales.md").read_text(encoding="utf-8").splitlines()
    assert "## Sales" in lines
    assert "| Region | Revenue |" in lines
    assert "| South | 950 |" in lines


def test_pptx_keeps_slide_titles_and_text(docs: Path) -> None:
    convert(make_pptx(docs / "deck.pptx"))

    markdown = (docs / "deck.md").read_text(encoding="utf-8")
    assert "# Quarterly Review" in markdown
    assert "Revenue grew in every region" in markdown
    assert "# Next Steps" in markdown


def test_pdf_keeps_text(docs: Path) -> None:
    convert(make_pdf(docs / "letter.pdf"))

    markdown = (docs / "letter.md").read_text(encoding="utf-8")
    assert "Hello PDF world" in markdown
    assert "Revenue grew in every region." in markdown


def test_unicode_round_trips_as_utf8(docs: Path) -> None:
    source = make_docx(docs / "报告.docx", title="中文报告", paragraphs=("收入增长 ✓",))

    convert(source)

    data = (docs / "报告.md").read_bytes()
    assert "# 中文报告\n".encode() in data
    assert "收入增长 ✓".encode() in data


def test_success_replaces_destination_atomically_with_mode_0600(docs: Path) -> None:
    source = make_docx(docs / "report.docx")
    destination = docs / "report.md"
    destination.write_text("old", encoding="utf-8")

    convert(source)

    assert "# Quarterly Report" in destination.read_text(encoding="utf-8")
    assert stat.S_IMODE(destination.stat().st_mode) == 0o600
    assert sorted(p.name for p in docs.iterdir()) == ["report.docx", "report.md"]


FailureCase = tuple[str, Callable[[Path], Path], str]

FAILURES: tuple[FailureCase, ...] = (
    ("locked.pdf", make_encrypted_pdf, "locked.pdf is password-protected"),
    ("broken.pdf", make_corrupt_pdf, "broken.pdf is corrupt or not a valid PDF (.pdf) file"),
    ("noise.docx", make_random_bytes, "noise.docx is corrupt or not a valid Word (.docx) file"),
    ("empty.docx", make_empty_file, "empty.docx is empty (0 bytes)"),
    ("old.doc", make_fake_legacy_doc, "old.doc is a legacy Word (.doc) file, which is not "),
    ("deck.ppt", make_fake_legacy_doc, "deck.ppt is a legacy PowerPoint (.ppt) file, which "),
    ("locked.docx", make_fake_legacy_doc, "locked.docx is password-protected (or is an old "),
    ("blank.docx", make_blank_docx, "No text could be extracted from blank.docx"),
)


@pytest.mark.parametrize(("name", "make", "reason"), FAILURES, ids=[case[0] for case in FAILURES])
def test_failure_has_clear_reason_and_leaves_nothing(
    docs: Path, name: str, make: Callable[[Path], Path], reason: str
) -> None:
    source = make(docs / name)
    before = source.read_bytes()

    with pytest.raises(ConversionError) as caught:
        convert(source)

    assert str(caught.value).startswith(reason)
    assert type(caught.value) is ConversionError
    assert [p.name for p in docs.iterdir()] == [name]  # no .md, no staging file
    assert source.read_bytes() == before


def test_legacy_doc_says_what_to_do(docs: Path) -> None:
    with pytest.raises(ConversionError, match=r"save it as \.docx"):
        convert(make_fake_legacy_doc(docs / "old.doc"))


def test_failure_keeps_an_existing_destination(docs: Path) -> None:
    source = make_corrupt_pdf(docs / "report.pdf")
    destination = docs / "report.md"
    destination.write_text("the user's own notes", encoding="utf-8")

    with pytest.raises(ConversionError):
        convert(source)

    assert destination.read_text(encoding="utf-8") == "the user's own notes"
    assert sorted(p.name for p in docs.iterdir()) == ["report.md", "report.pdf"]


@pytest.mark.parametrize("name", ("notes.txt", "page.html", "README"))
def test_not_convertible_extension_is_refused_before_any_work(docs: Path, name: str) -> None:
    source = docs / name
    source.write_text("text", encoding="utf-8")

    with pytest.raises(NotConvertible, match=name):
        convert_to_markdown(source, docs / "out.md", timeout_seconds=60, memory_limit_mb=2048)

    assert [p.name for p in docs.iterdir()] == [name]


def test_missing_source_is_a_conversion_error(docs: Path) -> None:
    with pytest.raises(ConversionError, match="ghost.pdf does not exist"):
        convert(docs / "ghost.pdf")


def test_symlinked_source_is_never_read(tmp_path: Path, docs: Path) -> None:
    target = make_docx(tmp_path / "elsewhere.docx")
    (docs / "link.docx").symlink_to(target)

    with pytest.raises(ConversionError, match="link.docx is not a regular file"):
        convert(docs / "link.docx")

    assert [p.name for p in docs.iterdir()] == ["link.docx"]


def test_time_limit_kills_the_worker_and_its_children(docs: Path) -> None:
    source = make_pdf(docs / "slow.pdf")
    pids = docs / "pids.txt"
    sleeper = stand_in(
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()

    with pytest.raises(ConversionTimedOut, match=r"slow\.pdf stopped after 1\.5 s \(time limit\)"):
        convert(source, timeout_seconds=1.5, worker_command=sleeper)

    assert time.monotonic() - started < 5
    worker_pid, grandchild_pid = (int(pid) for pid in pids.read_text().split())
    # the orphaned grandchild is reaped by init, not by us
    wait_until(lambda: not any(map(is_running, (worker_pid, grandchild_pid))), timeout=5)
    assert sorted(p.name for p in docs.iterdir()) == ["pids.txt", "slow.pdf"]


def test_too_low_memory_limit_fails_cleanly(docs: Path) -> None:
    source = make_docx(docs / "report.docx")

    with pytest.raises(ConversionError, match=r"report\.docx .*memory.* 64 MB") as caught:
        convert(source, memory_limit_mb=64)

    assert not isinstance(caught.value, ConversionTimedOut)
    assert [p.name for p in docs.iterdir()] == ["report.docx"]


def test_stand_in_that_allocates_past_its_limit_reports_out_of_memory(docs: Path) -> None:
    source = make_docx(docs / "report.docx")
    hog = stand_in(
        "import os, sys\n"
        "from deerflow_web.services.conversion import worker\n"
        "limit = int(sys.argv[sys.argv.index('--memory-limit-mb') + 1])\n"
        "worker.apply_limits(limit, 10)\n"
        "try:\n"
        "    hoard = bytearray(400 * 1024 * 1024)\n"
        "except MemoryError:\n"
        "    os._exit(worker.EXIT_OUT_OF_MEMORY)\n"
    )

    with pytest.raises(ConversionError, match=r"report\.docx ran out of memory \(limit 200 MB\)"):
        convert(source, memory_limit_mb=200, worker_command=hog)

    assert [p.name for p in docs.iterdir()] == ["report.docx"]


def test_crash_by_signal_is_reported(docs: Path) -> None:
    source = make_docx(docs / "report.docx")

    with pytest.raises(ConversionError, match=r"report\.docx crashed \(signal SIGABRT\)"):
        convert(source, worker_command=stand_in("import os; os.abort()"))

    assert [p.name for p in docs.iterdir()] == ["report.docx"]


def test_worker_gets_private_home_and_no_secrets(
    tmp_path: Path, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_home = tmp_path / "real-home"
    real_home.mkdir()
    monkeypatch.setenv("HOME", str(real_home))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("SECRET_KEY", "session-secret")
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://app:db-secret@db/deerflow")
    # The bucket's credentials (storage.backend: s3): the worker gets the document's bytes
    # on its standard input, never a way into the bucket.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "bucket-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "bucket-secret")
    monkeypatch.setenv("DEER_FLOW_STORAGE_S3_BUCKET", "the-bucket")
    source = make_docx(docs / "report.docx")
    reporter = stand_in(
        "import json, os, sys\n"
        "open(sys.argv[2], 'w').write(json.dumps(dict(os.environ)))\n"
        "open(sys.argv[3], 'w').write(json.dumps({'status': 'ok'}))\n"
    )

    convert(source, worker_command=reporter)

    seen = (docs / "report.md").read_text(encoding="utf-8")
    assert "sk-secret" not in seen
    assert "session-secret" not in seen and "db-secret" not in seen
    assert "bucket-key-id" not in seen and "bucket-secret" not in seen
    assert "the-bucket" not in seen
    assert str(real_home) not in seen
    assert list(real_home.iterdir()) == []


def test_real_worker_leaves_the_real_home_alone(
    tmp_path: Path, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_home = tmp_path / "real-home"
    real_home.mkdir()
    monkeypatch.setenv("HOME", str(real_home))

    convert(make_docx(docs / "report.docx"))

    assert list(real_home.iterdir()) == []


def test_worker_claiming_success_without_text_is_empty(docs: Path) -> None:
    source = make_docx(docs / "report.docx")
    liar = stand_in("import sys; open(sys.argv[3], 'w').write('{\"status\": \"ok\"}')")

    with pytest.raises(ConversionError, match="No text could be extracted from report.docx"):
        convert(source, worker_command=liar)

    assert [p.name for p in docs.iterdir()] == ["report.docx"]


def test_a_pdf_is_converted_with_markitdown(docs: Path) -> None:
    convert(make_pdf(docs / "letter.pdf"))

    assert "Hello PDF world" in (docs / "letter.md").read_text(encoding="utf-8")


def test_start_up_sweeps_only_the_work_folders_of_dead_owners(tmp_path: Path) -> None:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(finished.stdout)
    mine = os.getpid()
    names = {
        "dead": f"deerflow-convert-{dead}.{process_start_time(mine)}-abc",  # gone
        "reused": f"deerflow-convert-{mine}.1-abc",  # our pid, another process's start time
        "live": f"deerflow-convert-{mine}.{process_start_time(mine)}-abc",
        "unnamed": "deerflow-convert-k2j3h4",  # no owner in the name: never guessed at
        "other": "unrelated",
    }
    temp = tmp_path / "tmp"
    for name in names.values():
        (temp / name / "home").mkdir(parents=True)
    assert sweep_stale_work_folders(temp) == 2
    assert sorted(p.name for p in temp.iterdir()) == sorted(
        names[key] for key in ("live", "unnamed", "other")
    )
