"""The clamd client, the policy, the rescan and quarantine, and what the agent may use,
against a real clamd (tests/support/clamd.py) and a real upload service."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from deerflow_web.agent.middleware import UploadsMiddleware
from deerflow_web.agent.tools import UploadTools
from deerflow_web.errors import ConfigError
from deerflow_web.errors import NotScannedYet
from deerflow_web.errors import ScannerUnavailable
from deerflow_web.models import IncomingFile
from deerflow_web.models import ScanState
from deerflow_web.models import ThreadRef
from deerflow_web.services.conversion.jobs import ConversionJobs
from deerflow_web.services.scanning.clamd import ClamdAddress
from deerflow_web.services.scanning.clamd import ClamdClient
from deerflow_web.services.scanning.clamd import ClamdError
from deerflow_web.services.scanning.clamd import StreamTooLarge
from deerflow_web.services.scanning.rescan import Rescanner
from deerflow_web.services.scanning.scanner import Scanner
from deerflow_web.services.uploads.service import UploadService
from deerflow_web.services.uploads.service import make_upload_service
from deerflow_web.settings import ConversionSettings
from deerflow_web.settings import ScanSettings
from deerflow_web.storage.job_leases import JobLeases
from deerflow_web.storage.migrate import open_database
from deerflow_web.storage.scan_events import ScanEvents
from tests.support.agent_helpers import make_runtime
from tests.support.clamd import EICAR
from tests.support.clamd import EICAR_SIGNATURE
from tests.support.clamd import Clamd

# Nothing here reads the mode: the services are built by hand and the agent's side is
# told it needs no user. The single-user pass skips it.
pytestmark = pytest.mark.same_in_both_modes

T = "t1"
REF = ThreadRef.single_user(T)  # these services are built without accounts


def scanner_for(clamd: Clamd, **settings: Any) -> Scanner:
    return Scanner(ScanSettings(clamd=clamd.address, timeout_seconds=5, **settings))


def scan_stream(clamd: Clamd, *chunks: bytes) -> Any:
    stream = ClamdClient(ClamdAddress.parse(clamd.address), 5).instream()
    for chunk in chunks:
        stream.send(chunk)
    return stream.finish()


def store(service: UploadService, *files: tuple[bytes, str]) -> Any:
    return service.save_uploads(REF, [IncomingFile(name, io.BytesIO(data)) for data, name in files])


# ------------------------------------------------------------------ the client


def test_client_finds_eicar_plain_split_and_zipped(clamd: Clamd) -> None:
    assert EICAR_SIGNATURE in (scan_stream(clamd, EICAR).found or "")
    assert EICAR_SIGNATURE in (scan_stream(clamd, EICAR[:10], EICAR[10:]).found or "")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("a/eicar.com", EICAR)
    assert scan_stream(clamd, buffer.getvalue()).found is not None
    assert scan_stream(clamd, b"just text").found is None


def test_client_version_and_ping(clamd: Clamd) -> None:
    client = ClamdClient(ClamdAddress.parse(clamd.address), 5)
    client.ping()
    engine, signatures = client.version()
    assert engine.startswith("ClamAV ") and signatures == str(clamd.version)


def test_client_reports_the_stream_limit(make_clamd: Any) -> None:
    small = make_clamd(stream_max="100K")
    with pytest.raises(StreamTooLarge):
        scan_stream(small, b"x" * 300_000)


def test_client_unreachable(tmp_path: Path) -> None:
    with pytest.raises(ClamdError):
        ClamdClient(ClamdAddress.parse(str(tmp_path / "none.sock")), 1).ping()
    with pytest.raises(ClamdError):
        ClamdClient(ClamdAddress.parse("127.0.0.1:1"), 1).ping()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/run/clamav/clamd.ctl", ClamdAddress(path="/run/clamav/clamd.ctl")),
        ("unix:/tmp/c.sock", ClamdAddress(path="/tmp/c.sock")),
        ("clamd:3310", ClamdAddress(host="clamd", port=3310)),
        ("tcp://[::1]:3310", ClamdAddress(host="::1", port=3310)),
    ],
)
def test_address_forms(text: str, expected: ClamdAddress) -> None:
    assert ClamdAddress.parse(text) == expected


@pytest.mark.parametrize("text", ["clamd", "host:0", "host:99999", ""])
def test_bad_addresses(text: str) -> None:
    with pytest.raises(ValueError):
        ClamdAddress.parse(text)


def test_unknown_policy_stops_start_up() -> None:
    with pytest.raises(ConfigError):
        ScanSettings.from_mapping({"clamd": "/x.sock", "on_unavailable": "accept"})
    assert ScanSettings.from_mapping({}).enabled is False
    settings = ScanSettings.from_mapping({"clamd": "/x", "rescan_interval_seconds": 0})
    assert (settings.enabled, settings.rescan_interval_seconds) == (True, 0.0)


# ------------------------------------------------------------------ rescans


@pytest.fixture
def rescan_setup(tmp_path: Path, make_clamd: Any) -> Any:
    clamd = make_clamd()
    engine = open_database(tmp_path)
    scanner = scanner_for(clamd)
    plain = make_upload_service(tmp_path, engine=engine)  # scanning off
    scanned = make_upload_service(tmp_path, engine=engine, scanner=scanner)
    events = ScanEvents(engine)
    rescans = Rescanner(scanned, scanner, events, JobLeases(engine))
    yield clamd, plain, scanned, events, rescans
    engine.dispose()


def test_files_stored_while_scanning_was_off_are_scanned_by_a_rescan(rescan_setup: Any) -> None:
    clamd, plain, scanned, _, rescans = rescan_setup
    store(plain, (b"before scanning", "old.txt"))
    assert scanned.get_upload(REF, "old.txt").scan_state is None
    report = rescans.run()
    assert (report.scanned, report.clean) == (1, 1)
    record = scanned.get_upload(REF, "old.txt")
    assert (record.scan_state, record.scan_signatures) == (ScanState.CLEAN, str(clamd.version))
    assert rescans.run().scanned == 0  # nothing due until the signatures change


def test_new_signatures_quarantine_a_file_found_infected_later(
    rescan_setup: Any, tmp_path: Path
) -> None:
    clamd, _, scanned, events, rescans = rescan_setup
    later = b"harmless until the signatures learn otherwise"
    store(scanned, (later, "later.bin"), (b"fine", "fine.txt"))
    assert scanned.get_upload(REF, "later.bin").scan_state is ScanState.CLEAN
    clamd.add_signature("Later-Test-Signature", later)
    report = rescans.run()
    assert (report.scanned, report.quarantined, report.clean) == (2, 1, 1)
    assert [r.filename for r in scanned.list_uploads(REF)] == ["fine.txt"]
    assert not (scanned.uploads_dir(REF) / "later.bin").exists()
    (event,) = events.recent()
    assert (event.kind, event.filename, event.thread_id) == ("quarantined", "later.bin", T)
    assert "Later-Test-Signature" in event.signature
    assert Path(event.quarantine_path or "").read_bytes() == later
    assert Path(event.quarantine_path or "").parent == tmp_path / "quarantine"


def test_expired_quarantine_is_purged(rescan_setup: Any) -> None:
    clamd, _, scanned, events, _ = rescan_setup
    later = b"found only by the next signatures " * 4
    store(scanned, (later, "later.bin"))
    clamd.add_signature("Later", later)
    clock = [1000.0]
    rescans = Rescanner(
        scanned, scanned.scanner, events, JobLeases(events.engine), clock=lambda: clock[0]
    )
    rescans.run()
    (event,) = events.recent()
    clock[0] += 31 * 86400
    assert rescans.run().purged == 1
    assert not Path(event.quarantine_path or "").exists()
    assert events.recent()[0].quarantine_path is None  # still listed for the admin


def test_rescan_with_the_scanner_down_raises_and_changes_nothing(rescan_setup: Any) -> None:
    clamd, plain, scanned, _, rescans = rescan_setup
    store(plain, (b"x", "x.txt"))
    clamd.stop()
    with pytest.raises(ScannerUnavailable):
        rescans.run()
    assert scanned.get_upload(REF, "x.txt").scan_state is None


def test_one_instance_at_a_time_holds_the_rescan_lease(rescan_setup: Any) -> None:
    _, _, scanned, events, first = rescan_setup
    second = Rescanner(scanned, scanned.scanner, events, JobLeases(events.engine))
    assert first.run_if_leased(600) is not None
    assert second.run_if_leased(600) is None
    assert first.run_if_leased(600) is not None  # the holder goes on


# ------------------------------------------------------------------ what the agent may use


@pytest.fixture
def held_back(tmp_path: Path, make_clamd: Any) -> Any:
    """A thread with one clean file and one stored unscanned while clamd was down."""
    clamd = make_clamd()
    engine = open_database(tmp_path)
    scanner = scanner_for(clamd, on_unavailable="accept_unscanned")
    service = make_upload_service(tmp_path, engine=engine, scanner=scanner)
    store(service, (b"clean text\n", "clean.txt"))
    clamd.stop()
    store(service, (b"unscanned text\n", "held.txt"))
    assert service.get_upload(REF, "held.txt").scan_state is ScanState.UNSCANNED
    yield service
    engine.dispose()


def test_list_tool_leaves_out_files_not_scanned_clean_and_says_why(held_back: Any) -> None:
    tools = UploadTools(paths=held_back.paths, upload_service=held_back, require_user=False)
    tool = tools.by_name()["list_uploaded_files"]
    result = tool.invoke({"runtime": make_runtime({"thread_id": T})})
    assert [f["filename"] for f in result["files"]] == ["clean.txt"]
    assert result["withheld"] == [
        {
            "filename": "held.txt",
            "reason": "it could not be virus-scanned yet (the scanner was unavailable)",
        }
    ]


def test_read_tool_refuses_a_file_not_scanned_clean(held_back: Any) -> None:
    tools = UploadTools(paths=held_back.paths, upload_service=held_back, require_user=False)
    tool = tools.by_name()["read_file"]
    runtime = make_runtime({"thread_id": T})
    text = tool.invoke({"path": "/mnt/user-data/uploads/held.txt", "runtime": runtime})
    assert "cannot be read yet" in text and "unscanned text" not in text
    clean = tool.invoke({"path": "/mnt/user-data/uploads/clean.txt", "runtime": runtime})
    assert "clean text" in clean


def test_members_of_an_archive_not_scanned_clean_are_refused_too(
    tmp_path: Path, make_clamd: Any
) -> None:
    """clamd reads inside archives, so an archive's scan covers its members; an archive
    stored unscanned keeps them from read_file, grep and glob until it is cleared."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("q3/notes.txt", "member text\n")
    clamd = make_clamd()
    engine = open_database(tmp_path)
    service = make_upload_service(
        tmp_path, engine=engine, scanner=scanner_for(clamd, on_unavailable="accept_unscanned")
    )
    try:
        clamd.stop()
        store(service, (buffer.getvalue(), "reports.zip"))
        tools = UploadTools(paths=service.paths, upload_service=service, require_user=False)
        runtime = make_runtime({"thread_id": T})
        member = "/mnt/user-data/uploads/reports.zip/q3/notes.txt"
        read = tools.by_name()["read_file"].invoke({"path": member, "runtime": runtime})
        assert "cannot be read yet" in read and "member text" not in read
        found = tools.by_name()["grep"].invoke(
            {"pattern": "member", "path": "/mnt/user-data/uploads", "runtime": runtime}
        )
        assert "member text" not in str(found)
    finally:
        engine.dispose()


def test_middleware_announces_only_clean_files_and_names_the_others(held_back: Any) -> None:
    middleware = UploadsMiddleware(
        paths=held_back.paths, upload_service=held_back, require_user=False
    )
    files = [{"filename": "clean.txt", "size": 11}, {"filename": "held.txt", "size": 15}]
    message = HumanMessage(content="read these", additional_kwargs={"files": files})
    result = middleware.before_agent({"messages": [message]}, make_runtime({"thread_id": T}))
    text = result["messages"][-1].text
    assert "clean.txt" in text.split("<withheld_uploads>")[0]
    assert "held.txt" not in text.split("<withheld_uploads>")[0]
    assert "- held.txt: it could not be virus-scanned yet" in text
    assert [f["filename"] for f in result["uploaded_files"]] == ["clean.txt"]


def test_converter_skips_files_not_scanned_clean(held_back: Any) -> None:
    store(held_back, (b"%PDF-1.4 not really", "held.pdf"))
    jobs = ConversionJobs(held_back, ConversionSettings())
    try:
        with pytest.raises(NotScannedYet):
            jobs.convert(REF, "held.pdf")
    finally:
        jobs.stop_keeper()
